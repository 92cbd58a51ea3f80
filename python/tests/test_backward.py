"""The backward (fcl_attention_backward through attention_backward) against float64 NumPy gradients, which
are themselves checked against central finite differences."""

from __future__ import annotations

import numpy as np
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref
from conftest import to_host


def _loss(q, k, v, do, **kw):
    return float((ref.attention(q, k, v, **kw)[0] * do).sum())


def test_numpy_gradients_match_finite_differences():
    rng = np.random.default_rng(7)
    B, H, HKV, NQ, NK, D = 1, 2, 1, 5, 7, 3
    q, do = rng.standard_normal((B, H, NQ, D)), rng.standard_normal((B, H, NQ, D))
    k, v = rng.standard_normal((B, HKV, NK, D)), rng.standard_normal((B, HKV, NK, D))
    sinks = rng.standard_normal(H)
    kw = dict(causal=True, softcap=1.5, slopes=np.array([0.1, 0.3]), sinks=sinks, window=(4, -1),
              mask=rng.standard_normal((NQ, NK)))
    grads = ref.attention_grads(q, k, v, do, **kw)
    eps = 1e-6
    for which, x in enumerate((q, k, v, sinks)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            up = _loss(q, k, v, do, **kw)
            x[idx] = old - eps
            down = _loss(q, k, v, do, **kw)
            x[idx] = old
            fd[idx] = (up - down) / (2 * eps)
        assert np.abs(fd - grads[which]).max() <= 1e-6 * max(1.0, np.abs(fd).max())


CASES = [
    # (name, dtype, heads, kv_heads, seqlen_q, seqlen_k, head_dim, kwargs)
    ("plain", np.float32, 4, 4, 65, 97, 40, {}),
    ("causal-gqa", np.float32, 4, 2, 97, 65, 64, {"causal": True}),
    ("mqa-f16", np.float16, 4, 1, 80, 80, 32, {"causal": True}),
    ("modifiers", np.float32, 4, 2, 70, 90, 48,
     {"window_size": (30, 10), "softcap": 3.0, "alibi_slopes": "bh", "mask": True}),
    ("sinks", np.float32, 4, 2, 60, 60, 32, {"sinks": True, "causal": True}),
]
TOL = {np.float32: 2e-5, np.float16: 4e-3}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_backward(queue, rng, case):
    name, dt, h, hkv, nq, nk, d, spec = case
    b = 2
    q = rng.standard_normal((b, nq, h, d)).astype(dt)
    k = rng.standard_normal((b, nk, hkv, d)).astype(dt)
    v = rng.standard_normal((b, nk, hkv, d)).astype(dt)
    do = rng.standard_normal((b, nq, h, d)).astype(dt)
    np_kw, fc_kw = {}, {}
    if spec.get("causal"):
        np_kw["causal"] = fc_kw["causal"] = True
    if "window_size" in spec:
        np_kw["window"] = fc_kw["window_size"] = spec["window_size"]
    if "softcap" in spec:
        np_kw["softcap"] = fc_kw["softcap"] = spec["softcap"]
    if "alibi_slopes" in spec:
        s = rng.uniform(0.01, 0.2, (b, h)).astype(np.float32)
        np_kw["slopes"], fc_kw["alibi_slopes"] = s, cla.to_device(queue, s)
    if spec.get("mask"):
        m = rng.standard_normal((b, 1, nq, nk)).astype(np.float32)
        np_kw["mask"], fc_kw["mask"] = m, cla.to_device(queue, m)
    if spec.get("sinks"):
        s = rng.standard_normal(h).astype(np.float32)
        np_kw["sinks"], fc_kw["sinks"] = s, cla.to_device(queue, s)
    dev = [cla.to_device(queue, x) for x in (q, k, v, do)]
    out, lse = flashcl.attention(*dev[:3], layout="bshd", return_lse=True, **fc_kw)
    res = flashcl.attention_backward(dev[3], *dev[:3], out, lse, **fc_kw)
    assert len(res) == (4 if spec.get("sinks") else 3)
    t = lambda x: np.swapaxes(x.astype(np.float64), 1, 2)  # noqa: E731
    want = ref.attention_grads(t(q), t(k), t(v), t(do), **np_kw)
    for got, exp, nm in zip(res[:3], want[:3], ("dq", "dk", "dv")):
        g = t(got.get())
        assert np.isfinite(g).all(), nm
        scale = max(1.0, np.abs(exp).max())
        err = np.abs(g - exp).max() / scale
        assert err <= TOL[dt], f"{nm}: max error {err:.3g} (relative to max |grad| {scale:.3g})"
    if spec.get("sinks"):
        ds = res[3].get().astype(np.float64)
        assert np.abs(ds - want[3]).max() <= 1e-4 * max(1.0, np.abs(want[3]).max())
    # Deterministic: the same call again gives bitwise the same gradients.
    again = flashcl.attention_backward(dev[3], *dev[:3], out, lse, **fc_kw)
    for a, b_ in zip(res, again):
        assert (a.get().view(np.uint8) == b_.get().view(np.uint8)).all()


def test_backward_strided_inputs(queue, rng):
    """Gradients of views of a packed qkv array come back in the inputs' layout (strides and offsets)."""
    B, S, H, D = 2, 50, 2, 32
    qkv = rng.standard_normal((B, S, 3, H, D)).astype(np.float32)
    dqkv = cla.to_device(queue, qkv)
    q, k, v = (dqkv[:, :, i] for i in range(3))
    out, lse = flashcl.flash_attn_func(q, k, v, causal=True, return_lse=True)
    do = cla.to_device(queue, rng.standard_normal(out.shape).astype(np.float32))
    dq, dk, dv = flashcl.attention_backward(do, q, k, v, out, lse, causal=True)
    assert dk.strides == k.strides and dk.offset == k.offset
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    want = ref.attention_grads(t(qkv[:, :, 0]), t(qkv[:, :, 1]), t(qkv[:, :, 2]), t(do.get()), causal=True)
    for got, exp in zip((dq, dk, dv), want):
        assert np.abs(t(to_host(got)) - exp).max() <= 2e-5 * max(1.0, np.abs(exp).max())
