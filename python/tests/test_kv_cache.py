"""fcl_kv_cache_append through flashcl.reshape_and_cache (vLLM's NHD and HND caches) and flashcl.kv_cache_append,
checked bit for bit against NumPy: written rows equal the new ones, every other cache element untouched."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import flashcl


def _bits(rng, shape, dtype):
    """Random bit patterns of dtype (NaN payloads, signed zeros, subnormals included)."""
    width = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * width, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def _slots(rng, tokens, num_slots):
    """Distinct valid slots in random order, with -1 and slots outside the cache among them."""
    s = rng.permutation(num_slots)[:tokens].astype(np.int64)
    s[rng.choice(tokens, size=min(4, tokens), replace=False)] = [-1, num_slots, -7, 2**62][: min(4, tokens)]
    return s


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16])  # uint16: bfloat16's bits
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_reshape_and_cache(queue, rng, dtype, layout):
    T, H, D, NB, BS = 37, 3, 40, 6, 16
    key, value = _bits(rng, (T, H, D), dtype), _bits(rng, (T, H, D), dtype)
    shape = (NB, BS, H, D) if layout == "nhd" else (NB, H, BS, D)
    kc, vc = _bits(rng, shape, dtype), _bits(rng, shape, dtype)
    slots = _slots(rng, T, NB * BS)
    d_kc, d_vc = cla.to_device(queue, kc), cla.to_device(queue, vc)
    flashcl.reshape_and_cache(cla.to_device(queue, key), cla.to_device(queue, value), d_kc, d_vc,
                              cla.to_device(queue, slots), layout=layout)
    for t, s in enumerate(slots):
        if 0 <= s < NB * BS:
            b, r = divmod(int(s), BS)
            for cache, new in ((kc, key), (vc, value)):
                if layout == "nhd":
                    cache[b, r] = new[t]
                else:
                    cache[b, :, r] = new[t]
    assert d_kc.get().tobytes() == kc.tobytes()
    assert d_vc.get().tobytes() == vc.tobytes()


def test_stacked_cache_and_strided_rows(queue, rng):
    """vLLM's kv_cache [2, num_blocks, block_size, H, D] as one buffer, and key/value as views of a QKV tensor."""
    T, HQ, H, D, NB, BS = 20, 4, 2, 8, 3, 8
    qkv = _bits(rng, (T, HQ + 2 * H, D), np.float16)
    kv = _bits(rng, (2, NB, BS, H, D), np.float16)
    slots = _slots(rng, T, NB * BS)
    d_qkv, d_kv = cla.to_device(queue, qkv), cla.to_device(queue, kv)
    flashcl.reshape_and_cache(d_qkv[:, HQ : HQ + H], d_qkv[:, HQ + H :], d_kv[0], d_kv[1], cla.to_device(queue, slots))
    for t, s in enumerate(slots):
        if 0 <= s < NB * BS:
            b, r = divmod(int(s), BS)
            kv[0, b, r], kv[1, b, r] = qkv[t, HQ : HQ + H], qkv[t, HQ + H :]
    assert d_kv.get().tobytes() == kv.tobytes()


def test_buffer_level_and_errors(queue, rng):
    T, H, D, NB, BS = 5, 2, 4, 2, 4
    mf = cl.mem_flags
    new = _bits(rng, (T, H, D), np.float32)
    pool = np.zeros((NB, H, BS, D), np.float32)
    slots = np.array([3, -1, 7, 100, 0], np.int64)
    bufs = [cl.Buffer(queue.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=x) for x in (new, new, slots, pool, pool)]
    desc = flashcl.KVAppendDescriptor(num_tokens=T, num_kv_heads=H, head_dim=D, block_size=BS, num_blocks=NB,
                                      dtype=np.float32)
    flashcl.kv_cache_append(desc, *bufs, queue=queue).wait()
    got = np.empty_like(pool)
    cl.enqueue_copy(queue, got, bufs[3])
    want = pool.copy()
    for t, s in enumerate(slots):
        if 0 <= s < NB * BS:
            want[s // BS, :, s % BS] = new[t]
    assert got.tobytes() == want.tobytes()
    # Refused before anything is enqueued, with the field named.
    desc.num_blocks = NB + 1
    with pytest.raises(flashcl.InvalidArgumentError, match="k_pool is too small"):
        flashcl.kv_cache_append(desc, *bufs, queue=queue)
    desc.num_blocks = NB
    with pytest.raises(flashcl.InvalidArgumentError, match="v_pool overlaps k_pool"):
        flashcl.kv_cache_append(desc, bufs[0], bufs[1], bufs[2], bufs[3], bufs[3], queue=queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="slot_mapping"):
        a = cla.to_device(queue, new)
        flashcl.reshape_and_cache(a, a, cla.to_device(queue, pool), cla.to_device(queue, pool),
                                  cla.to_device(queue, slots.astype(np.int32)), layout="hnd")


def test_no_tokens(queue):
    empty = cla.empty(queue, (0, 2, 8), np.float16)
    cache = cla.zeros(queue, (2, 4, 2, 8), np.float16)
    ev = flashcl.reshape_and_cache(empty, empty, cache, cache, cla.empty(queue, (0,), np.int64))
    ev.wait()
    assert ev.command_execution_status == cl.command_execution_status.COMPLETE
    assert ev in cache.events
    # An empty append is checked like any other: key heads the caches do not hold are refused.
    wrong = cla.empty(queue, (0, 3, 8), np.float16)
    with pytest.raises(flashcl.InvalidArgumentError, match="does not hold 3 heads"):
        flashcl.reshape_and_cache(wrong, wrong, cache, cache, cla.empty(queue, (0,), np.int64))
