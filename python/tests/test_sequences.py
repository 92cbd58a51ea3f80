"""Packed (varlen) and paged sequences: flashcl.flash_attn_varlen_func and flashcl.flash_attn_with_kvcache
against the float64 NumPy reference run on each sequence's own dense tensors (gathered on the host from the
packed rows or through the block table): mixed lengths in one batch, decode and prompts, block sizes 1, 16
and 64 with shuffled tables and a block shared between sequences, GQA, causal and window, every modifier,
float32 and float16, key counts shorter than the cache; events; and the documented refusals."""

from __future__ import annotations

import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import flashcl
import reference as ref
from conftest import to_host

H, D = 4, 32
TOL = {np.float32: 1e-5, np.float16: 4e-3}
LENS = [1, 15, 16, 17, 200]  # around a 16-row tile, and one long sequence


def _ref_seq(q, k, v, b, **kw):
    """Sequence b's reference: q [nq, H, D], k, v [nk, Hkv, D] -> (o [nq, H, D], lse [H, nq]) in float64.

    Per-sequence modifiers: ALiBi slopes [B, H] take row b, a [B, H, Nq, Nk] mask is read at the sequence's
    own (i, j)."""
    kw = dict(kw)
    if kw.get("slopes") is not None and np.ndim(kw["slopes"]) == 2:
        kw["slopes"] = kw["slopes"][b]
    if kw.get("mask") is not None:
        kw["mask"] = kw["mask"][b : b + 1, :, : q.shape[0], : k.shape[0]]
    if k.shape[0] == 0:  # no key (NumPy cannot reduce over zero keys): out 0, lse -inf, or the sink's
        lse = np.full((H, q.shape[0]), -np.inf)
        if kw.get("sinks") is not None:
            lse[:] = np.asarray(kw["sinks"], np.float64)[:, None]
        return np.zeros(q.shape), lse
    t = lambda x: np.swapaxes(x, 0, 1)[None]  # noqa: E731  [n, h, d] -> [1, h, n, d]
    o, lse = ref.attention(t(q), t(k), t(v), **kw)
    return np.swapaxes(o[0], 0, 1), lse[0]


def _compare(got_o, got_lse, want_o, want_lse, dtype, what):
    got_o = np.asarray(got_o, np.float64)
    # Poisoned outputs: a row the call did not write stays NaN and fails here.
    assert np.isfinite(got_o).all(), f"{what}: non-finite output"
    err = np.abs(got_o - want_o).max()
    assert err <= TOL[dtype], f"{what}: max error {err:.3g} > {TOL[dtype]}"
    if got_lse is not None:
        fin = np.isfinite(want_lse)
        assert (np.isfinite(got_lse) == fin).all(), f"{what}: lse finite where the reference is not, or the reverse"
        if fin.any():
            assert np.abs(got_lse[fin] - want_lse[fin]).max() <= 1e-4, what


