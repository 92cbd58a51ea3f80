"""The array-level functions: attention on pyopencl.array.Array objects, shaped like PyTorch's
scaled_dot_product_attention and FlashAttention's flash_attn_func.

Shapes, dtypes and layouts are read from the arrays and checked here before the library is called
(wrong ones raise :class:`flashcl.InvalidArgumentError`); strides and offsets go to the library as they
are, so no input is copied. Outputs are new arrays unless given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import _core
from ._core import Context, Descriptor
from .errors import InvalidArgumentError, UnsupportedError

Layout = str  # "bshd" (batch, seq, heads, head_dim) or "bhsd" (batch, heads, seq, head_dim)
_LAYOUTS = ("bshd", "bhsd")


@dataclass
class _Tensor:
    """A 4-D array seen as the library sees it."""

    array: cla.Array
    batch: int
    seq: int
    heads: int
    dim: int
    stride: Tuple[int, int, int]  # elements, (batch, head, row)
    offset: int  # elements


def _check_dtype_same(name: str, a: cla.Array, ref: cla.Array, ref_name: str) -> None:
    if a.dtype != ref.dtype:
        raise InvalidArgumentError(f"{name} has dtype {a.dtype} but {ref_name} has {ref.dtype}; they must match")


def _elements(nbytes: int, itemsize: int, what: str) -> int:
    if nbytes % itemsize:
        raise InvalidArgumentError(f"{what} is {nbytes} bytes, not a whole number of {itemsize}-byte elements")
    return nbytes // itemsize


def _array(x: Any, name: str) -> cla.Array:
    if not isinstance(x, cla.Array):
        raise InvalidArgumentError(f"{name} must be a pyopencl.array.Array, not {type(x).__name__}")
    if x.size == 0 or x.base_data is None:
        raise InvalidArgumentError(f"{name} is empty (shape {x.shape})")
    return x


def _tensor(x: Any, name: str, layout: Layout) -> _Tensor:
    a = _array(x, name)
    if a.ndim != 4:
        raise InvalidArgumentError(
            f"{name} has {a.ndim} dimensions (shape {a.shape}); it must be 4-D, "
            + ("[batch, seq, heads, head_dim]" if layout == "bshd" else "[batch, heads, seq, head_dim]")
        )
    _core.fcl_dtype(a.dtype, f"{name}'s dtype")
    isz = a.dtype.itemsize
    st = [_elements(s, isz, f"a stride of {name}") for s in a.strides]
    if any(s < 0 for s in st):
        raise InvalidArgumentError(f"{name} has a negative stride ({a.strides}); flashcl takes non-negative strides")
    off = _elements(a.offset, isz, f"the offset of {name}")
    if layout == "bshd":
        b, s, h, d = a.shape
        stride = (st[0], st[2], st[1])
    else:
        b, h, s, d = a.shape
        stride = (st[0], st[1], st[2])
    if d > 1 and st[3] != 1:
        raise InvalidArgumentError(
            f"{name}'s head_dim elements are not contiguous (strides {a.strides} bytes for shape {a.shape}); "
            "flashcl needs each row's head_dim elements next to each other"
        )
    try:  # the library reads three zero strides as "contiguous"
        stride = _core.explicit_strides(stride, (b, h, s))
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{name}: {e}") from None
    return _Tensor(a, b, s, h, d, stride, off)


def _same_layout(a: _Tensor, ref: _Tensor, name: str, ref_name: str) -> None:
    """a is laid out as ref: the same shape and offset, and the same strides where a dimension has more than one
    element (a size-1 dimension's stride addresses nothing)."""
    counts = (ref.batch, ref.heads, ref.seq)
    strides_differ = any(n > 1 and x != y for n, x, y in zip(counts, a.stride, ref.stride))
    if a.array.shape != ref.array.shape or strides_differ or a.offset != ref.offset:
        raise InvalidArgumentError(
            f"{name} must have {ref_name}'s shape, strides and offset (shape {ref.array.shape}, strides "
            f"{ref.array.strides}, offset {ref.array.offset} bytes); it has shape {a.array.shape}, strides "
            f"{a.array.strides}, offset {a.array.offset}"
        )


def _like(t: _Tensor, name: str, queue: cl.CommandQueue) -> cla.Array:
    """A new array with t's shape, dtype, strides and offset (the backward writes gradients in their input's
    layout). Contiguous inputs give contiguous gradients; an input that broadcasts (a zero stride over more than
    one element) has no such layout for an output."""
    if any(n > 1 and s == 0 for n, s in zip((t.batch, t.heads, t.seq), t.stride)):
        raise InvalidArgumentError(
            f"{name} broadcasts (strides {t.array.strides} bytes for shape {t.array.shape}): the backward writes its "
            f"gradient in its layout, which would overlap itself; pass a materialized {name}"
        )
    a = t.array
    if a.flags.c_contiguous and a.offset == 0:
        return cla.empty(queue, a.shape, a.dtype)
    isz = a.dtype.itemsize
    last = sum((n - 1) * s for n, s in zip(a.shape, a.strides)) + a.offset + isz
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, last)
    return cla.Array(queue, a.shape, a.dtype, data=buf, offset=a.offset, strides=a.strides)


