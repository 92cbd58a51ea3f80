"""The buffer-level layer: contexts, the descriptor, and one function per library operation.

These map one to one onto include/flashcl.h and take plain ``pyopencl.Buffer`` objects with explicit
sizes, strides and offsets (in elements), as the C API does. The array-level functions in
:mod:`flashcl._attention` build a :class:`Descriptor` from arrays and call these.
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import pyopencl as cl

from . import _lib
from .errors import FlashclError, InvalidArgumentError, error_for_status

Stride3 = Tuple[int, int, int]

# ---- dtypes ----


def _bfloat16_dtype() -> Optional[np.dtype]:
    try:
        import ml_dtypes  # type: ignore[import-not-found]
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def fcl_dtype(dtype: Any, what: str = "dtype") -> int:
    """The FCL_DTYPE_* code of a NumPy dtype: float32, float16, and bfloat16 as ``ml_dtypes.bfloat16`` or
    as ``uint16`` (the bits of bfloat16 values). Raises :class:`InvalidArgumentError` for any other."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"{what} {dtype!r} is not a dtype") from None
    if dt == np.float32:
        return _lib.FCL_DTYPE_F32
    if dt == np.float16:
        return _lib.FCL_DTYPE_F16
    if dt == np.uint16 or dt.name == "bfloat16":
        return _lib.FCL_DTYPE_BF16
    raise InvalidArgumentError(
        f"{what} is {dt}; flashcl takes float32, float16, or bfloat16 (ml_dtypes.bfloat16, or uint16 holding its bits)"
    )


# ---- errors ----


def _message() -> str:
    raw = _lib.load().fcl_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(status: int) -> None:
    """Raises the exception of a non-zero fcl_status, with fcl_last_error()'s message (same thread)."""
    if status != _lib.FCL_SUCCESS:
        raise error_for_status(status, _message())


def version() -> str:
    """The loaded library's version, "major.minor.patch" (fcl_version())."""
    return _lib.load().fcl_version().decode()


def status_string(status: int) -> str:
    """fcl_status_string(): the name of a status."""
    return _lib.load().fcl_status_string(int(status)).decode()


# ---- contexts ----