def _poison(queue, shape, dtype):
    return cla.to_device(queue, np.full(shape, np.nan, dtype))


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _paged(rng, lens_k, block_size, hkv, dtype, spare=3):
    """A paged cache holding each sequence's keys in shuffled blocks, the last two sequences sharing their
    first block (a common prefix; the shorter may use only part of it), every table row with garbage past
    its last block. Returns (k_pool, v_pool [NB, BS, Hkv, D], table [B, W], each sequence's dense k and v
    gathered through the table)."""
    per = [max(1, -(-n // block_size)) for n in lens_k]
    width = max(per) + 1
    a, z = len(lens_k) - 2, len(lens_k) - 1
    nb = sum(per) - 1 + spare
    ids = rng.permutation(nb).astype(np.int32)
    table = rng.integers(-(2**31), 2**31 - 1, size=(len(lens_k), width)).astype(np.int32)
    pos = 0
    for b, n in enumerate(per):
        for i in range(n):
            if b == z and i == 0:
                table[z, 0] = table[a, 0]
                continue
            table[b, i] = ids[pos]
            pos += 1
    kp = rng.standard_normal((nb, block_size, hkv, D)).astype(dtype)
    vp = rng.standard_normal((nb, block_size, hkv, D)).astype(dtype)
    ks, vs = [], []
    for b, n in enumerate(lens_k):
        rows = [table[b, j // block_size] * block_size + j % block_size for j in range(n)]
        ks.append(kp.reshape(-1, hkv, D)[rows])
        vs.append(vp.reshape(-1, hkv, D)[rows])
    return kp, vp, table, ks, vs


def _modifiers(rng, queue, spec, batch, nq, nk):
    """(reference kwargs, flashcl kwargs) of one modifier set."""
    np_kw, fc_kw = {}, {}
    if spec.get("causal"):
        np_kw["causal"] = fc_kw["causal"] = True
    if "window" in spec:
        np_kw["window"] = fc_kw["window_size"] = spec["window"]
    if "softcap" in spec:
        np_kw["softcap"] = fc_kw["softcap"] = spec["softcap"]
    if spec.get("alibi"):
        s = rng.uniform(0.01, 0.2, (batch, H)).astype(np.float32)
        np_kw["slopes"], fc_kw["alibi_slopes"] = s, cla.to_device(queue, s)
    if spec.get("mask"):
        m = rng.standard_normal((batch, 1, nq, nk)).astype(np.float32)
        m[..., ::3, 2] = -np.inf
        np_kw["mask"], fc_kw["mask"] = m, cla.to_device(queue, m)
    if spec.get("sinks"):
        s = rng.standard_normal(H).astype(np.float32)
        np_kw["sinks"], fc_kw["sinks"] = s, s
    return np_kw, fc_kw


MODS = {
    "plain": {},
    "causal": dict(causal=True),
    "window": dict(window=(7, 3)),
    "all": dict(causal=True, window=(40, -1), softcap=4.0, alibi=True, mask=True, sinks=True),
}

# ---- flash_attn_varlen_func with packed k and v ----


@pytest.mark.parametrize(
    "dtype, hkv, mods, queries",
    [
        (np.float32, 4, "plain", "prompt"),
        (np.float16, 2, "causal", "prompt"),
        (np.float32, 1, "window", "chunk"),
        (np.float16, 2, "causal", "chunk"),
        (np.float32, 2, "all", "chunk"),
    ],
    ids=["f32-mha-plain-prompt", "f16-gqa-causal-prompt", "f32-mqa-window-chunk", "f16-gqa-causal-chunk",
         "f32-gqa-all-chunk"],
)
def test_varlen_packed(queue, rng, dtype, hkv, mods, queries):
    """Packed queries and keys; "prompt": each sequence attends to itself (nq = nk), "chunk": the last few
    rows of each (decode's 1 row among them) against all of its keys, so bottom-right alignment differs per
    sequence."""
    lens_k = LENS
    lens_q = lens_k if queries == "prompt" else [1, 5, 1, 17, 9]
    q = rng.standard_normal((sum(lens_q), H, D)).astype(dtype)
    k = rng.standard_normal((sum(lens_k), hkv, D)).astype(dtype)
    v = rng.standard_normal((sum(lens_k), hkv, D)).astype(dtype)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    np_kw, fc_kw = _modifiers(rng, queue, MODS[mods], len(lens_k), max(lens_q), max(lens_k))
    out = _poison(queue, q.shape, dtype)
    o, lse = flashcl.flash_attn_varlen_func(
        cla.to_device(queue, q), cla.to_device(queue, k), cla.to_device(queue, v), cla.to_device(queue, cu_q),
        cla.to_device(queue, cu_k), max(lens_q), max(lens_k), out=out, return_lse=True, **fc_kw)
    assert o is out and lse.shape == (H, sum(lens_q))
    got_o, got_lse = o.get(), lse.get()
    for b in range(len(lens_k)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        wo, wl = _ref_seq(q[qs], k[ks], v[ks], b, **np_kw)
        _compare(got_o[qs], got_lse[:, qs], wo, wl, dtype, f"sequence {b}")


def test_varlen_views_and_seqused_k(queue, rng):
    """q, k, v as views of one packed QKV tensor (strides read, nothing copied), seqused_k shorter than each
    sequence's packed keys (one of them 0: its rows see no key), host index values, the FA2 return
    convention, and an out that is a strided view too."""
    lens = [3, 16, 17, 30]
    used = np.array([2, 0, 17, 11], np.int32)
    total, hkv = sum(lens), 2
    qkv = rng.standard_normal((total, H + 2 * hkv, D)).astype(np.float32)
    d_qkv = cla.to_device(queue, qkv)
    q, k, v = d_qkv[:, :H], d_qkv[:, H : H + hkv], d_qkv[:, H + hkv :]
    big = _poison(queue, (total, 2 * H, D), np.float32)
    out = big[:, H:]
    cu = _cu(lens)
    res = flashcl.flash_attn_varlen_func(q, k, v, cu.tolist(), cu, max(lens), max(lens), causal=True,
                                         seqused_k=used, return_attn_probs=True, out=out)
    assert len(res) == 3 and res[2] is None and res[0] is out
    got_o, got_lse = to_host(out), res[1].get()
    assert np.isnan(to_host(big)[:, :H]).all(), "wrote outside out's view"
    for b in range(len(lens)):
        rows = slice(cu[b], cu[b + 1])
        keys = slice(cu[b], cu[b] + used[b])
        wo, wl = _ref_seq(qkv[rows, :H], qkv[keys, H : H + hkv], qkv[keys, H + hkv :], b, causal=True)
        if used[b] == 0:
            assert (wl == -np.inf).all() and (wo == 0).all()  # the case this sequence is here for
        _compare(got_o[rows], got_lse[:, rows], wo, wl, np.float32, f"sequence {b}")


# ---- paged K/V: flash_attn_varlen_func(block_table=...) as vLLM calls it ----


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_varlen_paged(queue, rng, block_size, dtype):
    """vLLM's call: packed queries (decode rows and prompt chunks), paged caches, causal, GQA; key counts as
    vLLM gives them (seqused_k, on the device) in float16, as FA2 does (cu_seqlens_k, host values) in float32."""
    hkv = 2
    lens_k = LENS
    lens_q = [1, 15, 1, 17, 1]
    kp, vp, table, ks, vs = _paged(rng, lens_k, block_size, hkv, dtype)
    q = rng.standard_normal((sum(lens_q), H, D)).astype(dtype)
    cu_q = _cu(lens_q)
    if dtype == np.float16:
        counts = dict(cu_seqlens_k=None, seqused_k=cla.to_device(queue, np.array(lens_k, np.int32)))
    else:
        counts = dict(cu_seqlens_k=_cu(lens_k).tolist())
    out = _poison(queue, q.shape, dtype)
    o, lse = flashcl.flash_attn_varlen_func(
        cla.to_device(queue, q), cla.to_device(queue, kp), cla.to_device(queue, vp),
        cu_seqlens_q=cla.to_device(queue, cu_q), max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=True,
        block_table=cla.to_device(queue, table), out=out, return_softmax_lse=True, **counts)
    got_o, got_lse = o.get(), lse.get()
    for b in range(len(lens_k)):
        qs = slice(cu_q[b], cu_q[b + 1])
        wo, wl = _ref_seq(q[qs], ks[b], vs[b], b, causal=True)
        _compare(got_o[qs], got_lse[:, qs], wo, wl, dtype, f"sequence {b}")


def test_varlen_paged_stacked_cache_and_cu_seqlens_k(queue, rng):
    """FA2's paged varlen convention (key counts from cu_seqlens_k, differenced on the device), vLLM's stacked
    [2, num_blocks, block_size, Hkv, D] cache passed as its two halves, a row-strided block table view, a
    window, and every modifier."""
    block_size, hkv = 16, 2
    lens_k = [1, 33, 20, 70]
    lens_q = [1, 4, 20, 2]
    kp, vp, table, ks, vs = _paged(rng, lens_k, block_size, hkv, np.float32)
    kv = np.stack([kp, vp])
    wide = np.full((len(lens_k), table.shape[1] + 5), -1, np.int32)
    wide[:, : table.shape[1]] = table
    d_kv, d_wide = cla.to_device(queue, kv), cla.to_device(queue, wide)
    q = rng.standard_normal((sum(lens_q), H, D)).astype(np.float32)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    spec = dict(MODS["all"], window=(25, -1))
    np_kw, fc_kw = _modifiers(rng, queue, spec, len(lens_k), max(lens_q), max(lens_k))
    o, lse = flashcl.flash_attn_varlen_func(
        cla.to_device(queue, q), d_kv[0], d_kv[1], cla.to_device(queue, cu_q), cla.to_device(queue, cu_k),
        max(lens_q), max(lens_k), block_table=d_wide[:, : table.shape[1]], return_lse=True, **fc_kw)
    got_o, got_lse = o.get(), lse.get()
    for b in range(len(lens_k)):
        qs = slice(cu_q[b], cu_q[b + 1])
        wo, wl = _ref_seq(q[qs], ks[b], vs[b], b, **np_kw)
        _compare(got_o[qs], got_lse[:, qs], wo, wl, np.float32, f"sequence {b}")


# ---- flash_attn_with_kvcache ----


@pytest.mark.parametrize(
    "dtype, seqlen_q, mods",
    [(np.float16, 1, "plain"), (np.float32, 5, "causal"), (np.float32, 3, "all")],
    ids=["f16-decode", "f32-speculative-causal", "f32-all"],
)
def test_kvcache_dense(queue, rng, dtype, seqlen_q, mods):
    """Dense [batch, seqlen_cache, Hkv, D] caches with cache_seqlens shorter than the cache (the rest is
    garbage that must not be read), one of them 0."""
    hkv, cap = 2, 80
    lens = np.array([0, 1, 17, 64, 80], np.int32)
    batch = len(lens)
    q = rng.standard_normal((batch, seqlen_q, H, D)).astype(dtype)
    kc = rng.standard_normal((batch, cap, hkv, D)).astype(dtype)
    vc = rng.standard_normal((batch, cap, hkv, D)).astype(dtype)
    for b, n in enumerate(lens):  # past each sequence's end: huge values, visible in any error
        kc[b, n:], vc[b, n:] = 1e4, 1e4
    np_kw, fc_kw = _modifiers(rng, queue, MODS[mods], batch, seqlen_q, cap)
    out = _poison(queue, q.shape, dtype)
    o, lse = flashcl.flash_attn_with_kvcache(
        cla.to_device(queue, q), cla.to_device(queue, kc), cla.to_device(queue, vc),
        cache_seqlens=cla.to_device(queue, lens), out=out, return_softmax_lse=True, **fc_kw)
    assert lse.shape == (batch, H, seqlen_q)
    got_o, got_lse = o.get(), lse.get()
    for b, n in enumerate(lens):
        wo, wl = _ref_seq(q[b], kc[b, :n], vc[b, :n], b, **np_kw)
        _compare(got_o[b], got_lse[b], wo, wl, dtype, f"sequence {b}")


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_kvcache_paged_decode(queue, rng, block_size):
    """Paged decode (seqlen_q 1), GQA, shuffled tables with a shared prefix block, cache_seqlens as host values."""
    hkv = 1 if block_size == 16 else 2
    lens_k = LENS
    kp, vp, table, ks, vs = _paged(rng, lens_k, block_size, hkv, np.float16)
    q = rng.standard_normal((len(lens_k), 1, H, D)).astype(np.float16)
    out = _poison(queue, q.shape, np.float16)
    o, lse = flashcl.flash_attn_with_kvcache(
        cla.to_device(queue, q), cla.to_device(queue, kp), cla.to_device(queue, vp), cache_seqlens=lens_k,
        block_table=cla.to_device(queue, table), causal=True, out=out, return_lse=True)
    got_o, got_lse = o.get(), lse.get()
    for b in range(len(lens_k)):
        wo, wl = _ref_seq(q[b], ks[b], vs[b], b, causal=True)
        _compare(got_o[b], got_lse[b], wo, wl, np.float16, f"sequence {b}")


def test_bfloat16_paged_and_packed(queue, rng):
    """bfloat16 (ml_dtypes) through both entry points: paged decode and packed prompts."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    lens_k = [1, 17, 40]
    kp, vp, table, ks, vs = _paged(rng, lens_k, 16, 2, np.float32)
    kp, vp = kp.astype(bf16), vp.astype(bf16)
    ks, vs = [x.astype(bf16) for x in ks], [x.astype(bf16) for x in vs]
    q = rng.standard_normal((len(lens_k), 1, H, D)).astype(bf16)
    o = flashcl.flash_attn_with_kvcache(cla.to_device(queue, q), cla.to_device(queue, kp), cla.to_device(queue, vp),
                                        cache_seqlens=lens_k, block_table=table, causal=True)
    assert o.dtype == np.dtype(bf16)
    got = o.get().astype(np.float64)
    for b in range(len(lens_k)):
        wo, _ = _ref_seq(q[b].astype(np.float64), ks[b].astype(np.float64), vs[b].astype(np.float64), b, causal=True)
        assert np.abs(got[b] - wo).max() <= 1.6e-2, f"paged sequence {b}"
    pq = rng.standard_normal((sum(lens_k), H, D)).astype(bf16)
    pk = rng.standard_normal((sum(lens_k), 2, D)).astype(bf16)
    cu = _cu(lens_k)
    o = flashcl.flash_attn_varlen_func(*(cla.to_device(queue, x) for x in (pq, pk, pk)), cu, cu, max(lens_k),
                                       max(lens_k), causal=True)
    got = o.get().astype(np.float64)
    for b in range(len(lens_k)):
        rows = slice(cu[b], cu[b + 1])
        wo, _ = _ref_seq(*(x[rows].astype(np.float64) for x in (pq, pk, pk)), b, causal=True)
        assert np.abs(got[rows] - wo).max() <= 1.6e-2, f"packed sequence {b}"


def test_kvcache_append_then_attend(queue, rng):
    """reshape_and_cache writes the new tokens, then the attention counts them: a decode step as an engine
    runs it, chained by events only."""
    block_size, hkv = 16, 2
    lens_k = [5, 16, 40]
    kp, vp, table, ks, vs = _paged(rng, [n + 1 for n in lens_k], block_size, hkv, np.float32)
    d_kp, d_vp = cla.to_device(queue, kp), cla.to_device(queue, vp)
    new_k = rng.standard_normal((len(lens_k), hkv, D)).astype(np.float32)
    new_v = rng.standard_normal((len(lens_k), hkv, D)).astype(np.float32)
    slots = np.array([table[b, n // block_size] * block_size + n % block_size for b, n in enumerate(lens_k)], np.int64)
    flashcl.reshape_and_cache(cla.to_device(queue, new_k), cla.to_device(queue, new_v), d_kp, d_vp,
                              cla.to_device(queue, slots))
    q = rng.standard_normal((len(lens_k), 1, H, D)).astype(np.float32)
    o = flashcl.flash_attn_with_kvcache(cla.to_device(queue, q), d_kp, d_vp, cache_seqlens=[n + 1 for n in lens_k],
                                        block_table=cla.to_device(queue, table), causal=True)
    got = o.get()
    for b, n in enumerate(lens_k):
        k_b, v_b = ks[b].copy(), vs[b].copy()
        k_b[n], v_b[n] = new_k[b], new_v[b]
        wo, _ = _ref_seq(q[b], k_b, v_b, b, causal=True)
        _compare(got[b], None, wo, None, np.float32, f"sequence {b}")


# ---- events ----


@pytest.mark.parametrize("gated", ["cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table"])
def test_waits_for_each_index_array(cl_context, device, rng, gated):
    """One index array is uploaded behind a gate on an out-of-order queue: the call must wait for it through
    its events (cu_seqlens_k through the device-side differencing that turns it into key counts)."""
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not device.get_info(cl.device_info.QUEUE_PROPERTIES) & props:
        pytest.skip("the device has no out-of-order queues")
    queue = cl.CommandQueue(cl_context, device, properties=props)
    block_size, hkv = 16, 2
    lens_k, lens_q = [3, 40], [1, 2]
    kp, vp, table, ks, vs = _paged(rng, lens_k, block_size, hkv, np.float32)
    q = rng.standard_normal((sum(lens_q), H, D)).astype(np.float32)
    host = {"cu_seqlens_q": _cu(lens_q), "block_table": table}
    host["cu_seqlens_k" if gated == "cu_seqlens_k" else "seqused_k"] = (
        _cu(lens_k) if gated == "cu_seqlens_k" else np.array(lens_k, np.int32))
    # Blocking uploads before the gate: PoCL runs a blocking write behind the gated commands.
    dev = {name: cla.to_device(queue, x) for name, x in host.items() if name != gated}
    d_q, d_kp, d_vp = (cla.to_device(queue, x) for x in (q, kp, vp))
    gate = cl.UserEvent(queue.context)
    dev[gated] = cla.empty(queue, host[gated].shape, np.int32)
    dev[gated].add_event(cl.enqueue_copy(queue, dev[gated].base_data, host[gated], wait_for=[gate], is_blocking=False))
    try:
        o = flashcl.flash_attn_varlen_func(d_q, d_kp, d_vp, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                           causal=True, **{"cu_seqlens_k": None, **dev})
        time.sleep(0.2)
        status = o.events[-1].get_info(cl.event_info.COMMAND_EXECUTION_STATUS)
        assert status != cl.command_execution_status.COMPLETE, f"the call did not wait for {gated}"
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    got = o.get()
    cu_q = host["cu_seqlens_q"]
    for b in range(len(lens_k)):
        qs = slice(cu_q[b], cu_q[b + 1])
        wo, _ = _ref_seq(q[qs], ks[b], vs[b], b, causal=True)
        _compare(got[qs], None, wo, None, np.float32, f"sequence {b}")


# ---- untrusted indices and refusals ----


def test_device_index_beyond_max_seqlen_gives_nan(queue, rng):
    """A device cu_seqlens_k whose sequence is longer than max_seqlen_k is not read back on the host: as
    docs/api.md says, that sequence's rows come back NaN and the others are exact."""
    lens = [4, 9]
    q = rng.standard_normal((sum(lens), H, D)).astype(np.float32)
    k = rng.standard_normal((sum(lens), H, D)).astype(np.float32)
    cu = _cu(lens)
    o = flashcl.flash_attn_varlen_func(cla.to_device(queue, q), cla.to_device(queue, k), cla.to_device(queue, k),
                                       cla.to_device(queue, cu), cla.to_device(queue, cu), 9, 5).get()
    assert np.isnan(o[4:]).all()
    wo, _ = _ref_seq(q[:4], k[:4], k[:4], 0)
    _compare(o[:4], None, wo, None, np.float32, "sequence 0")
    with pytest.raises(flashcl.InvalidArgumentError, match="longer than max_seqlen_k"):  # host values: caught
        flashcl.flash_attn_varlen_func(cla.to_device(queue, q), cla.to_device(queue, k), cla.to_device(queue, k),
                                       cu, cu, 9, 5)


def _small(queue):
    rng = np.random.default_rng(0)
    q = cla.to_device(queue, rng.standard_normal((8, 2, 8)).astype(np.float32))
    k = cla.to_device(queue, rng.standard_normal((8, 2, 8)).astype(np.float32))
    cu = cla.to_device(queue, np.array([0, 3, 8], np.int32))
    return q, k, cu


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(cu_seqlens_q="int64"), "cu_seqlens_q has dtype int64; it must be int32"),
        (dict(cu_seqlens_k="float"), "cu_seqlens_k must hold integers"),
        (dict(cu_seqlens_k="short"), "cu_seqlens_k has 2 entries and cu_seqlens_q 3"),
        (dict(cu_seqlens_q="offset"), "offset 0"),
        (dict(cu_seqlens_q=[0, 5, 3]), "non-decreasing"),
        (dict(cu_seqlens_q=[0, 3, 9]), "non-decreasing from 0 to at most 8"),
        (dict(cu_seqlens_k=None), "cu_seqlens_k is None"),
        (dict(q="4d"), "3-D, \\[total_q, heads, head_dim\\]"),
        (dict(k="f16"), "k has dtype float16 but q has float32"),
        (dict(v="short"), "k and v must have the same shape"),
        (dict(k="heads3"), "must divide"),
        (dict(max_seqlen_q=0), "max_seqlen_q is 0"),
        (dict(seqused_k=[1, 2, 3]), "seqused_k has 3 entries"),
        (dict(seqused_k=[1, 6]), "seqused_k is \\[1, 6\\]"),
        (dict(lse="wrong"), "lse must be a contiguous float32 array of shape \\(2, 8\\)"),
        (dict(out="f16"), "out has dtype float16"),
        (dict(block_table="rows"), "one row per sequence"),
        (dict(block_table="reach"), "max_seqlen_k is 8 but a block_table row reaches 1 blocks of 4 keys"),
        (dict(block_table="no-lens"), "pass seqused_k"),
    ],
    ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}={v}" for k, v in x.items()),
)
def test_varlen_refusals(queue, change, match):
    q, k, cu = _small(queue)
    args = dict(q=q, k=k, v=k, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    kw = {}
    for name, how in change.items():
        if how == "int64":
            args[name] = cla.to_device(queue, cu.get().astype(np.int64))
        elif how == "float":
            args[name] = cu.get().astype(np.float32)
        elif how == "short":
            args[name] = cla.to_device(queue, np.array([0, 8], np.int32)) if name.startswith("cu") else k[:4]
        elif how == "offset":
            args[name] = cla.to_device(queue, np.array([7, 0, 3, 8], np.int32))[1:]
        elif how == "4d":
            args[name] = q.reshape(1, 8, 2, 8)
        elif how == "f16":
            if name == "out":
                kw["out"] = cla.empty(queue, q.shape, np.float16)
            else:
                args[name] = cla.to_device(queue, k.get().astype(np.float16))
        elif how == "heads3":
            args["k"] = args["v"] = cla.to_device(queue, np.zeros((8, 3, 8), np.float32))
        elif name == "lse":
            kw["lse"] = cla.empty(queue, (2, 3, 8), np.float32)
        elif name == "block_table":
            pool = cla.to_device(queue, np.zeros((4, 4, 2, 8), np.float32))
            args["k"] = args["v"] = pool
            if how == "rows":
                kw["block_table"], kw["seqused_k"] = cla.to_device(queue, np.zeros((3, 2), np.int32)), [1, 1]
            elif how == "reach":
                args["max_seqlen_k"] = 8
                kw["block_table"], kw["seqused_k"] = cla.to_device(queue, np.zeros((2, 1), np.int32)), [1, 1]
            else:
                args["cu_seqlens_k"] = None
                kw["block_table"] = cla.to_device(queue, np.zeros((2, 2), np.int32))
        elif name in ("seqused_k",):
            kw[name] = how
        else:
            args[name] = how
    with pytest.raises(flashcl.InvalidArgumentError, match=match) as e:
        flashcl.flash_attn_varlen_func(**args, **kw)
    assert e.value.status == flashcl.Status.INVALID_ARGUMENT


def test_kvcache_refusals(queue):
    q = cla.to_device(queue, np.zeros((2, 1, 2, 8), np.float32))
    cache = cla.to_device(queue, np.zeros((2, 16, 2, 8), np.float32))
    with pytest.raises(flashcl.UnsupportedError, match="reshape_and_cache"):
        flashcl.flash_attn_with_kvcache(q, cache, cache, cache[:, :1], cache[:, :1])
    with pytest.raises(flashcl.UnsupportedError, match="rotary_cos"):
        flashcl.flash_attn_with_kvcache(q, cache, cache, rotary_cos=cache)
    with pytest.raises(flashcl.InvalidArgumentError, match="cache_seqlens is \\[3, 17\\]"):
        flashcl.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=[3, 17])
    with pytest.raises(flashcl.InvalidArgumentError, match="cache_seqlens has dtype int64"):
        flashcl.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=cla.to_device(queue, np.array([1, 2])))
    with pytest.raises(flashcl.InvalidArgumentError, match="q has batch 2 but k_cache has 1"):
        flashcl.flash_attn_with_kvcache(q, cache[:1], cache[:1])
    with pytest.raises(flashcl.InvalidArgumentError, match="block_table has dtype int64"):
        flashcl.flash_attn_with_kvcache(q, cache, cache, block_table=cla.to_device(queue, np.zeros((2, 1), np.int64)))
    with pytest.raises(flashcl.InvalidArgumentError, match="paged cache \\[num_blocks, block_size"):
        flashcl.flash_attn_with_kvcache(q, cache[0], cache[0], block_table=np.zeros((2, 1), np.int32))
    # The library's own validation, with its message: a block of more than 1024 keys.
    big = cla.to_device(queue, np.zeros((1, 1025, 2, 8), np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="block_size is 1025") as e:
        flashcl.flash_attn_with_kvcache(q, big, big, block_table=np.zeros((2, 1), np.int32), cache_seqlens=1)
    assert "block_size" in e.value.message
    # The backward and the reference path are not exposed: the library refuses packed descriptors there.
    assert not hasattr(flashcl, "flash_attn_varlen_backward")
