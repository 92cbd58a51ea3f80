"""Packed (varlen) and paged sequences on arrays: FlashAttention 2's ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``, forward only (the library's backward and reference path take dense tensors only).

The index arrays (cu_seqlens, seqused_k / cache_seqlens, block_table) are int32, as FlashAttention's. On the
device they are the library's to distrust (docs/api.md, "Untrusted indices": a bad one gives NaN or unwritten
rows in that sequence, never an access outside a buffer); given as host values they are checked here, then
uploaded.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import _core
from ._attention import (
    _Call,
    _array,
    _check_dtype_same,
    _elements,
    _enqueue,
    _lse_array,
    _modifiers,
    _queue_of,
    _tensor,
)
from ._core import Context, Descriptor
from .errors import InvalidArgumentError, UnsupportedError

_INT32_MAX = 2**31 - 1


def _packed(x: Any, name: str, what: str = "[total, heads, head_dim]") -> Tuple[cla.Array, Tuple[int, int, int], int]:
    """A packed 3-D array: (array, strides in elements as the library reads packed rows, offset in elements).

    The library takes (batch, head, row) strides and ignores the batch one for packed rows."""
    a = _array(x, name)
    if a.ndim != 3:
        raise InvalidArgumentError(f"{name} has {a.ndim} dimensions (shape {a.shape}); it must be 3-D, {what}")
    _core.fcl_dtype(a.dtype, f"{name}'s dtype")
    isz = a.dtype.itemsize
    st = [_elements(s, isz, f"a stride of {name}") for s in a.strides]
    if any(s < 0 for s in st):
        raise InvalidArgumentError(f"{name} has a negative stride ({a.strides}); flashcl takes non-negative strides")
    if a.shape[2] > 1 and st[2] != 1:
        raise InvalidArgumentError(
            f"{name}'s head_dim elements are not contiguous (strides {a.strides} bytes for shape {a.shape}); "
            "flashcl needs each row's head_dim elements next to each other"
        )
    # All-zero strides would read as "packed" to the library; a zero stride on a real dimension aliases rows.
    if any(n > 1 and s == 0 for n, s in zip(a.shape[:2], st[:2])):
        raise InvalidArgumentError(f"{name} has a zero stride ({a.strides}) on a dimension of size > 1; pass a materialized array")
    return a, (0, st[1], st[0]), _elements(a.offset, isz, f"the offset of {name}")


def _count(x: Any, name: str, low: int = 1) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, not {type(x).__name__}")
    if not low <= int(x) <= _INT32_MAX:
        raise InvalidArgumentError(f"{name} is {int(x)}; it must be in [{low}, 2^31)")
    return int(x)


def _index(x: Any, name: str, ndim: int, queue: cl.CommandQueue) -> Tuple[cla.Array, Optional[np.ndarray]]:
    """An int32 index array on the device, and its values when they came from the host (None otherwise).

    A pyopencl array must be int32 already (no silent conversion of device data); host values of any integer
    dtype are range-checked and uploaded."""
    host = None
    if not isinstance(x, cla.Array):
        h = np.asarray(x)
        if h.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{name} must hold integers, not {h.dtype}")
        if h.size and (h.min() < -(2**31) or h.max() > _INT32_MAX):
            raise InvalidArgumentError(f"{name} holds values outside int32")
        if h.ndim != ndim or h.size == 0:
            raise InvalidArgumentError(f"{name} has shape {h.shape}; it must be a non-empty {ndim}-D array")
        host = h.astype(np.int32)
        x = cla.to_device(queue, np.ascontiguousarray(host))
    a = _array(x, name)
    if a.dtype != np.int32:
        raise InvalidArgumentError(f"{name} has dtype {a.dtype}; it must be int32 (as FlashAttention's)")
    if a.ndim != ndim:
        raise InvalidArgumentError(f"{name} has shape {a.shape}; it must be {ndim}-D")
    if a.offset:
        raise InvalidArgumentError(f"{name} must start at the beginning of its buffer (offset 0; the library takes no index offset)")
    if a.shape[-1] > 1 and a.strides[-1] != 4:
        raise InvalidArgumentError(f"{name}'s last dimension must be contiguous (strides {a.strides})")
    if ndim == 1 and not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} must be contiguous (strides {a.strides})")
    return a, host


def _check_cu(host: Optional[np.ndarray], name: str, total: int, longest: int, longest_name: str) -> None:
    """What the host can see of cu_seqlens: from 0, non-decreasing, within total, no sequence over longest."""
    if host is None:
        return
    lens = np.diff(host)
    if host[0] != 0 or (lens < 0).any() or host[-1] > total:
        raise InvalidArgumentError(f"{name} is {host.tolist()}; it must be non-decreasing from 0 to at most {total}")
    if lens.max(initial=0) > longest:
        raise InvalidArgumentError(f"{name} has a sequence of {lens.max()} rows, longer than {longest_name} = {longest}")


def _check_lens(host: Optional[np.ndarray], name: str, longest: int, longest_name: str) -> None:
    if host is not None and host.size and (host.min() < 0 or host.max() > longest):
        raise InvalidArgumentError(f"{name} is {host.tolist()}; each must be in [0, {longest_name} = {longest}]")


def _block_table(x: Any, batch: int, queue: cl.CommandQueue) -> Tuple[cla.Array, int, Optional[np.ndarray]]:
    """(int32 [batch, max_blocks] table, entries between rows, host values). A row-strided view (a slice
    ``table[:, :n]``) is read in place: its row stride is the library's block_table_stride."""
    t, host = _index(x, "block_table", 2, queue)
    if t.shape[0] != batch:
        raise InvalidArgumentError(f"block_table has shape {t.shape}; it must have one row per sequence ({batch})")
    stride = t.strides[0] // 4 if batch > 1 else t.shape[1]
    if t.strides[0] % 4 or stride < t.shape[1]:
        raise InvalidArgumentError(f"block_table's rows overlap or are misaligned (strides {t.strides})")
    return t, stride, host


