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
