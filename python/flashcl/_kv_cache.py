"""The paged KV cache append (fcl_kv_cache_append): buffer level, and vLLM's reshape_and_cache_flash on arrays."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import _lib
from ._core import Context, _event, _int64, _resolve, _wait_list, check, explicit_strides, fcl_dtype, mem_handle
from .errors import InvalidArgumentError


@dataclass
class KVAppendDescriptor:
    """fcl_kv_append_desc, field for field (include/flashcl.h, docs/api.md "Appending to a paged KV cache").

    Strides and offsets in elements. New rows: strides (token, head), zeros = packed [num_tokens, kv_heads,
    head_dim]. Pools: strides (block, head, row in block), zeros = [num_blocks, kv_heads, block_size, head_dim]."""

    num_tokens: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    dtype: Any = np.float16
    k_new_stride: Tuple[int, int] = (0, 0)
    v_new_stride: Tuple[int, int] = (0, 0)
    k_new_offset: int = 0
    v_new_offset: int = 0
    k_pool_stride: Tuple[int, int, int] = (0, 0, 0)
    v_pool_stride: Tuple[int, int, int] = (0, 0, 0)
    k_pool_offset: int = 0
    v_pool_offset: int = 0

    def to_c(self) -> _lib.fcl_kv_append_desc:
        c = _lib.fcl_kv_append_desc()
        for name in ("num_tokens", "num_kv_heads", "head_dim", "block_size", "num_blocks", "k_new_offset",
                     "v_new_offset", "k_pool_offset", "v_pool_offset"):
            setattr(c, name, _int64(getattr(self, name), name))
        for name, n in (("k_new_stride", 2), ("v_new_stride", 2), ("k_pool_stride", 3), ("v_pool_stride", 3)):
            value = tuple(getattr(self, name))
            if len(value) != n:
                raise InvalidArgumentError(f"{name} must have {n} entries, not {len(value)}")
            getattr(c, name)[:] = [_int64(x, name) for x in value]
        c.dtype = fcl_dtype(self.dtype)
        return c


def kv_cache_append(
    desc: KVAppendDescriptor,
    k_new: cl.Buffer,
    v_new: cl.Buffer,
    slots: cl.Buffer,
    k_pool: cl.Buffer,
    v_pool: cl.Buffer,
    *,
    queue: cl.CommandQueue,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> cl.Event:
    """fcl_kv_cache_append on buffers: token t's rows into the pools at slot ``slots[t]`` (int64); -1 and any
    slot outside [0, num_blocks * block_size) skip the token. Returns the event."""
    queue, context = _resolve(queue, context)
    c = desc.to_c()
    handles = [mem_handle(b, n) for b, n in ((k_new, "k_new"), (v_new, "v_new"), (slots, "slots"),
                                             (k_pool, "k_pool"), (v_pool, "v_pool"))]
    n, wait = _wait_list(wait_for)
    ev = ctypes.c_void_p()
    check(context._lib.fcl_kv_cache_append(context.handle, queue.int_ptr, ctypes.byref(c), *handles, n, wait,
                                           ctypes.byref(ev)))
    return _event(ev)


def _strides(a: cla.Array, name: str) -> Tuple[Tuple[int, ...], int]:
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides) or a.offset % isz:
        raise InvalidArgumentError(f"{name}'s strides and offset must be whole elements")
    st = tuple(s // isz for s in a.strides)
    if any(s < 0 for s in st):
        raise InvalidArgumentError(f"{name} has a negative stride ({a.strides})")
    if a.shape[-1] > 1 and st[-1] != 1:
        raise InvalidArgumentError(f"{name}'s last dimension (head_size) must be contiguous")
    return st, a.offset // isz


def reshape_and_cache(
    key: cla.Array,
    value: cla.Array,
    key_cache: cla.Array,
    value_cache: cla.Array,
    slot_mapping: cla.Array,
    *,
    layout: str = "nhd",
    queue: Optional[cl.CommandQueue] = None,
    wait_for: Optional[Sequence[cl.Event]] = None,
    context: Optional[Context] = None,
) -> cl.Event:
    """vLLM's ``reshape_and_cache_flash`` (kv_cache_dtype "auto"): ``key``, ``value`` [num_tokens, kv_heads,
    head_size] (any strides, head_size contiguous) into ``key_cache``, ``value_cache`` [num_blocks, block_size,
    kv_heads, head_size] (``layout="nhd"``; ``"hnd"``: [num_blocks, kv_heads, block_size, head_size]) at
    ``slot_mapping`` (int64 [num_tokens], contiguous; -1 skips). The caches may be views of one buffer
    (vLLM's kv_cache[0], kv_cache[1]). The event is added to the caches' ``events`` and returned."""
    if layout not in ("nhd", "hnd"):
        raise InvalidArgumentError(f"layout must be 'nhd' or 'hnd', not {layout!r}")
    for a, n in ((key, "key"), (value, "value"), (key_cache, "key_cache"), (value_cache, "value_cache"),
                 (slot_mapping, "slot_mapping")):
        if not isinstance(a, cla.Array):
            raise InvalidArgumentError(f"{n} must be a pyopencl.array.Array, not {type(a).__name__}")
    if key.ndim != 3 or value.shape != key.shape:
        raise InvalidArgumentError(f"key and value must be [num_tokens, kv_heads, head_size]; they are {key.shape}, {value.shape}")
    if key_cache.ndim != 4 or value_cache.shape != key_cache.shape:
        raise InvalidArgumentError(f"key_cache and value_cache must be 4-D and alike; they are {key_cache.shape}, {value_cache.shape}")
    if not (key.dtype == value.dtype == key_cache.dtype == value_cache.dtype):
        raise InvalidArgumentError("key, value, key_cache and value_cache must have one dtype")
    if slot_mapping.dtype != np.int64 or slot_mapping.shape != (key.shape[0],) or not slot_mapping.flags.c_contiguous \
            or slot_mapping.offset:
        raise InvalidArgumentError(f"slot_mapping must be a contiguous int64 array of shape ({key.shape[0]},) at offset 0")
    T, H, D = key.shape
    if layout == "nhd":
        nb, bs, ch, cd = key_cache.shape
        order = (0, 2, 1)
    else:
        nb, ch, bs, cd = key_cache.shape
        order = (0, 1, 2)
    if (ch, cd) != (H, D):
        raise InvalidArgumentError(f"key_cache {key_cache.shape} does not hold {H} heads of {D} ({layout})")
    if T == 0:  # an empty array has no buffer to pass: nothing to write, an event all the same
        fcl_dtype(key.dtype)
        _strides(key_cache, "key_cache")
        _strides(value_cache, "value_cache")
        queue = queue or key_cache.queue
        if queue is None:
            raise InvalidArgumentError("no queue: pass queue=, or caches that have one")
        ev = cl.enqueue_marker(queue, wait_for=list(wait_for or ()) + list(key_cache.events) + list(value_cache.events)
                               or None)
        key_cache.add_event(ev)
        if value_cache is not key_cache:
            value_cache.add_event(ev)
        return ev
    ks, ko = _strides(key, "key")
    vs, vo = _strides(value, "value")
    kcs, kco = _strides(key_cache, "key_cache")
    vcs, vco = _strides(value_cache, "value_cache")
    fix = explicit_strides
    desc = KVAppendDescriptor(
        num_tokens=T, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=nb, dtype=key.dtype,
        k_new_stride=fix(ks[:2], (T, H)), v_new_stride=fix(vs[:2], (T, H)), k_new_offset=ko, v_new_offset=vo,
        k_pool_stride=fix(tuple(kcs[i] for i in order), (nb, H, bs)),
        v_pool_stride=fix(tuple(vcs[i] for i in order), (nb, H, bs)), k_pool_offset=kco, v_pool_offset=vco)
    queue = queue or key_cache.queue
    events = list(wait_for or ()) + [e for a in (key, value, key_cache, value_cache, slot_mapping) for e in a.events]
    ev = kv_cache_append(desc, key.base_data, value.base_data, slot_mapping.base_data, key_cache.base_data,
                         value_cache.base_data, queue=queue, wait_for=events, context=context)
    key_cache.add_event(ev)
    if value_cache is not key_cache:
        value_cache.add_event(ev)
    return ev


__all__ = ["KVAppendDescriptor", "kv_cache_append", "reshape_and_cache"]