def _paged_cache(x: Any, name: str) -> Any:
    a = _array(x, name)
    if a.ndim != 4:
        raise InvalidArgumentError(
            f"{name} has shape {a.shape}; with a block_table it must be the paged cache "
            "[num_blocks, block_size, kv_heads, head_dim]"
        )
    return _tensor(a, name, "bshd")  # (block, head, row in block) strides, as the library reads pools


def _scale(softmax_scale: Optional[float]) -> float:
    if softmax_scale is None:
        return 0.0
    s = float(softmax_scale)
    if s == 0.0:
        raise InvalidArgumentError(
            "softmax_scale=0 is not supported (the library reads 0 as the default); pass None for 1/sqrt(head_dim)"
        )
    return s


def _shapes_agree(q_heads: int, q_dim: int, kv_heads: int, kv_dim: int, k_shape: Tuple[int, ...],
                  v_shape: Tuple[int, ...], kn: str, vn: str) -> None:
    if tuple(k_shape) != tuple(v_shape):
        raise InvalidArgumentError(f"{kn} and {vn} must have the same shape; they have {k_shape} and {v_shape}")
    if kv_dim != q_dim:
        raise InvalidArgumentError(f"q has head_dim {q_dim} but {kn} and {vn} have {kv_dim}")
    if q_heads % kv_heads:
        raise InvalidArgumentError(
            f"q has {q_heads} heads and {kn}, {vn} have {kv_heads}: the K/V head count must divide the query's (GQA/MQA)"
        )


