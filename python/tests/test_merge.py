"""fcl_attention_merge through flashcl.merge, and the forward's split-KV workspace."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_merge_equals_full_forward(queue, rng, layout):
    """The merge of forwards over a partition of the keys equals the forward over all of them (and NumPy),
    sinks added once by the merge."""
    B, H, HKV, NQ, D = 2, 4, 2, 37, 40
    chunks = [100, 37, 80]
    NK = sum(chunks)
    q = rng.standard_normal((B, H, NQ, D)).astype(np.float32)
    k = rng.standard_normal((B, HKV, NK, D)).astype(np.float32)
    v = rng.standard_normal((B, HKV, NK, D)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    to_layout = (lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))) if layout == "bshd" else np.ascontiguousarray
    part_shape = (B, NQ, H, D) if layout == "bshd" else (B, H, NQ, D)
    o_parts = cla.empty(queue, (len(chunks),) + part_shape, np.float32)
    lse_parts = cla.empty(queue, (len(chunks), B, H, NQ), np.float32)
    dq = cla.to_device(queue, to_layout(q))
    start = 0
    for i, n in enumerate(chunks):
        dk = cla.to_device(queue, to_layout(k[:, :, start : start + n]))
        dv = cla.to_device(queue, to_layout(v[:, :, start : start + n]))
        _, lse_i = flashcl.attention(dq, dk, dv, layout=layout, out=o_parts[i], return_lse=True)
        ev = cl.enqueue_copy(queue, lse_parts.base_data, lse_i.base_data, dst_offset=i * lse_i.nbytes,
                             byte_count=lse_i.nbytes, wait_for=lse_i.events)
        lse_parts.add_event(ev)
        start += n
    out, lse = flashcl.merge(o_parts, lse_parts, layout=layout, sinks=sinks, return_lse=True)
    o64, lse64 = ref.attention(q, k, v, sinks=sinks)
    got = out.get()
    got = np.swapaxes(got, 1, 2) if layout == "bshd" else got
    assert np.abs(got - o64).max() <= 1e-5
    assert np.abs(lse.get() - lse64).max() <= 1e-4


def test_merge_errors(queue):
    parts = cla.zeros(queue, (2, 1, 8, 2, 16), np.float32)
    with pytest.raises(flashcl.InvalidArgumentError, match="lse_parts must be"):
        flashcl.merge(parts, cla.zeros(queue, (3, 1, 2, 8), np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="5-D"):
        flashcl.merge(parts[0], cla.zeros(queue, (2, 1, 2, 8), np.float32))


def test_forward_with_workspace(queue, rng):
    """Decode (one query row, many keys, one head): the forward splits the keys on this device; with a
    caller's workspace of forward_workspace_size() bytes the result is the same, and a smaller one is refused."""
    B, H, NQ, NK, D = 1, 1, 1, 4096, 64
    desc = flashcl.Descriptor(batch=B, num_heads=H, seqlen_q=NQ, seqlen_k=NK, head_dim=D)
    plan = flashcl.default_context(queue).describe_plan(desc)
    size = flashcl.forward_workspace_size(desc, queue=queue)
    assert (size > 0) == (plan["splits"] > 1)
    if plan["splits"] == 1:
        pytest.skip(f"the forward does not split this shape on {queue.device.name}: {plan['reason']}")
    q = rng.standard_normal((B, H, NQ, D)).astype(np.float32)
    k = rng.standard_normal((B, H, NK, D)).astype(np.float32)
    v = rng.standard_normal((B, H, NK, D)).astype(np.float32)
    dev = [cla.to_device(queue, x) for x in (q, k, v)]
    ws = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, size)
    out = flashcl.attention(*dev, layout="bhsd", workspace=ws)
    assert np.abs(out.get() - ref.attention(q, k, v)[0]).max() <= 1e-5
    small = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, size // 2)
    with pytest.raises(flashcl.InvalidArgumentError, match="workspace"):
        flashcl.attention(*dev, layout="bhsd", workspace=small)
