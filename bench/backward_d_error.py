"""Where the backward's dq error comes from in one case of FlashAttention-2's criterion (docs/testing.md).

For the grid case 1023x1024 GQA (4 query heads, 2 kv heads), head_dim 59, causal, f16 and the given seeds (the
inputs python/tests/test_torch.py draws for them), prints flashcl's max dq error against the float64 gradient,
where it sits, and the errors of two float64 gradients: the exact one rounded to f16 (the rounding floor) and the
one with D = rowsum(dO * O) taken from flashcl's f16 O, as any backward that is handed O in f16 computes it.

usage (repository root, the library built into build/, pyopencl and numpy installed):
  FLASHCL_LIBRARY=build/libflashcl.so python3 bench/backward_d_error.py SEED [SEED ...]
The first OpenCL device of the first platform runs it (PoCL on CI's machine).
"""
import os
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(root, "python"), os.path.join(root, "python", "tests")]
import flashcl  # noqa: E402
import reference as ref  # noqa: E402
from test_accuracy import bhsd, inputs  # noqa: E402

ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
queue = cl.CommandQueue(ctx)
for seed in [int(s) for s in sys.argv[1:]]:
    rng = np.random.default_rng(seed)
    q, k, v = inputs(rng, 1, 1023, 1024, "gqa", 59, np.float16)
    do = rng.standard_normal(q.shape).astype(np.float16)
    dev = [cla.to_device(queue, x) for x in (q, k, v, do)]
    out, lse = flashcl.attention(*dev[:3], layout="bshd", causal=True, return_lse=True)
    got = flashcl.attention_backward(dev[3], *dev[:3], out, lse, causal=True)
    Q, K, V, DO = (bhsd(x).astype(np.float64) for x in (q, k, v, do))
    dq64 = ref.attention_grads(Q, K, V, DO, causal=True)[0]
    dq = bhsd(got[0].get()).astype(np.float64)
    err = np.abs(dq - dq64)
    at = np.unravel_index(err.argmax(), err.shape)
    # The float64 gradient with D from flashcl's f16 O.
    _, lse64 = ref.attention(Q, K, V, causal=True)
    g = Q.shape[1] // K.shape[1]
    kr, vr = np.repeat(K, g, 1), np.repeat(V, g, 1)
    with np.errstate(invalid="ignore"):
        p = np.where(np.isfinite(lse64)[..., None], np.exp(ref.attention_scores(Q, K, V, causal=True) - lse64[..., None]), 0.0)
    d_o16 = (DO * bhsd(out.get()).astype(np.float64)).sum(-1, keepdims=True)
    dq_o16 = (p * (DO @ np.swapaxes(vr, -1, -2) - d_o16)) @ kr / np.sqrt(Q.shape[-1])
    r16 = lambda x: x.astype(np.float16).astype(np.float64)
    print(f"seed {seed}: flashcl dq max error {err.max():.3g} at (batch, head, row, column) {tuple(int(i) for i in at)}; "
          f"exact gradient rounded to f16 {np.abs(r16(dq64) - dq64).max():.3g}; "
          f"with D from the f16 O {np.abs(dq_o16 - dq64).max():.3g} (rounded to f16 {np.abs(r16(dq_o16) - dq64).max():.3g})")