def flash_attn_varlen_func(
    q: cla.Array,
    k: cla.Array,
    v: cla.Array,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    seqused_k: Any = None,
    sinks: Any = None,
    mask: Optional[cla.Array] = None,
    return_lse: bool = False,
    return_softmax_lse: bool = False,
    out: Optional[cla.Array] = None,
    lse: Optional[cla.Array] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[Any, ...]]:
    """FlashAttention 2's ``flash_attn_varlen_func`` on PyOpenCL arrays: a batch of sequences of different
    lengths packed end to end, forward only.

    Args:
        q: [total_q, heads, head_dim]; sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1.
            Any strides whose head_dim elements are contiguous, any offset (a view of a packed QKV tensor).
        k, v: packed [total_k, kv_heads, head_dim] with ``cu_seqlens_k``; or, with ``block_table``, the paged
            caches [num_blocks, block_size, kv_heads, head_dim] (vLLM's and FlashAttention's layout, any
            strides with head_dim contiguous: the two halves of vLLM's stacked [2, num_blocks, ...] cache work).
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], non-decreasing from 0. With ``block_table``,
            ``cu_seqlens_k`` may be None (then ``seqused_k`` gives the key counts) or give the counts as
            differences (FlashAttention's paged varlen), computed on the device.
        max_seqlen_q, max_seqlen_k: the longest sequence's query and key counts; they size the launch.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as :func:`flash_attn_func`, per sequence:
            query row i of sequence b sits at key position i + nk_b - nq_b (bottom-right aligned);
            ``alibi_slopes`` [heads] or [batch, heads].
        dropout_p: must be 0. deterministic: ignored (there is no backward here).
        return_attn_probs: return (out, lse, None), as FlashAttention without dropout.
        block_table: int32 [batch, max_blocks_per_seq]: key j of sequence b is row j % block_size of block
            block_table[b, j // block_size]. A row-strided view (``table[:, :n]``) is read in place.
        seqused_k: int32 [batch]: sequence b uses its first seqused_k[b] keys (vLLM's seq_lens); with a block
            table it takes precedence over cu_seqlens_k.
        sinks: float32 [heads], one logit per head added to each softmax denominator.
        mask: additive float mask [batch, heads, max_seqlen_q, max_seqlen_k] (or broadcastable), read at each
            sequence's own (i, j).
        return_lse / return_softmax_lse: return (out, lse), lse float32 [heads, total_q] (FlashAttention's
            varlen layout). out, lse: arrays to write into (out: q's shape and dtype, head_dim contiguous).
        queue, wait_for, context: as :func:`attention`.

    Index arrays may be pyopencl int32 arrays at offset 0, or host integers (checked here: from 0,
    non-decreasing, within the totals and the max_seqlen bounds; then uploaded). Device values are not
    read back: a bad one gives NaN (or, for cu_seqlens_q, unwritten rows) in that sequence's output
    (docs/api.md, "Untrusted indices").

    Returns:
        out [total_q, heads, head_dim], or (out, lse). The event is added to their ``events``.

    Raises:
        InvalidArgumentError: wrong types, dtypes or shapes, or the library's validation.
        UnsupportedError: dropout_p != 0; and the library's refusals (as :func:`attention`).
    """
    if dropout_p:
        raise UnsupportedError(f"dropout_p is {dropout_p}; flashcl has no dropout")
    qa, q_stride, q_off = _packed(q, "q", "[total_q, heads, head_dim]")
    queue = _queue_of(queue, qa)
    call = _Call(queue)
    total_q, H, D = qa.shape
    nq = _count(max_seqlen_q, "max_seqlen_q")
    nk = _count(max_seqlen_k, "max_seqlen_k")
    cu_q, cu_q_host = _index(cu_seqlens_q, "cu_seqlens_q", 1, queue)
    batch = cu_q.shape[0] - 1
    if batch < 1:
        raise InvalidArgumentError(f"cu_seqlens_q has {cu_q.shape[0]} entries; it needs batch + 1 >= 2")
    _check_cu(cu_q_host, "cu_seqlens_q", total_q, nq, "max_seqlen_q")
    desc = Descriptor(batch=batch, num_heads=H, seqlen_q=nq, seqlen_k=nk, head_dim=D, dtype=qa.dtype,
                      scale=_scale(softmax_scale), causal=bool(causal), q_stride=q_stride, q_offset=q_off,
                      cu_seqlens_q=cu_q.base_data, total_q=total_q)
    keep: List[Any] = [cu_q]
    call.wait_on(qa, cu_q)
    if block_table is None:
        ka, k_stride, k_off = _packed(k, "k", "[total_k, kv_heads, head_dim] (or pass block_table for a paged cache)")
        va, v_stride, v_off = _packed(v, "v", "[total_k, kv_heads, head_dim] (or pass block_table for a paged cache)")
        for name, a in (("k", ka), ("v", va)):
            _check_dtype_same(name, a, qa, "q")
        total_k, kv_heads, kd = ka.shape
        _shapes_agree(H, D, kv_heads, kd, ka.shape, va.shape, "k", "v")
        if cu_seqlens_k is None:
            raise InvalidArgumentError("cu_seqlens_k is None; packed k and v need it (paged caches need block_table)")
        cu_k, cu_k_host = _index(cu_seqlens_k, "cu_seqlens_k", 1, queue)
        if cu_k.shape[0] != batch + 1:
            raise InvalidArgumentError(
                f"cu_seqlens_k has {cu_k.shape[0]} entries and cu_seqlens_q {batch + 1}; they must be alike"
            )
        _check_cu(cu_k_host, "cu_seqlens_k", total_k, nk, "max_seqlen_k")
        desc.cu_seqlens_k, desc.total_k = cu_k.base_data, total_k
        # seqused_k counts keys within each sequence's cu_seqlens_k span.
        lens_limit: Any = np.diff(cu_k_host) if cu_k_host is not None else nk
        keep.append(cu_k)
        call.wait_on(cu_k)
    else:
        kt, vt = _paged_cache(k, "k"), _paged_cache(v, "v")
        ka, va = kt.array, vt.array
        for name, a in (("k", ka), ("v", va)):
            _check_dtype_same(name, a, qa, "q")
        _shapes_agree(H, D, kt.heads, kt.dim, ka.shape, va.shape, "k", "v")
        k_stride, v_stride, k_off, v_off = kt.stride, vt.stride, kt.offset, vt.offset
        bt, bt_stride, _ = _block_table(block_table, batch, queue)
        if nk > bt.shape[1] * kt.seq:
            raise InvalidArgumentError(
                f"max_seqlen_k is {nk} but a block_table row reaches {bt.shape[1]} blocks of {kt.seq} keys"
            )
        desc.block_table, desc.block_table_stride = bt.base_data, bt_stride
        desc.block_size, desc.num_blocks = kt.seq, kt.batch
        kv_heads = kt.heads
        keep.append(bt)
        call.wait_on(bt)
        lens_limit = nk
        if seqused_k is None:
            if cu_seqlens_k is None:
                raise InvalidArgumentError("a paged cache needs the key counts: pass seqused_k (or cu_seqlens_k)")
            cu_k, cu_k_host = _index(cu_seqlens_k, "cu_seqlens_k", 1, queue)
            if cu_k.shape[0] != batch + 1:
                raise InvalidArgumentError(
                    f"cu_seqlens_k has {cu_k.shape[0]} entries and cu_seqlens_q {batch + 1}; they must be alike"
                )
            _check_cu(cu_k_host, "cu_seqlens_k", _INT32_MAX, nk, "max_seqlen_k")
            # The library takes a paged sequence's key count, not offsets: the differences, on the device when
            # the offsets are there (pyopencl waits on cu_k's events and puts its own on the result).
            seqused_k = np.diff(cu_k_host) if cu_k_host is not None else cu_k[1:] - cu_k[:-1]
    desc.num_kv_heads = kv_heads
    desc.k_stride, desc.v_stride, desc.k_offset, desc.v_offset = k_stride, v_stride, k_off, v_off
    if seqused_k is not None:
        lens, lens_host = _index(seqused_k, "seqused_k", 1, queue)
        if lens.shape[0] != batch:
            raise InvalidArgumentError(f"seqused_k has {lens.shape[0]} entries; it must have one per sequence ({batch})")
        if lens_host is not None and ((lens_host < 0).any() or (lens_host > lens_limit).any()):
            raise InvalidArgumentError(
                f"seqused_k is {lens_host.tolist()}; each must be in [0, max_seqlen_k] and within its sequence's keys"
            )
        desc.seqlens_k = lens.base_data
        keep.append(lens)
        call.wait_on(lens)
    keep.append(_modifiers(desc, call, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                           mask=mask, sinks=sinks))
    if out is None:
        out = cla.empty(queue, qa.shape, qa.dtype)
    oa, o_stride, o_off = _packed(out, "out", "[total_q, heads, head_dim]")
    _check_dtype_same("out", oa, qa, "q")
    if oa.shape != qa.shape:
        raise InvalidArgumentError(f"out has shape {oa.shape}; it must have q's, {qa.shape}")
    desc.o_stride, desc.o_offset = o_stride, o_off
    lse_arr = None
    if return_lse or return_softmax_lse or return_attn_probs or lse is not None:
        lse_arr = _packed_lse(lse, H, total_q, queue)
    res = _enqueue(desc, call, qa, ka, va, oa, lse_arr, keep, wait_for, context)
    if return_attn_probs:
        return res[0], res[1], None
    return res


