"""Wrong dtypes, shapes and layouts raise the documented exceptions, with the status and a message that names
what is wrong; the library's own refusals come back as exceptions carrying fcl_last_error()'s text."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import flashcl
from flashcl import Status


def _arrays(queue, shape_q=(1, 16, 2, 8), shape_kv=(1, 16, 2, 8), dt=np.float32):
    rng = np.random.default_rng(0)
    return [cla.to_device(queue, rng.standard_normal(s).astype(dt)) for s in (shape_q, shape_kv, shape_kv)]


def test_hierarchy():
    for cls, st, base in [
        (flashcl.InvalidArgumentError, Status.INVALID_ARGUMENT, ValueError),
        (flashcl.UnsupportedError, Status.UNSUPPORTED, NotImplementedError),
        (flashcl.OpenCLError, Status.OPENCL, RuntimeError),
        (flashcl.BuildError, Status.BUILD, RuntimeError),
        (flashcl.OutOfResourcesError, Status.OUT_OF_RESOURCES, MemoryError),
        (flashcl.CLBlastError, Status.CLBLAST, RuntimeError),
    ]:
        assert issubclass(cls, flashcl.FlashclError) and issubclass(cls, base)
        e = flashcl.errors.error_for_status(int(st), "msg")
        assert type(e) is cls and e.status == st and e.message == "msg"
        assert flashcl.status_string(int(st)).startswith("FCL_ERROR_")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda qq, kk, vv, queue: [cla.to_device(queue, x.get().astype(np.float64)) for x in (qq, kk, vv)], "float64"),
        (lambda qq, kk, vv, queue: (qq, cla.to_device(queue, kk.get().astype(np.float16)), vv), "dtype float16 but q has float32"),
        (lambda qq, kk, vv, queue: (qq.reshape(16, 2, 8), kk, vv), "3 dimensions"),
        (lambda qq, kk, vv, queue: (qq, kk, vv[:, :8]), "same shape"),
        (lambda qq, kk, vv, queue: (qq.get(), kk, vv), "pyopencl.array.Array"),
        (lambda qq, kk, vv, queue: (qq, kk, cla.empty(queue, (1, 0, 2, 8), np.float32)), "empty"),
    ],
    ids=["float64", "mixed-dtypes", "3d", "kv-shapes", "numpy-input", "empty"],
)
def test_bad_inputs(queue, make, match):
    q, k, v = make(*_arrays(queue), queue)
    with pytest.raises(flashcl.InvalidArgumentError, match=match) as e:
        flashcl.flash_attn_func(q, k, v)
    assert e.value.status == Status.INVALID_ARGUMENT


def test_head_dim_not_contiguous(queue):
    q, k, v = _arrays(queue, (1, 16, 2, 16), (1, 16, 2, 16))
    with pytest.raises(flashcl.InvalidArgumentError, match="not contiguous"):
        flashcl.flash_attn_func(q[..., ::2], k[..., ::2], v[..., ::2])


def test_heads_do_not_divide(queue):
    q, k, v = _arrays(queue, (1, 16, 3, 8), (1, 16, 2, 8))
    with pytest.raises(flashcl.InvalidArgumentError, match="must divide"):
        flashcl.flash_attn_func(q, k, v)


def test_batch_and_head_dim_mismatch(queue):
    q, k, v = _arrays(queue, (2, 16, 2, 8), (1, 16, 2, 8))
    with pytest.raises(flashcl.InvalidArgumentError, match="batch"):
        flashcl.flash_attn_func(q, k, v)
    q, k, v = _arrays(queue, (1, 16, 2, 16), (1, 16, 2, 8))
    with pytest.raises(flashcl.InvalidArgumentError, match="head_dim"):
        flashcl.flash_attn_func(q, k, v)


def test_bad_modifiers(queue):
    q, k, v = _arrays(queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="boolean"):
        flashcl.attention(q, k, v, mask=cla.zeros(queue, (16, 16), np.bool_))
    with pytest.raises(flashcl.InvalidArgumentError, match="does not broadcast"):
        flashcl.attention(q, k, v, mask=cla.zeros(queue, (3, 1, 16, 16), np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="last dimension must be seqlen_k"):
        flashcl.attention(q, k, v, mask=cla.zeros(queue, (16, 1), np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="alibi_slopes has shape"):
        flashcl.attention(q, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="sinks has dtype"):
        flashcl.attention(q, k, v, sinks=cla.zeros(queue, (2,), np.float16))
    with pytest.raises(flashcl.InvalidArgumentError, match="window_size"):
        flashcl.attention(q, k, v, window_size=(-2, 0))
    with pytest.raises(flashcl.InvalidArgumentError, match="scale=0"):
        flashcl.attention(q, k, v, scale=0.0)
    with pytest.raises(flashcl.InvalidArgumentError, match="layout"):
        flashcl.attention(q, k, v, layout="sbhd")


def test_library_refusals(queue):
    """Checks the bindings leave to the library: its status and message come through."""
    q, k, v = _arrays(queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="softcap") as e:
        flashcl.attention(q, k, v, softcap=-1.0)
    assert e.value.status == Status.INVALID_ARGUMENT and "desc->softcap" in e.value.message
    big = _arrays(queue, (1, 4, 1, 300), (1, 4, 1, 300))
    with pytest.raises(flashcl.UnsupportedError, match="head_dim") as e:
        flashcl.flash_attn_func(*big)
    assert e.value.status == Status.UNSUPPORTED
    # An output that overlaps itself: the library's overlap check.
    o = cla.empty(queue, (1, 16, 2, 8), np.float32)
    view = cla.Array(queue, (1, 16, 2, 8), np.float32, data=o.base_data, strides=(0, 32, 0, 4))
    with pytest.raises(flashcl.InvalidArgumentError, match="overlap"):
        flashcl.flash_attn_func(q, k, v, out=view)


def test_buffer_level_errors(queue):
    desc = flashcl.Descriptor(batch=0, num_heads=2, seqlen_q=4, seqlen_k=4, head_dim=8)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4096)
    with pytest.raises(flashcl.InvalidArgumentError, match="desc->batch is 0"):
        flashcl.forward(desc, buf, buf, buf, buf, queue=queue)
    desc.batch = 64  # now the buffers are too small
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4096)
    with pytest.raises(flashcl.InvalidArgumentError, match="too small"):
        flashcl.forward(desc, buf, buf, buf, out, queue=queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="pyopencl.Buffer"):
        flashcl.forward(desc, 12345, buf, buf, out, queue=queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="wait_for"):
        flashcl.forward(desc, buf, buf, buf, out, queue=queue, wait_for=[None])
    with pytest.raises(flashcl.InvalidArgumentError, match="dtype"):
        flashcl.Descriptor(batch=1, num_heads=1, seqlen_q=1, seqlen_k=1, head_dim=1, dtype=np.int32).to_c()


def test_unsupported_features(queue):
    q, k, v = _arrays(queue, (1, 8, 2, 8), (1, 16, 2, 8))
    with pytest.raises(flashcl.UnsupportedError, match="dropout"):
        flashcl.flash_attn_func(q, k, v, dropout_p=0.1)
    qb, kb, vb = (x.transpose((0, 2, 1, 3)) for x in (q, k, v))
    with pytest.raises(flashcl.UnsupportedError, match="top-left"):
        flashcl.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
    with pytest.raises(flashcl.InvalidArgumentError, match="enable_gqa"):
        flashcl.scaled_dot_product_attention(qb, kb[:, :1], vb[:, :1])


def test_backward_layout_rules(queue):
    q, k, v = _arrays(queue)
    out, lse = flashcl.flash_attn_func(q, k, v, return_lse=True)
    bad_do = cla.zeros(queue, (1, 2, 16, 8), np.float32).transpose((0, 2, 1, 3))
    with pytest.raises(flashcl.InvalidArgumentError, match="dout must have out's shape, strides"):
        flashcl.attention_backward(bad_do, q, k, v, out, lse)
    with pytest.raises(flashcl.InvalidArgumentError, match="lse must be"):
        flashcl.attention_backward(out, q, k, v, out, cla.zeros(queue, (1, 2, 15), np.float32))
    with pytest.raises(flashcl.InvalidArgumentError, match="d_sinks is given"):
        flashcl.attention_backward(out, q, k, v, out, lse, d_sinks=cla.zeros(queue, (2,), np.float32))


def test_released_context(queue):
    ctx = flashcl.Context(queue.context, queue.device, cache_dir="")
    ctx.release()
    ctx.release()
    q, k, v = _arrays(queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="released"):
        flashcl.flash_attn_func(q, k, v, context=ctx)


def test_library_not_found(tmp_path):
    env = dict(os.environ, FLASHCL_LIBRARY=str(tmp_path / "nowhere.so"))
    code = (
        "import flashcl\n"
        "try:\n    flashcl.version()\n"
        "except flashcl.LibraryNotFoundError as e:\n    print('not found:', 'FLASHCL_LIBRARY' in str(e))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "not found: True"


def test_library_from_folder():
    """FLASHCL_LIBRARY may name the folder that holds the library."""
    import flashcl._lib as lib

    folder = os.path.dirname(flashcl.library_path())
    env = dict(os.environ, FLASHCL_LIBRARY=folder)
    code = "import flashcl; print(flashcl.library_path())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert os.path.dirname(r.stdout.strip()) == folder
    assert os.path.basename(r.stdout.strip()) in lib._SONAMES


def test_tiny_scale_and_softcap(queue):
    """Values that round to 0 in the descriptor's float32 fields would read as the default scale and no softcap."""
    q, k, v = _arrays(queue)
    with pytest.raises(flashcl.InvalidArgumentError, match="scale 1e-46 rounds to 0 in float32"):
        flashcl.attention(q, k, v, scale=1e-46)
    with pytest.raises(flashcl.InvalidArgumentError, match="softcap 1e-46 rounds to 0 in float32"):
        flashcl.attention(q, k, v, softcap=1e-46)


