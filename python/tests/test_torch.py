"""The accuracy grid of test_accuracy.py against PyTorch: flashcl's max error against the float64 NumPy
reference is at most twice that of torch.nn.functional.scaled_dot_product_attention run in the same dtype
(on CUDA when available, else on the CPU); in float32 under FP32_BOUND, with the ratio printed
(test_accuracy.py says why). Skipped when torch is not importable."""

from __future__ import annotations

import numpy as np
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref
from test_accuracy import FP32_BOUND, GRID, _id, bhsd, inputs

torch = pytest.importorskip("torch")
TORCH_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def torch_sdpa(q, k, v, causal):
    """bhsd host arrays -> torch's output (float64 host array), GQA by repeating K/V heads, causal
    bottom-right aligned as flashcl's (an explicit mask when seqlen_q != seqlen_k)."""
    tq, tk, tv = (torch.from_numpy(x).to(TORCH_DEVICE) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    tk, tv = tk.repeat_interleave(g, dim=1), tv.repeat_interleave(g, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        vis = ref.visible(nq, nk, True, (-1, -1))
        mask = torch.from_numpy(vis).to(TORCH_DEVICE)
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    out = out.double().cpu().numpy()
    if causal:
        out[:, :, ~vis.any(axis=1)] = 0.0  # rows with no visible key: torch gives NaN, flashcl 0
    return out


@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_against_torch(queue, rng, case):
    b, sq, sk, heads, d, causal, dt = case
    q, k, v = inputs(rng, b, sq, sk, heads, d, dt)
    out = flashcl.flash_attn_func(cla.to_device(queue, q), cla.to_device(queue, k), cla.to_device(queue, v),
                                  causal=causal)
    out = np.swapaxes(out.get().astype(np.float64), 1, 2)
    o64, _ = ref.attention(bhsd(q), bhsd(k), bhsd(v), causal=causal)
    ot = torch_sdpa(bhsd(q), bhsd(k), bhsd(v), causal)
    err = np.abs(out - o64).max()
    err_t = np.abs(ot - o64).max()
    print(f"{_id(case)}: flashcl {err:.3g}, torch {TORCH_DEVICE} {err_t:.3g}, ratio {err / err_t:.2f}")
    if dt == np.float32:
        assert err <= FP32_BOUND, f"float32 max error {err:.3g} > {FP32_BOUND}"
    else:
        assert err <= 2 * err_t, f"max error {err:.3g} > 2 x torch's {err_t:.3g}"


def torch_grads(q, k, v, do, causal):
    """bhsd host arrays -> torch's dq, dk, dv (float64 host arrays) from autograd through
    scaled_dot_product_attention in q's dtype; GQA by repeating K/V heads inside the graph, so dk and dv sum
    over each group as flashcl's do."""
    tq, tk, tv = (torch.from_numpy(x).to(TORCH_DEVICE).requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    mask = None
    if causal:
        mask = torch.from_numpy(ref.visible(q.shape[2], k.shape[2], True, (-1, -1))).to(TORCH_DEVICE)
    out = torch.nn.functional.scaled_dot_product_attention(
        tq, tk.repeat_interleave(g, dim=1), tv.repeat_interleave(g, dim=1), attn_mask=mask)
    out.backward(torch.from_numpy(do).to(TORCH_DEVICE))
    return [x.grad.double().cpu().numpy() for x in (tq, tk, tv)]


# FlashAttention-2's backward criterion, for the low-precision cases of the grid in which every query row sees
# a key (torch's gradients are NaN for a row that sees none).
BACKWARD_GRID = [c for c in GRID if c[6] != np.float32 and not (c[5] and c[1] > c[2])]


@pytest.mark.parametrize("case", BACKWARD_GRID, ids=[_id(c) for c in BACKWARD_GRID])
def test_backward_against_torch(queue, rng, case):
    """dq, dk, dv: flashcl's max error against the float64 NumPy gradients at most twice that of torch's
    gradients computed in the same dtype (FlashAttention-2's test)."""
    b, sq, sk, heads, d, causal, dt = case
    q, k, v = inputs(rng, b, sq, sk, heads, d, dt)
    do = rng.standard_normal(q.shape).astype(dt)
    dev = [cla.to_device(queue, x) for x in (q, k, v, do)]
    out, lse = flashcl.attention(*dev[:3], layout="bshd", causal=causal, return_lse=True)
    got = flashcl.attention_backward(dev[3], *dev[:3], out, lse, causal=causal)
    want = ref.attention_grads(*(bhsd(x).astype(np.float64) for x in (q, k, v, do)), causal=causal)
    theirs = torch_grads(*(bhsd(x) for x in (q, k, v, do)), causal)
    for name, g, w, t in zip(("dq", "dk", "dv"), got, want, theirs):
        err = np.abs(bhsd(g.get()).astype(np.float64) - w).max()
        err_t = np.abs(t - w).max()
        print(f"{_id(case)} {name}: flashcl {err:.3g}, torch {TORCH_DEVICE} {err_t:.3g}, ratio {err / err_t:.2f}")
        assert err <= 2 * err_t, f"{name}: max error {err:.3g} > 2 x torch's {err_t:.3g}"