def _packed_lse(lse: Optional[cla.Array], heads: int, total_q: int, queue: cl.CommandQueue) -> cla.Array:
    shape = (heads, total_q)
    if lse is None:
        return cla.empty(queue, shape, np.float32)
    lse = _array(lse, "lse")
    if lse.dtype != np.float32 or tuple(lse.shape) != shape or not lse.flags.c_contiguous or lse.offset:
        raise InvalidArgumentError(
            f"lse must be a contiguous float32 array of shape {shape} at offset 0; it is {lse.dtype} {lse.shape}"
            f" strides {lse.strides} offset {lse.offset}"
        )
    return lse


def flash_attn_with_kvcache(
    q: cla.Array,
    k_cache: cla.Array,
    v_cache: cla.Array,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Any = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    sinks: Any = None,
    mask: Optional[cla.Array] = None,
    return_lse: bool = False,
    out: Optional[cla.Array] = None,
    lse: Optional[cla.Array] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[cla.Array, cla.Array]]:
    """FlashAttention 2's ``flash_attn_with_kvcache`` on PyOpenCL arrays, attention only: queries against a
    dense or paged KV cache (decode, speculative decoding, chunked prefill), forward only.

    Args:
        q: [batch, seqlen_q, heads, head_dim], any strides with head_dim contiguous.
        k_cache, v_cache: dense [batch, seqlen_cache, kv_heads, head_dim], or with ``block_table`` paged
            [num_blocks, block_size, kv_heads, head_dim]; any strides with head_dim contiguous.
        cache_seqlens: sequence b attends to its first cache_seqlens[b] keys: an int (every sequence), an
            int32 pyopencl array [batch] at offset 0, or host integers (checked, uploaded). None: the whole
            cache (seqlen_cache keys; with a block table, max_blocks_per_seq * block_size).
        block_table: int32 [batch, max_blocks_per_seq], as in :func:`flash_attn_varlen_func`.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as :func:`flash_attn_func`; query row i of
            sequence b sits at key position i + cache_seqlens[b] - seqlen_q (bottom-right aligned, as
            FlashAttention).
        num_splits: ignored (the library chooses its split-KV).
        return_softmax_lse / return_lse: return (out, lse), lse float32 [batch, heads, seqlen_q].
        sinks, mask: as :func:`attention` (mask [batch, heads, seqlen_q, seqlen_cache or the table's reach]).
        out, lse, queue, wait_for, context: as :func:`attention`.

    The launch is sized for the cache's capacity; when sequences are much shorter than a wide block table,
    :func:`flash_attn_varlen_func` with ``block_table``, ``seqused_k`` and a tight ``max_seqlen_k`` sizes it
    to the longest.

    Raises:
        UnsupportedError: ``k``/``v`` (append the new tokens with :func:`reshape_and_cache` first, then count
            them in cache_seqlens), ``rotary_cos``/``rotary_sin``, ``cache_batch_idx``, ``cache_leftpad``.
        InvalidArgumentError: wrong types, dtypes or shapes, or the library's validation.
    """
    for name, val in (("k", k), ("v", v)):
        if val is not None:
            raise UnsupportedError(
                f"{name} (appending new tokens) is not supported here: write them with flashcl.reshape_and_cache "
                "first, then pass cache_seqlens that count them"
            )
    for name, val in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                      ("cache_leftpad", cache_leftpad)):
        if val is not None:
            raise UnsupportedError(f"{name} is not supported by flashcl")
    qt = _tensor(q, "q", "bshd")
    queue = _queue_of(queue, qt.array)
    call = _Call(queue)
    call.wait_on(qt.array)
    B, H, D = qt.batch, qt.heads, qt.dim
    keep: List[Any] = []
    if block_table is None:
        kt, vt = _tensor(k_cache, "k_cache", "bshd"), _tensor(v_cache, "v_cache", "bshd")
        if kt.batch != B:
            raise InvalidArgumentError(
                f"q has batch {B} but k_cache has {kt.batch} (cache_batch_idx is not supported: index the cache yourself)"
            )
        seqlen_k = kt.seq
    else:
        kt, vt = _paged_cache(k_cache, "k_cache"), _paged_cache(v_cache, "v_cache")
        bt, bt_stride, _ = _block_table(block_table, B, queue)
        seqlen_k = bt.shape[1] * kt.seq
        keep.append(bt)
        call.wait_on(bt)
    for name, t in (("k_cache", kt), ("v_cache", vt)):
        _check_dtype_same(name, t.array, qt.array, "q")
    _shapes_agree(H, D, kt.heads, kt.dim, kt.array.shape, vt.array.shape, "k_cache", "v_cache")
    if seqlen_k > _INT32_MAX:
        raise InvalidArgumentError(f"the cache holds {seqlen_k} keys per sequence; flashcl takes fewer than 2^31")
    desc = Descriptor(batch=B, num_heads=H, num_kv_heads=kt.heads, seqlen_q=qt.seq, seqlen_k=seqlen_k, head_dim=D,
                      dtype=qt.array.dtype, scale=_scale(softmax_scale), causal=bool(causal), q_stride=qt.stride,
                      k_stride=kt.stride, v_stride=vt.stride, q_offset=qt.offset, k_offset=kt.offset,
                      v_offset=vt.offset)
    call.wait_on(kt.array, vt.array)
    if block_table is not None:
        desc.block_table, desc.block_table_stride = bt.base_data, bt_stride
        desc.block_size, desc.num_blocks = kt.seq, kt.batch
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, (bool, np.bool_)):
            cache_seqlens = np.full(B, int(cache_seqlens), np.int64)
        lens, lens_host = _index(cache_seqlens, "cache_seqlens", 1, queue)
        if lens.shape[0] != B:
            raise InvalidArgumentError(f"cache_seqlens has {lens.shape[0]} entries; it must have one per sequence ({B})")
        _check_lens(lens_host, "cache_seqlens", seqlen_k, "the cache's capacity")
        desc.seqlens_k = lens.base_data
        keep.append(lens)
        call.wait_on(lens)
    keep.append(_modifiers(desc, call, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                           mask=mask, sinks=sinks))
    if out is None:
        out = cla.empty(queue, qt.array.shape, qt.array.dtype)
    ot = _tensor(out, "out", "bshd")
    _check_dtype_same("out", ot.array, qt.array, "q")
    if ot.array.shape != qt.array.shape:
        raise InvalidArgumentError(f"out has shape {ot.array.shape}; it must have q's, {qt.array.shape}")
    desc.o_stride, desc.o_offset = ot.stride, ot.offset
    lse_arr = _lse_array(lse, desc, queue) if (return_lse or return_softmax_lse or lse is not None) else None
    return _enqueue(desc, call, qt.array, kt.array, vt.array, ot.array, lse_arr, keep, wait_for, context)


__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache"]