def test_broadcast_rows(queue):
    """One K/V row broadcast over the batch by strides that are all zero (which the library reads as
    "contiguous") attends to that row in every batch; the backward, which writes dk and dv in k's and v's
    layout, refuses such inputs by name."""
    rng = np.random.default_rng(1)
    q = cla.to_device(queue, rng.standard_normal((2, 1, 1, 16)).astype(np.float32))
    rows = cla.to_device(queue, rng.standard_normal((4, 16)).astype(np.float32))
    kv = cla.Array(queue, (2, 1, 1, 16), np.float32, data=rows.base_data, strides=(0, 0, 0, 4))
    out = flashcl.flash_attn_func(q, kv, kv).get()
    np.testing.assert_allclose(out[:, 0, 0], np.repeat(rows.get()[:1], 2, axis=0), rtol=1e-6)
    o, lse = flashcl.flash_attn_func(q, kv, kv, return_lse=True)
    with pytest.raises(flashcl.InvalidArgumentError, match="k broadcasts"):
        flashcl.attention_backward(o, q, kv, kv, o, lse)


def test_gradient_layout_of_size_one_dimensions(queue):
    """Strides of dimensions of one element address nothing: a dout that differs from out only there is out's
    layout."""
    q, k, v = _arrays(queue, (1, 16, 1, 8), (1, 16, 1, 8))
    out, lse = flashcl.flash_attn_func(q, k, v, return_lse=True)
    dout = cla.to_device(queue, np.ones((1, 1, 16, 8), np.float32)).transpose((0, 2, 1, 3))
    dq, dk, dv = flashcl.attention_backward(dout, q, k, v, out, lse)
    assert np.isfinite(dq.get()).all() and np.isfinite(dk.get()).all() and np.isfinite(dv.get()).all()


def test_one_library_a_process():
    """load_library of another file than the one loaded is refused, so every call's message comes from the
    library that made it."""
    code = (
        "import shutil, tempfile, os, flashcl\n"
        "path = flashcl.library_path()\n"
        "copy = os.path.join(tempfile.mkdtemp(), 'libflashcl_copy.so')\n"
        "shutil.copy(path, copy)\n"
        "assert flashcl.load_library(path) is not None\n"
        "link = os.path.join(tempfile.mkdtemp(), 'libflashcl_link.so')\n"
        "os.symlink(path, link)\n"
        "assert flashcl.load_library(link) is not None  # the same file by another name\n"
        "try:\n    flashcl.load_library(copy)\n    print('loaded')\n"
        "except flashcl.InvalidArgumentError as e:\n    print('refused:', 'already loaded' in str(e))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "refused: True"
