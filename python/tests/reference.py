"""A NumPy reference of flashcl's attention, with every score modifier, in any float dtype.

In float64 it is the reference the outputs are checked against; in float32 or float16 it is "the same
attention computed in the low-precision dtype" of FlashAttention 2's test criterion: every product, sum
and exp is rounded to that dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def visible(nq: int, nk: int, causal: bool, window: Tuple[int, int]) -> np.ndarray:
    """[nq, nk] bool: key j visible to query row i (positions p = i + nk - nq)."""
    left, right = window
    if causal:
        right = 0
    p = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    vis = np.ones((nq, nk), dtype=bool)
    if left >= 0:
        vis &= j >= p - left
    if right >= 0:
        vis &= j <= p + right
    return vis


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    dtype=np.float64,
    causal: bool = False,
    scale: Optional[float] = None,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    slopes: Optional[np.ndarray] = None,
    mask: Optional[np.ndarray] = None,
    sinks: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """q [B, H, Nq, D], k and v [B, Hkv, Nk, D] (logical layout) -> (o [B, H, Nq, D], lse [B, H, Nq]).

    slopes: [H] or [B, H]; mask: broadcastable to [B, H, Nq, Nk]; sinks: [H]. Rows that see no key (and
    have no sink) give o = 0 and lse = -inf, as flashcl.
    """
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    g = H // Hkv
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sc = dtype(1.0 / np.sqrt(D) if scale is None else scale)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * sc
        if softcap:
            s = dtype(softcap) * np.tanh(s / dtype(softcap))
        p = np.arange(Nq)[:, None] + (Nk - Nq)
        if slopes is not None:
            sl = np.asarray(slopes, dtype=dtype)
            sl = np.broadcast_to(sl if sl.ndim == 2 else sl[None, :], (B, H))
            s = s - sl[:, :, None, None] * np.abs(p - np.arange(Nk)[None, :]).astype(dtype)
        if mask is not None:
            s = s + np.asarray(mask, dtype=dtype)
        s = np.where(visible(Nq, Nk, causal, window), s, dtype(-np.inf))
        m = s.max(axis=-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, np.asarray(sinks, dtype=dtype)[None, :, None, None])
        m_safe = np.where(np.isfinite(m), m, dtype(0))
        e = np.exp(s - m_safe)
        l = e.sum(axis=-1, keepdims=True, dtype=dtype)
        if sinks is not None:
            l = l + np.exp(np.asarray(sinks, dtype=dtype)[None, :, None, None] - m_safe)
        o = np.matmul(e, v) / np.where(l > 0, l, dtype(1))
        o = np.where(l > 0, o, dtype(0))
        lse = np.where(l > 0, m_safe + np.log(l), dtype(-np.inf))[..., 0]
    return o, lse


def attention_grads(q, k, v, do, **kw):
    """float64 gradients (dq, dk, dv, dsinks) of sum(o * do), analytically, with the same modifiers.

    dk, dv of a K/V head sum over its query heads; dsinks is None without sinks.
    """
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    g = H // Hkv
    softcap, scale = kw.get("softcap", 0.0), kw.get("scale")
    sinks = kw.get("sinks")
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    o, lse = attention(q, k, v, **kw)
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    raw = np.matmul(q, np.swapaxes(kr, -1, -2)) * sc
    dcap = 1.0
    if softcap:
        t = np.tanh(raw / softcap)
        dcap = 1.0 - t * t
    # Probabilities from the forward's lse (recompute the modified scores).
    with np.errstate(invalid="ignore", over="ignore"):
        s_mod = attention_scores(q, k, v, **kw)
        pr = np.where(np.isfinite(lse)[..., None], np.exp(s_mod - lse[..., None]), 0.0)
    Di = (do * o).sum(-1, keepdims=True)
    dv_full = np.matmul(np.swapaxes(pr, -1, -2), do)
    dp = np.matmul(do, np.swapaxes(vr, -1, -2))
    ds = pr * (dp - Di) * dcap
    dq = np.matmul(ds, kr) * sc
    dk_full = np.matmul(np.swapaxes(ds, -1, -2), q) * sc
    dk = dk_full.reshape(B, Hkv, g, Nk, D).sum(2)
    dv = dv_full.reshape(B, Hkv, g, Nk, D).sum(2)
    dsinks = None
    if sinks is not None:
        sk = np.asarray(sinks, np.float64)[None, :, None]
        contrib = np.where(np.isfinite(lse), -Di[..., 0] * np.exp(sk - lse), 0.0)
        dsinks = contrib.sum(axis=(0, 2))
    return dq, dk, dv, dsinks


def attention_scores(q, k, v, **kw):
    """The float64 modified scores [B, H, Nq, Nk] (-inf where hidden) of attention()'s arguments."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    kr = np.repeat(np.asarray(k, np.float64), H // Hkv, axis=1)
    scale = kw.get("scale")
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.matmul(np.asarray(q, np.float64), np.swapaxes(kr, -1, -2)) * sc
    if kw.get("softcap"):
        s = kw["softcap"] * np.tanh(s / kw["softcap"])
    p = np.arange(Nq)[:, None] + (Nk - Nq)
    if kw.get("slopes") is not None:
        sl = np.asarray(kw["slopes"], np.float64)
        sl = np.broadcast_to(sl if sl.ndim == 2 else sl[None, :], (B, H))
        s = s - sl[:, :, None, None] * np.abs(p - np.arange(Nk)[None, :])
    if kw.get("mask") is not None:
        s = s + np.asarray(kw["mask"], np.float64)
    return np.where(visible(Nq, Nk, kw.get("causal", False), kw.get("window", (-1, -1))), s, -np.inf)