def _float_vector(x: Any, name: str, shapes: Sequence[Tuple[int, ...]], queue: cl.CommandQueue) -> cla.Array:
    """A float32 device array from a pyopencl array or a host array-like (uploaded: these are [heads] or
    [batch, heads] sized)."""
    if not isinstance(x, cla.Array):
        host = np.asarray(x)
        if host.dtype.kind not in "fiu":
            raise InvalidArgumentError(f"{name} must hold numbers, not {host.dtype}")
        x = cla.to_device(queue, np.ascontiguousarray(host, dtype=np.float32))
    _array(x, name)
    if x.dtype != np.float32:
        raise InvalidArgumentError(f"{name} has dtype {x.dtype}; it must be float32")
    if tuple(x.shape) not in [tuple(s) for s in shapes]:
        raise InvalidArgumentError(
            f"{name} has shape {x.shape}; it must be " + " or ".join(str(tuple(s)) for s in shapes)
        )
    if x.shape[-1] > 1 and x.strides[-1] != 4:
        raise InvalidArgumentError(f"{name}'s last dimension must be contiguous (strides {x.strides})")
    if x.offset % 4:
        raise InvalidArgumentError(f"{name}'s offset ({x.offset} bytes) is not a whole number of float32")
    return x


class _Call:
    """The pieces of one call: descriptor, buffers, events."""

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue = queue
        self.events: List[cl.Event] = []

    def wait_on(self, *arrays: Optional[cla.Array]) -> None:
        for a in arrays:
            if a is not None:
                self.events.extend(a.events)


def _queue_of(queue: Optional[cl.CommandQueue], *arrays: cla.Array) -> cl.CommandQueue:
    if queue is None:
        queue = arrays[0].queue
        if queue is None:
            raise InvalidArgumentError("the arrays have no queue; pass queue=")
    if not isinstance(queue, cl.CommandQueue):
        raise InvalidArgumentError(f"queue must be a pyopencl.CommandQueue, not {type(queue).__name__}")
    return queue