class Context:
    """An fcl_context: flashcl's state (device probe, compiled kernels) for one OpenCL context and device.

    Most code never makes one: every operation takes ``context=None`` and then uses
    :func:`default_context` for its queue's context and device. Make one to choose the options::

        ctx = flashcl.Context(cl_ctx, device, cache_dir="", portable_only=True)

    ``cache_dir``: None uses $FLASHCL_CACHE_DIR, else $XDG_CACHE_HOME/flashcl, else ~/.cache/flashcl;
    "" turns the on-disk kernel cache off. ``build_options`` is appended to every kernel build.
    ``portable_only`` never picks a vendor-specific kernel. The context is released by :meth:`release`,
    at the end of a ``with`` block, or when it is garbage-collected.
    """

    def __init__(
        self,
        context: cl.Context,
        device: Optional[cl.Device] = None,
        *,
        cache_dir: Optional[str] = None,
        build_options: Optional[str] = None,
        portable_only: bool = False,
    ) -> None:
        self._handle: Optional[int] = None
        if not isinstance(context, cl.Context):
            raise InvalidArgumentError(f"context must be a pyopencl.Context, not {type(context).__name__}")
        if device is None:
            devices = context.devices
            if len(devices) != 1:
                raise InvalidArgumentError(f"the context has {len(devices)} devices; pass device=")
            device = devices[0]
        if not isinstance(device, cl.Device):
            raise InvalidArgumentError(f"device must be a pyopencl.Device, not {type(device).__name__}")
        lib = _lib.load()
        self._lib = lib
        self.cl_context = context
        self.device = device
        opts = _lib.fcl_context_options(
            cache_dir.encode() if cache_dir is not None else None,
            build_options.encode() if build_options is not None else None,
            _lib.FCL_FLAG_PORTABLE_ONLY if portable_only else 0,
        )
        handle = ctypes.c_void_p()
        check(lib.fcl_context_create(context.int_ptr, device.int_ptr, ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle.value

    @property
    def handle(self) -> int:
        """The fcl_context pointer; raises once released."""
        if self._handle is None:
            raise InvalidArgumentError("this flashcl.Context has been released")
        return self._handle

    def release(self) -> None:
        """fcl_context_release(); further use raises. Calling it twice is harmless."""
        if self._handle is not None:
            self._lib.fcl_context_release(self._handle)
            self._handle = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def describe_plan(self, desc: "Descriptor", backward: bool = False) -> Dict[str, Any]:
        """fcl_describe_plan(): the kernel, tiles and launch the forward (or backward) would use for desc."""
        info = _lib.fcl_plan_info()
        c = desc.to_c()
        op = _lib.FCL_OP_BACKWARD if backward else _lib.FCL_OP_FORWARD
        check(self._lib.fcl_describe_plan(self.handle, op, ctypes.byref(c), ctypes.byref(info)))
        return {
            "kernel": info.kernel.decode(),
            "reason": info.reason.decode(),
            "block_q": info.block_q,
            "block_k": info.block_k,
            "work_group_size": info.work_group_size,
            "local_mem_bytes": info.local_mem_bytes,
            "work_groups": info.work_groups,
            "splits": info.splits,
        }

    def cache_stats(self) -> Dict[str, Any]:
        """fcl_context_cache_stats(): where this context's kernels came from."""
        s = _lib.fcl_cache_stats()
        check(self._lib.fcl_context_cache_stats(self.handle, ctypes.byref(s)))
        out = {name: getattr(s, name) for name, _ in _lib.fcl_cache_stats._fields_}
        for name in ("cache_dir", "cache_refused"):
            raw = getattr(s, name)
            out[name] = raw.decode("utf-8", "replace") if raw else None
        return out

    def device_quirks(self) -> Dict[str, Any]:
        """fcl_context_device_quirks(): measured driver properties planning respects (loop budget, profiling
        clock). ``source`` is "unknown", "measured", "cached" or "forced"."""
        r = _lib.fcl_device_quirks()
        check(self._lib.fcl_context_device_quirks(self.handle, ctypes.byref(r)))
        sources = {_lib.FCL_QUIRK_UNKNOWN: "unknown", _lib.FCL_QUIRK_MEASURED: "measured",
                   _lib.FCL_QUIRK_CACHED: "cached", _lib.FCL_QUIRK_FORCED: "forced"}
        return {
            "loop_budget": r.loop_budget,
            "profiling_clock_unusable": r.profiling_clock_unusable,
            "source": sources.get(r.source, str(r.source)),
            "detail": r.detail.decode("utf-8", "replace"),
        }

    def tune_forward(self, desc: "Descriptor", queue: cl.CommandQueue) -> Dict[str, Any]:
        """fcl_tune_forward(): times the portable forward's candidate shapes for desc's head_dim and dtype on
        this device and records the winner when it beats the default. ``queue`` needs
        ``PROFILING_ENABLE``. Blocks until done (seconds)."""
        if not isinstance(queue, cl.CommandQueue):
            raise InvalidArgumentError(f"queue must be a pyopencl.CommandQueue, not {type(queue).__name__}")
        r = _lib.fcl_tune_result()
        c = desc.to_c()
        check(self._lib.fcl_tune_forward(self.handle, queue.int_ptr, ctypes.byref(c), ctypes.byref(r)))
        out = {name: getattr(r, name) for name, _ in _lib.fcl_tune_result._fields_}
        out["shape"], out["default_shape"] = r.shape.decode(), r.default_shape.decode()
        out["recorded"], out["saved"], out["wall_clock"] = bool(r.recorded), bool(r.saved), bool(r.wall_clock)
        return out

    def forward_workspace_size(self, desc: "Descriptor") -> int:
        """fcl_attention_forward_workspace_size(): bytes of split-KV scratch the forward needs for desc on
        this device (0 when it does not split)."""
        c = desc.to_c()
        return int(self._lib.fcl_attention_forward_workspace_size(self.handle, ctypes.byref(c)))

    def backward_workspace_size(self, desc: "Descriptor") -> int:
        """fcl_attention_backward_workspace_size(): bytes of workspace the backward needs for desc."""
        c = desc.to_c()
        return int(self._lib.fcl_attention_backward_workspace_size(self.handle, ctypes.byref(c)))


def explicit_strides(strides: Tuple[int, ...], counts: Tuple[int, ...]) -> Tuple[int, ...]:
    """Strides as the C API reads them, where all zeros means "packed": a size-1 dimension's stride is never
    used, so a zero there becomes 1; zeros left on every dimension would be a broadcast, which it cannot say."""
    if any(strides):
        return tuple(strides)
    if all(c == 1 for c in counts):
        return tuple(1 for _ in strides)
    out = tuple(1 if c == 1 else 0 for s, c in zip(strides, counts))
    if not any(out):
        raise InvalidArgumentError(f"strides {strides} broadcast one row; pass a materialized array")
    return out


_contexts: Dict[Tuple[int, int], Context] = {}
_contexts_lock = threading.Lock()


def default_context(queue: cl.CommandQueue) -> Context:
    """The shared :class:`Context` of a queue's OpenCL context and device, made on first use and kept for
    the life of the process (the fcl_context retains the cl_context, so the key cannot be reused)."""
    key = (queue.context.int_ptr, queue.device.int_ptr)
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = Context(queue.context, queue.device)
            _contexts[key] = ctx
        return ctx


# ---- the descriptor ----


@dataclass
class Descriptor:
    """fcl_attention_desc, field for field (see include/flashcl.h and docs/api.md).

    Strides and offsets are in elements; all-zero strides mean contiguous [batch, heads, seq, head_dim].
    ``dtype`` and ``mask_dtype`` are NumPy dtypes (float32, float16, bfloat16/uint16). ``alibi_slopes``,
    ``mask``, ``sinks``, ``d_sinks`` and the int32 index buffers ``cu_seqlens_q``, ``cu_seqlens_k``,
    ``seqlens_k``, ``block_table`` (packed and paged sequences, forward only) are ``pyopencl.Buffer``
    objects or None. ``scale`` 0 means 1/sqrt(head_dim).
    """

    batch: int
    num_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    num_kv_heads: int = 0
    dtype: Any = np.float32
    scale: float = 0.0
    causal: bool = False
    q_stride: Stride3 = (0, 0, 0)
    k_stride: Stride3 = (0, 0, 0)
    v_stride: Stride3 = (0, 0, 0)
    o_stride: Stride3 = (0, 0, 0)
    q_offset: int = 0
    k_offset: int = 0
    v_offset: int = 0
    o_offset: int = 0
    softcap: float = 0.0
    alibi_slopes: Optional[cl.Buffer] = None
    alibi_batch_stride: int = 0
    alibi_offset: int = 0
    mask: Optional[cl.Buffer] = None
    mask_dtype: Any = np.float32
    mask_stride: Stride3 = (0, 0, 0)
    mask_offset: int = 0
    window: bool = False
    window_left: int = -1
    window_right: int = -1
    sinks: Optional[cl.Buffer] = None
    d_sinks: Optional[cl.Buffer] = None
    cu_seqlens_q: Optional[cl.Buffer] = None
    total_q: int = 0
    cu_seqlens_k: Optional[cl.Buffer] = None
    total_k: int = 0
    seqlens_k: Optional[cl.Buffer] = None
    block_table: Optional[cl.Buffer] = None
    block_table_stride: int = 0
    block_size: int = 0
    num_blocks: int = 0

    def to_c(self) -> _lib.fcl_attention_desc:
        """The ctypes struct. Integers out of int64 range raise :class:`InvalidArgumentError`."""
        c = _lib.fcl_attention_desc()
        try:
            for name in ("batch", "num_heads", "num_kv_heads", "seqlen_q", "seqlen_k", "head_dim",
                         "q_offset", "k_offset", "v_offset", "o_offset", "alibi_batch_stride",
                         "alibi_offset", "mask_offset", "window_left", "window_right", "total_q", "total_k",
                         "block_table_stride", "block_size", "num_blocks"):
                setattr(c, name, _int64(getattr(self, name), name))
            for name in ("q_stride", "k_stride", "v_stride", "o_stride", "mask_stride"):
                value = tuple(getattr(self, name))
                if len(value) != 3:
                    raise InvalidArgumentError(f"{name} must have 3 entries (batch, head, row), not {len(value)}")
                getattr(c, name)[:] = [_int64(x, name) for x in value]
        except (TypeError, OverflowError) as e:
            raise InvalidArgumentError(str(e)) from None
        c.dtype = fcl_dtype(self.dtype)
        c.mask_dtype = fcl_dtype(self.mask_dtype, "mask_dtype")
        c.scale = float(self.scale)
        c.softcap = float(self.softcap)
        # The fields are float32, where 0 means the default scale and no softcap: a value that rounds to 0 there
        # would silently become those.
        for name in ("scale", "softcap"):
            if float(getattr(self, name)) != 0.0 and getattr(c, name) == 0.0:
                raise InvalidArgumentError(
                    f"{name} {getattr(self, name)!r} rounds to 0 in float32, which the library reads as "
                    + ("the default 1/sqrt(head_dim)" if name == "scale" else "no softcap")
                )
        c.causal = 1 if self.causal else 0
        c.window = 1 if self.window else 0
        c.alibi_slopes = mem_handle(self.alibi_slopes, "alibi_slopes")
        c.mask = mem_handle(self.mask, "mask")
        c.sinks = mem_handle(self.sinks, "sinks")
        c.d_sinks = mem_handle(self.d_sinks, "d_sinks")
        for name in ("cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "block_table"):
            setattr(c, name, mem_handle(getattr(self, name), name))
        return c


def _int64(x: Any, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, not {type(x).__name__}")
    x = int(x)
    if not -(2**63) <= x < 2**63:
        raise InvalidArgumentError(f"{name} = {x} is outside int64")
    return x


def mem_handle(buf: Any, name: str) -> Optional[int]:
    """The cl_mem of a pyopencl Buffer (or of an offset-0 pyopencl.array.Array); None stays None."""
    if buf is None:
        return None
    if isinstance(buf, cl.MemoryObjectHolder):
        return buf.int_ptr
    import pyopencl.array as cla

    if isinstance(buf, cla.Array):
        if buf.base_data is None:
            raise InvalidArgumentError(f"{name} is an empty array")
        if buf.offset != 0:
            raise InvalidArgumentError(
                f"{name} is an array at byte offset {buf.offset}; pass its base_data and the offset in the descriptor"
            )
        return buf.base_data.int_ptr
    raise InvalidArgumentError(f"{name} must be a pyopencl.Buffer, not {type(buf).__name__}")


def _wait_list(wait_for: Optional[Sequence[cl.Event]]) -> Tuple[int, Any]:
    events = []
    for i, e in enumerate(wait_for or ()):
        if not isinstance(e, cl.Event):
            raise InvalidArgumentError(f"wait_for[{i}] must be a pyopencl.Event, not {type(e).__name__}")
        events.append(e.int_ptr)
    if not events:
        return 0, None
    return len(events), (_lib.cl_event * len(events))(*events)


def _resolve(queue: Any, context: Optional[Context]) -> Tuple[cl.CommandQueue, Context]:
    if not isinstance(queue, cl.CommandQueue):
        raise InvalidArgumentError(f"queue must be a pyopencl.CommandQueue, not {type(queue).__name__}")
    if context is None:
        context = default_context(queue)
    elif not isinstance(context, Context):
        raise InvalidArgumentError(f"context must be a flashcl.Context, not {type(context).__name__}")
    return queue, context


def _event(ptr: ctypes.c_void_p) -> cl.Event:
    return cl.Event.from_int_ptr(ptr.value, retain=False)


def forward(
    desc: Descriptor,
    q: cl.Buffer,
    k: cl.Buffer,
    v: cl.Buffer,
    o: cl.Buffer,
    lse: Optional[cl.Buffer] = None,
    *,
    queue: cl.CommandQueue,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
    reference: bool = False,
    workspace: Optional[cl.Buffer] = None,
) -> cl.Event:
    """fcl_attention_forward (or fcl_attention_reference when ``reference``) on buffers.

    ``workspace``: split-KV scratch of at least :func:`forward_workspace_size` bytes
    (fcl_attention_forward_with_workspace); None takes it from the context (one buffer per queue, reused).
    Enqueues on ``queue`` after the events of ``wait_for`` and returns the event that completes when o
    (and lse) are written; nothing waits on the host.
    """
    queue, context = _resolve(queue, context)
    c = desc.to_c()
    handles = [mem_handle(b, n) for b, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"))]
    n, wait = _wait_list(wait_for)
    ev = ctypes.c_void_p()
    lib = context._lib
    if reference:
        if workspace is not None:
            raise InvalidArgumentError("the reference path takes no workspace")
        st = lib.fcl_attention_reference(context.handle, queue.int_ptr, ctypes.byref(c), *handles, n, wait,
                                         ctypes.byref(ev))
    elif workspace is not None:
        st = lib.fcl_attention_forward_with_workspace(context.handle, queue.int_ptr, ctypes.byref(c), *handles,
                                                      mem_handle(workspace, "workspace"), n, wait, ctypes.byref(ev))
    else:
        st = lib.fcl_attention_forward(context.handle, queue.int_ptr, ctypes.byref(c), *handles, n, wait,
                                       ctypes.byref(ev))
    check(st)
    return _event(ev)


def forward_workspace_size(desc: Descriptor, *, queue: cl.CommandQueue, context: Optional[Context] = None) -> int:
    """fcl_attention_forward_workspace_size() on the context of ``queue`` (or ``context``)."""
    queue, context = _resolve(queue, context)
    return context.forward_workspace_size(desc)


def merge(
    desc: Descriptor,
    num_parts: int,
    o_parts: cl.Buffer,
    parts_stride: int,
    lse_parts: cl.Buffer,
    o: cl.Buffer,
    lse: Optional[cl.Buffer] = None,
    *,
    queue: cl.CommandQueue,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> cl.Event:
    """fcl_attention_merge: the exact result from partial results over disjoint key sets of the same queries.

    Part i's O lies in ``o_parts`` laid out as o (``desc.o_stride``), from element
    ``desc.o_offset + i * parts_stride``; its lse at ``lse_parts[i * batch * num_heads * seqlen_q + row]``
    (float32). ``desc.sinks`` are added here, once. Returns the event.
    """
    queue, context = _resolve(queue, context)
    c = desc.to_c()
    num_parts = _int64(num_parts, "num_parts")
    if not 0 <= num_parts < 2**32:
        raise InvalidArgumentError(f"num_parts = {num_parts} does not fit a cl_uint")
    n, wait = _wait_list(wait_for)
    ev = ctypes.c_void_p()
    check(context._lib.fcl_attention_merge(
        context.handle, queue.int_ptr, ctypes.byref(c), num_parts, mem_handle(o_parts, "o_parts"),
        _int64(parts_stride, "parts_stride"), mem_handle(lse_parts, "lse_parts"), mem_handle(o, "o"),
        mem_handle(lse, "lse"), n, wait, ctypes.byref(ev)))
    return _event(ev)


def reference(desc: Descriptor, q: cl.Buffer, k: cl.Buffer, v: cl.Buffer, o: cl.Buffer,
              lse: Optional[cl.Buffer] = None, *, queue: cl.CommandQueue,
              wait_for: Optional[Sequence[cl.Event]] = None, context: Optional[Context] = None) -> cl.Event:
    """fcl_attention_reference: the same result as :func:`forward` through the materialized N x N matrix."""
    return forward(desc, q, k, v, o, lse, queue=queue, wait_for=wait_for, context=context, reference=True)


def backward_workspace_size(desc: Descriptor, *, queue: cl.CommandQueue, context: Optional[Context] = None) -> int:
    """fcl_attention_backward_workspace_size() on the context of ``queue`` (or ``context``)."""
    queue, context = _resolve(queue, context)
    return context.backward_workspace_size(desc)


def backward(
    desc: Descriptor,
    q: cl.Buffer,
    k: cl.Buffer,
    v: cl.Buffer,
    o: cl.Buffer,
    lse: cl.Buffer,
    d_o: cl.Buffer,
    d_q: cl.Buffer,
    d_k: cl.Buffer,
    d_v: cl.Buffer,
    workspace: Optional[cl.Buffer] = None,
    *,
    queue: cl.CommandQueue,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> cl.Event:
    """fcl_attention_backward on buffers; ``desc.d_sinks`` (optional) receives dL/dsinks.

    ``workspace`` None allocates one of :func:`backward_workspace_size` bytes for this call (OpenCL keeps
    it alive until the enqueued work is done). Returns the event of the last command.
    """
    queue, context = _resolve(queue, context)
    c = desc.to_c()
    if workspace is None:
        size = context.backward_workspace_size(desc)
        # 0 is also what an invalid descriptor gives: the backward call below then reports why.
        if size > 0:
            workspace = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, size)
    handles = [
        mem_handle(b, name)
        for b, name in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"), (d_o, "d_o"),
                        (d_q, "d_q"), (d_k, "d_k"), (d_v, "d_v"), (workspace, "workspace"))
    ]
    n, wait = _wait_list(wait_for)
    ev = ctypes.c_void_p()
    check(context._lib.fcl_attention_backward(context.handle, queue.int_ptr, ctypes.byref(c), *handles, n, wait,
                                              ctypes.byref(ev)))
    return _event(ev)


def scale_default(head_dim: int) -> float:
    """The scale flashcl uses when none is given: 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


__all__ = [
    "Context", "Descriptor", "default_context", "forward", "forward_workspace_size", "merge", "reference", "backward",
    "backward_workspace_size", "version", "status_string", "fcl_dtype", "FlashclError",
]
