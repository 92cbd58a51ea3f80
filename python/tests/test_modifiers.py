"""The score modifiers (window, softcap, ALiBi, additive mask, sinks), layouts, the reference path and the
PyTorch-shaped entry point, each against the float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref

B, H, HKV, D = 2, 4, 2, 48


def _inputs(rng, sq, sk, dt=np.float32, h=H, hkv=HKV, d=D):
    """bhsd host arrays."""
    q = rng.standard_normal((B, h, sq, d)).astype(dt)
    k = rng.standard_normal((B, hkv, sk, d)).astype(dt)
    v = rng.standard_normal((B, hkv, sk, d)).astype(dt)
    return q, k, v


def _dev(queue, *xs):
    return [cla.to_device(queue, np.ascontiguousarray(x)) for x in xs]


def _check(out, lse, o64, lse64, tol):
    out = out.get().astype(np.float64)
    assert np.isfinite(out).all()
    err = np.abs(out - o64).max()
    assert err <= tol, f"max error {err:.3g} > {tol}"
    if lse is not None:
        lse = lse.get()
        fin = np.isfinite(lse64)
        assert (np.isfinite(lse) == fin).all()
        if fin.any():
            assert np.abs(lse[fin] - lse64[fin]).max() <= 1e-4


TOL = {np.float32: 1e-5, np.float16: 4e-3}

CASES = {
    "window": dict(window=(17, 5)),
    "window-left-only": dict(window=(30, -1)),
    "window-causal": dict(window=(20, -1), causal=True),
    "softcap": dict(softcap=2.5),
    "alibi-heads": dict(slopes="h"),
    "alibi-batch-heads": dict(slopes="bh"),
    "mask-f32-broadcast": dict(mask=("f32", (1, 1))),
    "mask-f16-per-batch": dict(mask=("f16", (B, 1))),
    "mask-f32-full": dict(mask=("f32", (B, H))),
    "sinks": dict(sinks=True),
    "everything": dict(window=(40, 3), softcap=5.0, slopes="bh", mask=("f32", (B, 1)), sinks=True, causal=True),
}


def _modifiers(rng, queue, sq, sk, spec):
    """(NumPy kwargs, flashcl kwargs) for one case."""
    np_kw, fc_kw = {}, {}
    if "window" in spec:
        np_kw["window"] = spec["window"]
        fc_kw["window_size"] = spec["window"]
    if spec.get("causal"):
        np_kw["causal"] = fc_kw["causal"] = True
    if "softcap" in spec:
        np_kw["softcap"] = fc_kw["softcap"] = spec["softcap"]
    if "slopes" in spec:
        shape = (H,) if spec["slopes"] == "h" else (B, H)
        s = rng.uniform(0.01, 0.2, shape).astype(np.float32)
        np_kw["slopes"] = s
        fc_kw["alibi_slopes"] = cla.to_device(queue, s) if spec["slopes"] == "bh" else s  # host values upload
    if "mask" in spec:
        kind, lead = spec["mask"]
        dt = np.float32 if kind == "f32" else np.float16
        m = rng.standard_normal(lead + (sq, sk)).astype(dt)
        m[..., ::7, 3] = -np.inf  # hidden keys
        np_kw["mask"] = m
        fc_kw["mask"] = cla.to_device(queue, m)
    if spec.get("sinks"):
        s = rng.standard_normal(H).astype(np.float32)
        np_kw["sinks"] = s
        fc_kw["sinks"] = cla.to_device(queue, s)
    return np_kw, fc_kw


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("name", list(CASES))
def test_modifier(queue, rng, name, dt):
    sq, sk = 77, 131
    q, k, v = _inputs(rng, sq, sk, dt)
    np_kw, fc_kw = _modifiers(rng, queue, sq, sk, CASES[name])
    dq, dk, dv = _dev(queue, q, k, v)
    out, lse = flashcl.attention(dq, dk, dv, layout="bhsd", return_lse=True, **fc_kw)
    o64, lse64 = ref.attention(q, k, v, **np_kw)
    _check(out, lse, o64, lse64, TOL[dt])


@pytest.mark.parametrize("name", ["window-causal", "everything"])
def test_reference_path(queue, rng, name):
    """fcl_attention_reference (CLBlast) gives the same result with the same modifiers."""
    sq, sk = 64, 96
    q, k, v = _inputs(rng, sq, sk)
    np_kw, fc_kw = _modifiers(rng, queue, sq, sk, CASES[name])
    out, lse = flashcl.attention(*_dev(queue, q, k, v), layout="bhsd", return_lse=True, reference=True, **fc_kw)
    o64, lse64 = ref.attention(q, k, v, **np_kw)
    _check(out, lse, o64, lse64, 1e-5)


def test_window_hides_every_key(queue, rng):
    """Rows whose window holds no key: output 0 and lse -inf (seqlen_q > seqlen_k, causal, narrow window)."""
    q, k, v = _inputs(rng, 50, 20)
    out, lse = flashcl.attention(*_dev(queue, q, k, v), layout="bhsd", causal=True, window_size=(2, 0), return_lse=True)
    o64, lse64 = ref.attention(q, k, v, causal=True, window=(2, 2))
    assert np.isneginf(lse64).any()
    _check(out, lse, o64, lse64, 1e-5)


def test_mask_row_broadcast(queue, rng):
    """A mask of shape [batch, 1, 1, seqlen_k] (one row for every head and query): strides 0."""
    sq, sk = 33, 70
    q, k, v = _inputs(rng, sq, sk)
    m = rng.standard_normal((B, 1, 1, sk)).astype(np.float32)
    out = flashcl.attention(*_dev(queue, q, k, v), layout="bhsd", mask=cla.to_device(queue, m))
    _check(out, None, ref.attention(q, k, v, mask=m)[0], None, 1e-5)


def test_mask_strided_view(queue, rng):
    """A mask that is a slice of a bigger array (row stride > seqlen_k, non-zero offset)."""
    sq, sk = 40, 50
    q, k, v = _inputs(rng, sq, sk)
    big = rng.standard_normal((2 * sq, sk + 16)).astype(np.float32)
    dbig = cla.to_device(queue, big)
    view = dbig[sq:, 8 : 8 + sk]
    assert view.offset > 0 and view.strides[0] == (sk + 16) * 4
    out = flashcl.attention(*_dev(queue, q, k, v), layout="bhsd", mask=view)
    _check(out, None, ref.attention(q, k, v, mask=big[sq:, 8 : 8 + sk])[0], None, 1e-5)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_layouts_and_views(queue, rng, layout):
    """q, k, v as views of one packed [batch, seq, 3, heads, d] array (no copies), output into a strided view."""
    sq = 57
    qkv = rng.standard_normal((B, sq, 3, H, D)).astype(np.float32)
    dqkv = cla.to_device(queue, qkv)
    q, k, v = (dqkv[:, :, i] for i in range(3))  # [B, S, H, D] views with strides
    if layout == "bhsd":
        q, k, v = (x.transpose((0, 2, 1, 3)) for x in (q, k, v))
    obuf = cla.zeros(queue, (B, sq, H, 2 * D), np.float32)
    out = obuf[..., D:]
    if layout == "bhsd":
        out = out.transpose((0, 2, 1, 3))
    res = flashcl.attention(q, k, v, layout=layout, causal=True, out=out)
    assert res is out
    host = np.swapaxes(qkv, 1, 3)  # [B, H, 3, S, D]
    o64, _ = ref.attention(host[:, :, 0], host[:, :, 1], host[:, :, 2], causal=True)
    got = obuf.get()
    assert (got[..., :D] == 0).all(), "nothing written outside out's view"
    err = np.abs(np.swapaxes(got[..., D:], 1, 2) - o64).max()
    assert err <= 1e-5


@pytest.mark.parametrize("lq,ls", [(64, 64), (96, 64)])
def test_sdpa_causal_top_left(queue, rng, lq, ls):
    """scaled_dot_product_attention's is_causal is PyTorch's top-left mask (key j visible iff j <= i)."""
    q, k, v = _inputs(rng, lq, ls, h=H, hkv=H)
    out = flashcl.scaled_dot_product_attention(*_dev(queue, q, k, v), is_causal=True)
    top_left = np.where(np.arange(ls)[None, :] <= np.arange(lq)[:, None], 0.0, -np.inf)
    _check(out, None, ref.attention(q, k, v, mask=top_left)[0], None, 1e-5)


def test_sdpa_mask_scale_gqa(queue, rng):
    q, k, v = _inputs(rng, 45, 61)
    m = rng.standard_normal((45, 61)).astype(np.float32)
    out = flashcl.scaled_dot_product_attention(*_dev(queue, q, k, v), attn_mask=cla.to_device(queue, m), scale=0.3,
                                               enable_gqa=True)
    _check(out, None, ref.attention(q, k, v, mask=m, scale=0.3)[0], None, 1e-5)


def test_bfloat16_as_uint16(queue, rng):
    """bfloat16 as uint16 arrays holding its bits."""
    q, k, v = _inputs(rng, 40, 72)

    def to_bf16_bits(x):
        u = x.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even

    def from_bf16_bits(b):
        return (b.astype(np.uint32) << 16).view(np.float32)

    qb, kb, vb = (to_bf16_bits(x) for x in (q, k, v))
    out = flashcl.attention(*_dev(queue, qb, kb, vb), layout="bhsd")
    assert out.dtype == np.uint16
    o = from_bf16_bits(out.get()).astype(np.float64)
    o64, _ = ref.attention(*(from_bf16_bits(x) for x in (qb, kb, vb)))
    assert np.abs(o - o64).max() <= 1.6e-2


def test_bfloat16_ml_dtypes(queue, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in _inputs(rng, 40, 72))
    out = flashcl.attention(*_dev(queue, q, k, v), layout="bhsd")
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    o64, _ = ref.attention(*(x.astype(np.float64) for x in (q, k, v)))
    assert np.abs(out.get().astype(np.float64) - o64).max() <= 1.6e-2