def _modifiers(
    desc: Descriptor,
    call: _Call,
    *,
    window_size: Tuple[int, int],
    softcap: float,
    alibi_slopes: Any,
    mask: Any,
    sinks: Any,
) -> Tuple[Optional[cla.Array], Optional[cla.Array]]:
    """Fills desc's modifier fields; returns the (device) sinks array, and the slopes (kept alive)."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"window_size must be a pair of integers (left, right), not {window_size!r}") from None
    if left < -1 or right < -1:
        raise InvalidArgumentError(f"window_size is {window_size!r}; each side must be -1 (unbounded) or >= 0")
    if left >= 0 or right >= 0:
        desc.window, desc.window_left, desc.window_right = True, left, right
    try:
        desc.softcap = float(softcap or 0.0)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"softcap must be a number, not {softcap!r}") from None
    B, H = desc.batch, desc.num_heads
    slopes = None
    if alibi_slopes is not None:
        slopes = _float_vector(alibi_slopes, "alibi_slopes", [(H,), (B, H)], call.queue)
        desc.alibi_slopes = slopes.base_data
        desc.alibi_offset = slopes.offset // 4
        desc.alibi_batch_stride = slopes.strides[0] // 4 if slopes.ndim == 2 and B > 1 else 0
        call.wait_on(slopes)
    if mask is not None:
        m = _array(mask, "mask")
        if m.dtype == np.bool_:
            raise InvalidArgumentError(
                "mask is boolean; flashcl takes an additive float mask (0 where a key is visible, -inf where it "
                "is hidden): e.g. pyopencl.array.if_positive(...) or build it as float32"
            )
        desc.mask_dtype = m.dtype
        _core.fcl_dtype(m.dtype, "mask's dtype")
        target = (B, H, desc.seqlen_q, desc.seqlen_k)
        if not 2 <= m.ndim <= 4:
            raise InvalidArgumentError(f"mask has shape {m.shape}; it must broadcast to {target} (2 to 4 dimensions)")
        shape = (1,) * (4 - m.ndim) + tuple(m.shape)
        strides = (0,) * (4 - m.ndim) + tuple(m.strides)
        isz = m.dtype.itemsize
        if shape[3] != desc.seqlen_k:
            raise InvalidArgumentError(
                f"mask has shape {m.shape}; its last dimension must be seqlen_k = {desc.seqlen_k} (keys are not broadcast)"
            )
        if desc.seqlen_k > 1 and strides[3] != isz:
            raise InvalidArgumentError(f"mask's last dimension must be contiguous (strides {m.strides})")
        st = []
        for i in range(3):
            if shape[i] == target[i]:
                st.append(_elements(strides[i], isz, "a stride of mask") if target[i] > 1 else 0)
            elif shape[i] == 1:
                st.append(0)
            else:
                raise InvalidArgumentError(f"mask has shape {m.shape}; it does not broadcast to {target}")
        if any(s < 0 for s in st):
            raise InvalidArgumentError(f"mask has a negative stride ({m.strides})")
        desc.mask = m.base_data
        desc.mask_stride = (st[0], st[1], st[2])
        desc.mask_offset = _elements(m.offset, isz, "mask's offset")
        call.wait_on(m)
    s = None
    if sinks is not None:
        s = _float_vector(sinks, "sinks", [(H,)], call.queue)
        desc.sinks = s.base_data
        if s.offset:
            raise InvalidArgumentError("sinks must start at the beginning of its buffer (offset 0)")
        call.wait_on(s)
    return s, slopes


def _describe(
    q: _Tensor, k: _Tensor, v: _Tensor, *, scale: Optional[float], causal: bool
) -> Descriptor:
    for name, t in (("k", k), ("v", v)):
        _check_dtype_same(name, t.array, q.array, "q")
    if (k.batch, k.seq, k.heads, k.dim) != (v.batch, v.seq, v.heads, v.dim):
        raise InvalidArgumentError(f"k and v must have the same shape; they have {k.array.shape} and {v.array.shape}")
    if k.batch != q.batch:
        raise InvalidArgumentError(f"q has batch {q.batch} but k and v have {k.batch}")
    if k.dim != q.dim:
        raise InvalidArgumentError(f"q has head_dim {q.dim} but k and v have {k.dim}")
    if q.heads % k.heads:
        raise InvalidArgumentError(
            f"q has {q.heads} heads and k, v have {k.heads}: the K/V head count must divide the query's (GQA/MQA)"
        )
    if scale is not None:
        scale = float(scale)
        if scale == 0.0:
            raise InvalidArgumentError("scale=0 is not supported (the library reads 0 as the default); pass None for 1/sqrt(head_dim)")
    return Descriptor(
        batch=q.batch, num_heads=q.heads, num_kv_heads=k.heads, seqlen_q=q.seq, seqlen_k=k.seq, head_dim=q.dim,
        dtype=q.array.dtype, scale=0.0 if scale is None else scale, causal=bool(causal),
        q_stride=q.stride, k_stride=k.stride, v_stride=v.stride, q_offset=q.offset, k_offset=k.offset,
        v_offset=v.offset,
    )


def _lse_array(lse: Optional[cla.Array], desc: Descriptor, queue: cl.CommandQueue, name: str = "lse") -> cla.Array:
    shape = (desc.batch, desc.num_heads, desc.seqlen_q)
    if lse is None:
        return cla.empty(queue, shape, np.float32)
    lse = _array(lse, name)
    if lse.dtype != np.float32 or tuple(lse.shape) != shape or not lse.flags.c_contiguous or lse.offset:
        raise InvalidArgumentError(
            f"{name} must be a contiguous float32 array of shape {shape} at offset 0; it is {lse.dtype} {lse.shape}"
            f" strides {lse.strides} offset {lse.offset}"
        )
    return lse


def attention(
    q: cla.Array,
    k: cla.Array,
    v: cla.Array,
    *,
    layout: Layout = "bshd",
    causal: bool = False,
    scale: Optional[float] = None,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    mask: Optional[cla.Array] = None,
    sinks: Any = None,
    return_lse: bool = False,
    out: Optional[cla.Array] = None,
    lse: Optional[cla.Array] = None,
    reference: bool = False,
    workspace: Optional[cl.Buffer] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[cla.Array, cla.Array]]:
    """Exact attention ``softmax(scale * q k^T + modifiers) v`` on PyOpenCL arrays.

    Args:
        q: [batch, seqlen_q, heads, head_dim] (``layout="bshd"``) or [batch, heads, seqlen_q, head_dim]
            (``"bhsd"``); float32, float16 or bfloat16 (``ml_dtypes.bfloat16`` or ``uint16`` bits). Any
            strides whose head_dim elements are contiguous, any offset: views of a packed tensor work.
        k, v: the same layout with seqlen_k rows and kv_heads heads; kv_heads divides heads (GQA, MQA).
        causal: key j visible to query i iff j <= i + seqlen_k - seqlen_q (bottom-right aligned).
        scale: None for 1/sqrt(head_dim).
        window_size: (left, right) as FlashAttention 2: key j visible iff p - left <= j <= p + right with
            p = i + seqlen_k - seqlen_q; -1 is unbounded. With ``causal``, right is 0.
        softcap: > 0: scores become softcap * tanh(score / softcap).
        alibi_slopes: float32 [heads] or [batch, heads] (a pyopencl array, or host values that are uploaded):
            score -= slope * |p - j|.
        mask: additive float mask (float32, float16 or bfloat16) broadcastable to
            [batch, heads, seqlen_q, seqlen_k]; size-1 dimensions broadcast (stride 0); the last
            dimension is seqlen_k and contiguous. -inf hides a key.
        sinks: float32 [heads]: one logit per head added to each row's softmax denominator.
        return_lse: also return the float32 [batch, heads, seqlen_q] natural-log sum-exp of each row.
        out, lse: arrays to write into (out: q's shape and dtype, any row-contiguous strides; lse:
            contiguous float32); allocated when None.
        reference: run fcl_attention_reference (the materialized N x N matrix, through CLBlast).
        workspace: a ``pyopencl.Buffer`` of at least :func:`flashcl.forward_workspace_size` bytes for the
            split-KV partials (fcl_attention_forward_with_workspace); None: the context's per-queue scratch.
        queue: defaults to q's queue. wait_for: events to wait on, besides the ``events`` of every array
            passed. context: a :class:`flashcl.Context`; defaults to the queue's shared one.

    Returns:
        out, or (out, lse). Nothing is waited for on the host: the call's event is added to
        ``out.events`` (and ``lse.events``), so pyopencl operations and flashcl calls on them wait for it;
        ``out.events[-1]`` is the event.

    Raises:
        InvalidArgumentError: wrong types, shapes, dtypes or layouts (checked before anything is enqueued),
            or the library's own validation. UnsupportedError, BuildError, OpenCLError,
            OutOfResourcesError, CLBlastError: from the library, with its message.
    """
    if layout not in _LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
    qt, kt, vt = _tensor(q, "q", layout), _tensor(k, "k", layout), _tensor(v, "v", layout)
    queue = _queue_of(queue, qt.array)
    desc = _describe(qt, kt, vt, scale=scale, causal=causal)
    call = _Call(queue)
    call.wait_on(qt.array, kt.array, vt.array)
    keep = _modifiers(desc, call, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, mask=mask,
                      sinks=sinks)
    if out is None:
        out = cla.empty(queue, qt.array.shape, qt.array.dtype)
    ot = _tensor(out, "out", layout)
    _check_dtype_same("out", ot.array, qt.array, "q")
    if ot.array.shape != qt.array.shape:
        raise InvalidArgumentError(f"out has shape {ot.array.shape}; it must have q's, {qt.array.shape}")
    desc.o_stride, desc.o_offset = ot.stride, ot.offset
    lse_arr = _lse_array(lse, desc, queue) if (return_lse or lse is not None) else None
    return _enqueue(desc, call, qt.array, kt.array, vt.array, out, lse_arr, keep, wait_for, context,
                    reference=reference, workspace=workspace)


def _enqueue(
    desc: Descriptor,
    call: _Call,
    q: cla.Array,
    k: cla.Array,
    v: cla.Array,
    out: cla.Array,
    lse_arr: Optional[cla.Array],
    keep: Any,
    wait_for: Optional[Sequence[cl.Event]],
    context: Optional[Context],
    reference: bool = False,
    workspace: Any = None,
) -> Union[cla.Array, Tuple[cla.Array, cla.Array]]:
    """The forward (or reference) call on a filled descriptor: waits on every input's and output's events and
    puts the call's event on out and lse."""
    call.wait_on(out, lse_arr)
    event = _core.forward(
        desc, q.base_data, k.base_data, v.base_data, out.base_data, lse_arr.base_data if lse_arr is not None else None,
        queue=call.queue, wait_for=list(wait_for or []) + call.events, context=context, reference=reference,
        workspace=workspace,
    )
    del keep  # buffers uploaded for the call (slopes, sinks, index arrays) live until the enqueued work is done
    out.add_event(event)
    if lse_arr is not None:
        lse_arr.add_event(event)
        return out, lse_arr
    return out


