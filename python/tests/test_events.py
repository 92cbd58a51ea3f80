"""Events in and out: calls wait on wait_for and on their arrays' events, and return their event on the
outputs, so a chain of calls is enqueued without any host wait."""

from __future__ import annotations

import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref


def _status(ev):
    return ev.get_info(cl.event_info.COMMAND_EXECUTION_STATUS)


@pytest.fixture(scope="module")
def ooo_queue(cl_context, device):
    """An out-of-order queue where the device has one (PoCL does): only events order the commands."""
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not device.get_info(cl.device_info.QUEUE_PROPERTIES) & props:
        pytest.skip("the device has no out-of-order queues")
    return cl.CommandQueue(cl_context, device, properties=props)


def test_chain_waits_on_user_event(ooo_queue, rng):
    queue = ooo_queue
    B, S, H, D = 1, 64, 2, 32
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    # Enqueue the uploads behind a gate so nothing can run before the chain is fully enqueued.
    gate = cl.UserEvent(queue.context)
    dq, dk, dv = (cla.empty(queue, x.shape, np.float32) for x in (q, k, v))
    for dev, host in zip((dq, dk, dv), (q, k, v)):
        dev.add_event(cl.enqueue_copy(queue, dev.base_data, host, wait_for=[gate], is_blocking=False))
    try:
        out1 = flashcl.flash_attn_func(dq, dk, dv, causal=True)
        ev1 = out1.events[-1]
        assert isinstance(ev1, cl.Event)
        # Second call reads out1 as its query: it must wait for ev1 through out1.events.
        out2, lse2 = flashcl.flash_attn_func(out1, dk, dv, return_lse=True)
        ev2 = out2.events[-1]
        assert lse2.events[-1].int_ptr == ev2.int_ptr
        time.sleep(0.2)
        assert _status(ev1) != cl.command_execution_status.COMPLETE, "the first call did not wait for its inputs"
        assert _status(ev2) != cl.command_execution_status.COMPLETE, "the second call did not wait for the first"
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)  # never leave the queue blocked
    ev2.wait()
    assert _status(ev1) == cl.command_execution_status.COMPLETE
    t = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    o1, _ = ref.attention(t(q), t(k), t(v), causal=True)
    o2, l2 = ref.attention(t(out1.get()), t(k), t(v))
    assert np.abs(t(out1.get()) - o1).max() <= 1e-5
    assert np.abs(t(out2.get()) - o2).max() <= 1e-5
    assert np.abs(lse2.get() - l2).max() <= 1e-4


def test_wait_for_and_returned_event(queue, rng):
    """wait_for holds a call back; the buffer-level forward returns its event."""
    B, S, H, D = 1, 32, 2, 16
    q, k, v = (cla.to_device(queue, rng.standard_normal((B, H, S, D)).astype(np.float32)) for _ in range(3))
    queue.finish()
    gate = cl.UserEvent(queue.context)
    o = cla.empty(queue, (B, H, S, D), np.float32)
    desc = flashcl.Descriptor(batch=B, num_heads=H, seqlen_q=S, seqlen_k=S, head_dim=D)
    try:
        ev = flashcl.forward(desc, q.base_data, k.base_data, v.base_data, o.base_data, queue=queue, wait_for=[gate])
        assert isinstance(ev, cl.Event)
        time.sleep(0.1)
        assert _status(ev) != cl.command_execution_status.COMPLETE, "the call did not wait for wait_for"
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    ev.wait()
    want, _ = ref.attention(q.get(), k.get(), v.get())
    assert np.abs(o.get() - want).max() <= 1e-5
