"""flashcl.Context: options, introspection (describe_plan, cache_stats) and use by the array functions."""

import numpy as np
import pyopencl.array as cla

import flashcl


def test_context_options_and_introspection(queue, rng):
    with flashcl.Context(queue.context, queue.device, cache_dir="", portable_only=True) as ctx:
        stats = ctx.cache_stats()
        assert stats["cache_dir"] is None  # "" turns the disk cache off
        assert stats["source_builds"] == 0 and stats["disk_hits"] == 0
        desc = flashcl.Descriptor(batch=1, num_heads=2, seqlen_q=40, seqlen_k=40, head_dim=24)
        plan = ctx.describe_plan(desc)
        assert plan["kernel"] == "portable" and plan["block_q"] >= 1 and plan["work_group_size"] >= 1
        assert plan["splits"] >= 1 and plan["reason"]
        q, k, v = (cla.to_device(queue, rng.standard_normal((1, 40, 2, 24)).astype(np.float32)) for _ in range(3))
        flashcl.flash_attn_func(q, k, v, context=ctx).get()
        after = ctx.cache_stats()
        assert after["source_builds"] >= 1, "without a disk cache the kernel was compiled from source"
        assert ctx.backward_workspace_size(desc) >= 0
    assert ctx._handle is None


def test_tune_forward(cl_context, device):
    import pyopencl as cl

    queue = cl.CommandQueue(cl_context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    with flashcl.Context(cl_context, device, cache_dir="") as ctx:
        desc = flashcl.Descriptor(batch=1, num_heads=1, seqlen_q=64, seqlen_k=64, head_dim=16)
        r = ctx.tune_forward(desc, queue)
        assert r["candidates"] >= 1 and r["shape"].count(",") == 4 and r["best_ms"] > 0
        assert r["best_ms"] <= r["default_ms"] or not r["recorded"]
        assert not r["saved"]  # no disk cache
    plain = cl.CommandQueue(cl_context, device)
    with flashcl.Context(cl_context, device, cache_dir="") as ctx:
        try:
            ctx.tune_forward(flashcl.Descriptor(batch=1, num_heads=1, seqlen_q=64, seqlen_k=64, head_dim=16), plain)
        except flashcl.InvalidArgumentError as e:
            assert "PROFILING" in e.message.upper()
        else:
            raise AssertionError("a queue without profiling must be refused")


def test_device_quirks(queue):
    with flashcl.Context(queue.context, queue.device, cache_dir="") as ctx:
        quirks = ctx.device_quirks()
    assert quirks["source"] in ("unknown", "measured", "cached", "forced")
    assert quirks["profiling_clock_unusable"] in (-1, 0, 1)
    assert quirks["detail"]
    assert quirks["loop_budget"] >= 0
