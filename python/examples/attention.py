"""flashcl from Python: causal grouped-query attention in float16 on PyOpenCL arrays, its gradients, and a
check against NumPy.

    pip install ./python            # from the flashcl repository, after building it (README)
    FLASHCL_LIBRARY=build/libflashcl.so python python/examples/attention.py

PYOPENCL_CTX picks the OpenCL device as usual (e.g. PYOPENCL_CTX=0); the default is the first one.
"""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import flashcl

context = cl.create_some_context(interactive=False)
queue = cl.CommandQueue(context)
print(f"device: {queue.device.name}; libflashcl {flashcl.version()} from {flashcl.library_path()}")

batch, seqlen, heads, kv_heads, head_dim = 2, 500, 8, 2, 64
rng = np.random.default_rng(0)
q_host = rng.standard_normal((batch, seqlen, heads, head_dim)).astype(np.float16)
k_host = rng.standard_normal((batch, seqlen, kv_heads, head_dim)).astype(np.float16)
v_host = rng.standard_normal((batch, seqlen, kv_heads, head_dim)).astype(np.float16)
q, k, v = (cla.to_device(queue, x) for x in (q_host, k_host, v_host))

# Forward, as FlashAttention's flash_attn_func: [batch, seq, heads, head_dim], GQA from the head counts.
# Nothing waits on the host: the call's event is in out.events, and later calls on out wait for it.
out, lse = flashcl.flash_attn_func(q, k, v, causal=True, return_lse=True)

# Backward: gradients of sum(out * dout), from out and lse.
dout = cla.to_device(queue, rng.standard_normal(out.shape).astype(np.float16))
dq, dk, dv = flashcl.attention_backward(dout, q, k, v, out, lse, causal=True)

# Check the forward against NumPy in float64 ([batch, heads, seq, head_dim], K/V heads repeated).
qd, kd, vd = (np.swapaxes(x.astype(np.float64), 1, 2) for x in (q_host, k_host, v_host))
kd, vd = np.repeat(kd, heads // kv_heads, axis=1), np.repeat(vd, heads // kv_heads, axis=1)
scores = qd @ np.swapaxes(kd, -1, -2) / np.sqrt(head_dim)
scores[..., np.triu(np.ones((seqlen, seqlen), dtype=bool), k=1)] = -np.inf
p = np.exp(scores - scores.max(-1, keepdims=True))
expected = (p / p.sum(-1, keepdims=True)) @ vd
error = np.abs(np.swapaxes(out.get(), 1, 2) - expected).max()
print(f"out {out.shape} {out.dtype}: max |flashcl - numpy float64| = {error:.2e}")
print(f"dq {dq.shape}, dk {dk.shape}, dv {dv.shape}; |dk| max {np.abs(dk.get()).max():.3f}")

# Errors are exceptions carrying the library's status and message.
try:
    flashcl.flash_attn_func(q, k[:, :, :, :32], v)
except flashcl.InvalidArgumentError as e:
    print(f"refused as expected: {e}")
assert error < 2e-3