def attention_backward(
    dout: cla.Array,
    q: cla.Array,
    k: cla.Array,
    v: cla.Array,
    out: cla.Array,
    lse: cla.Array,
    *,
    layout: Layout = "bshd",
    causal: bool = False,
    scale: Optional[float] = None,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    mask: Optional[cla.Array] = None,
    sinks: Any = None,
    dq: Optional[cla.Array] = None,
    dk: Optional[cla.Array] = None,
    dv: Optional[cla.Array] = None,
    d_sinks: Optional[cla.Array] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Tuple[cla.Array, ...]:
    """Gradients of :func:`attention` (fcl_attention_backward): deterministic, O(N) memory.

    ``out`` and ``lse`` come from the forward (``return_lse=True``) with the same arguments; pass the same
    modifiers. ``dout`` must have out's shape, strides and offset; dq, dk, dv (allocated when None) get
    q's, k's and v's. With GQA, dk and dv of a K/V head sum over the query heads that read it.

    Returns:
        (dq, dk, dv), and d_sinks (float32 [heads], summed over batch and rows) as a fourth element when
        ``sinks`` is given. The event is added to each output's ``events``.
    """
    if layout not in _LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
    qt, kt, vt = _tensor(q, "q", layout), _tensor(k, "k", layout), _tensor(v, "v", layout)
    queue = _queue_of(queue, qt.array)
    desc = _describe(qt, kt, vt, scale=scale, causal=causal)
    call = _Call(queue)
    call.wait_on(qt.array, kt.array, vt.array)
    keep = _modifiers(desc, call, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, mask=mask,
                      sinks=sinks)
    ot, dot = _tensor(out, "out", layout), _tensor(dout, "dout", layout)
    for name, t in (("out", ot), ("dout", dot)):
        _check_dtype_same(name, t.array, qt.array, "q")
        if t.array.shape != qt.array.shape:
            raise InvalidArgumentError(f"{name} has shape {t.array.shape}; it must have q's, {qt.array.shape}")
    _same_layout(dot, ot, "dout", "out")
    desc.o_stride, desc.o_offset = ot.stride, ot.offset
    lse = _lse_array(_array(lse, "lse"), desc, queue)
    grads = []
    for name, g, t in (("dq", dq, qt), ("dk", dk, kt), ("dv", dv, vt)):
        if g is None:
            g = _like(t, name[1:], queue)
        gt = _tensor(g, name, layout)
        _check_dtype_same(name, gt.array, t.array, name[1:])
        _same_layout(gt, t, name, name[1:])
        grads.append(gt.array)
    ds = None
    if sinks is not None:
        if d_sinks is None:
            d_sinks = cla.empty(queue, (desc.num_heads,), np.float32)
        ds = _float_vector(d_sinks, "d_sinks", [(desc.num_heads,)], queue)
        if ds.offset:
            raise InvalidArgumentError("d_sinks must start at the beginning of its buffer (offset 0)")
        desc.d_sinks = ds.base_data
    elif d_sinks is not None:
        raise InvalidArgumentError("d_sinks is given but sinks is not")
    call.wait_on(ot.array, dot.array, lse, *grads, ds)
    event = _core.backward(
        desc, qt.array.base_data, kt.array.base_data, vt.array.base_data, ot.array.base_data, lse.base_data,
        dot.array.base_data, grads[0].base_data, grads[1].base_data, grads[2].base_data,
        queue=queue, wait_for=list(wait_for or []) + call.events, context=context,
    )
    del keep
    for g in grads:
        g.add_event(event)
    if ds is not None:
        ds.add_event(event)
        return grads[0], grads[1], grads[2], ds
    return grads[0], grads[1], grads[2]


def flash_attn_func(
    q: cla.Array,
    k: cla.Array,
    v: cla.Array,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Any = None,
    return_lse: bool = False,
    out: Optional[cla.Array] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[Any, ...]]:
    """FlashAttention 2's ``flash_attn_func`` on PyOpenCL arrays: q [batch, seqlen_q, heads, head_dim], k and v
    [batch, seqlen_k, kv_heads, head_dim].

    The same arguments mean the same: ``softmax_scale`` (None: 1/sqrt(head_dim)), ``causal``
    (bottom-right aligned), ``window_size=(left, right)``, ``softcap``, ``alibi_slopes`` ([heads] or
    [batch, heads], float32). ``dropout_p`` must be 0 (flashcl has no dropout); ``deterministic`` is
    accepted and ignored (flashcl's backward is always deterministic). ``return_attn_probs=True`` returns
    (out, lse, None), as FlashAttention does without dropout; ``return_lse=True`` returns (out, lse).
    ``sinks`` (float32 [heads]) adds one logit per head to each softmax denominator. See :func:`attention`
    for events and errors.
    """
    if dropout_p:
        raise UnsupportedError(f"dropout_p is {dropout_p}; flashcl has no dropout")
    res = attention(
        q, k, v, layout="bshd", causal=causal, scale=softmax_scale, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=sinks, return_lse=return_lse or return_attn_probs, out=out, queue=queue,
        wait_for=wait_for, context=context,
    )
    if return_attn_probs:
        return res[0], res[1], None
    return res


def scaled_dot_product_attention(
    query: cla.Array,
    key: cla.Array,
    value: cla.Array,
    attn_mask: Optional[cla.Array] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    return_lse: bool = False,
    out: Optional[cla.Array] = None,
    reference: bool = False,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[cla.Array, cla.Array]]:
    """PyTorch's ``torch.nn.functional.scaled_dot_product_attention`` on PyOpenCL arrays: query
    [batch, heads, L, head_dim], key and value [batch, kv_heads, S, head_dim].

    As in PyTorch: ``attn_mask`` is added to the scores (a float array broadcastable to
    [batch, heads, L, S]; boolean masks are refused, convert them to 0/-inf), ``is_causal`` is the
    top-left aligned mask (key j visible iff j <= i; for L > S this is flashcl's window (-1, L - S); L < S
    raises :class:`UnsupportedError`: use :func:`flash_attn_func`'s bottom-right ``causal`` or a mask),
    ``scale`` None is 1/sqrt(head_dim), different head counts need ``enable_gqa=True``. ``dropout_p``
    must be 0. ``return_lse=True`` returns (out, lse). See :func:`attention` for events and errors.
    """
    if dropout_p:
        raise UnsupportedError(f"dropout_p is {dropout_p}; flashcl has no dropout")
    if attn_mask is not None and is_causal:
        raise InvalidArgumentError("attn_mask and is_causal are both given; pass one (as PyTorch requires)")
    qa, ka = _array(query, "query"), _array(key, "key")
    if qa.ndim == 4 and ka.ndim == 4 and qa.shape[1] != ka.shape[1] and not enable_gqa:
        raise InvalidArgumentError(
            f"query has {qa.shape[1]} heads and key {ka.shape[1]}; pass enable_gqa=True for grouped-query attention"
        )
    window = (-1, -1)
    if is_causal and qa.ndim == 4 and ka.ndim == 4:
        L, S = qa.shape[2], ka.shape[2]
        if L > S:
            window = (-1, L - S)
        elif L < S:
            raise UnsupportedError(
                f"is_causal with L={L} < S={S} is PyTorch's top-left aligned mask, which flashcl's window cannot "
                "express; use flash_attn_func(causal=True) (bottom-right aligned) or an attn_mask"
            )
    return attention(
        query, key, value, layout="bhsd", causal=bool(is_causal) and window == (-1, -1), scale=scale,
        window_size=window, mask=attn_mask, return_lse=return_lse, out=out, reference=reference, queue=queue,
        wait_for=wait_for, context=context,
    )


def merge(
    o_parts: cla.Array,
    lse_parts: cla.Array,
    *,
    layout: Layout = "bshd",
    sinks: Any = None,
    return_lse: bool = False,
    out: Optional[cla.Array] = None,
    lse: Optional[cla.Array] = None,
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> Union[cla.Array, Tuple[cla.Array, cla.Array]]:
    """Merges attention over disjoint key sets of the same queries into the exact result
    (fcl_attention_merge: ring attention across devices, shared-prefix cascades).

    Args:
        o_parts: [num_parts, batch, seqlen_q, heads, head_dim] (``layout="bshd"``; ``"bhsd"``: heads before
            seqlen_q in each part), one part per key set, e.g. the outputs of :func:`attention` written into
            ``o_parts[i]`` (``out=``). Each part's head_dim elements contiguous; any other strides.
        lse_parts: contiguous float32 [num_parts, batch, heads, seqlen_q]: each part's lse.
        sinks: float32 [heads], added here once (compute the parts without them).
        out: the result, laid out as one part (same strides and offset as ``o_parts[0]``); allocated when
            None. lse / return_lse: the merged lse, float32 [batch, heads, seqlen_q].

    A part whose lse is -inf for a row (it saw no key there) is left out of that row. Returns out, or
    (out, lse); the event is added to their ``events``.
    """
    if layout not in _LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
    parts = _array(o_parts, "o_parts")
    if parts.ndim != 5:
        raise InvalidArgumentError(f"o_parts has shape {parts.shape}; it must be 5-D: [num_parts] + one part's 4-D shape")
    num_parts = parts.shape[0]
    part0 = _tensor(parts[0], "o_parts[0]", layout)
    parts_stride = _elements(parts.strides[0], parts.dtype.itemsize, "o_parts' first stride")
    queue = _queue_of(queue, parts)
    desc = Descriptor(batch=part0.batch, num_heads=part0.heads, seqlen_q=part0.seq, seqlen_k=1, head_dim=part0.dim,
                      dtype=parts.dtype, o_stride=part0.stride, o_offset=part0.offset)
    lp = _array(lse_parts, "lse_parts")
    want = (num_parts, part0.batch, part0.heads, part0.seq)
    if lp.dtype != np.float32 or tuple(lp.shape) != want or not lp.flags.c_contiguous or lp.offset:
        raise InvalidArgumentError(
            f"lse_parts must be a contiguous float32 array of shape {want} at offset 0; it is {lp.dtype} {lp.shape}"
            f" strides {lp.strides} offset {lp.offset}"
        )
    call = _Call(queue)
    call.wait_on(parts, lp)
    s = None
    if sinks is not None:
        s = _float_vector(sinks, "sinks", [(part0.heads,)], queue)
        if s.offset:
            raise InvalidArgumentError("sinks must start at the beginning of its buffer (offset 0)")
        desc.sinks = s.base_data
        call.wait_on(s)
    if out is None:
        out = _like(part0, "o_parts[0]", queue)
    ot = _tensor(out, "out", layout)
    _check_dtype_same("out", ot.array, parts, "o_parts")
    _same_layout(ot, part0, "out", "o_parts[0]")
    lse_arr = _lse_array(lse, desc, queue) if (return_lse or lse is not None) else None
    call.wait_on(out, lse_arr)
    event = _core.merge(
        desc, num_parts, parts.base_data, parts_stride, lp.base_data, ot.array.base_data,
        lse_arr.base_data if lse_arr is not None else None,
        queue=queue, wait_for=list(wait_for or []) + call.events, context=context,
    )
    out.add_event(event)
    if lse_arr is not None:
        lse_arr.add_event(event)
        return out, lse_arr
    return out
