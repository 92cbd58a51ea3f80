"""ctypes declarations of include/flashcl.h and the loading of libflashcl.

Every struct here mirrors the header field by field; python/tests/test_layout.py compiles a small C
program against the header and checks sizeof and every offset, so a header change that breaks these
declarations fails a test.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

# ---- enums (values as in include/flashcl.h) ----

FCL_SUCCESS = 0
FCL_ERROR_INVALID_ARGUMENT = 1
FCL_ERROR_UNSUPPORTED = 2
FCL_ERROR_OPENCL = 3
FCL_ERROR_BUILD = 4
FCL_ERROR_OUT_OF_RESOURCES = 5
FCL_ERROR_CLBLAST = 6

FCL_DTYPE_F32 = 0
FCL_DTYPE_F16 = 1
FCL_DTYPE_BF16 = 2

FCL_OP_FORWARD = 0
FCL_OP_BACKWARD = 1

FCL_QUIRK_UNKNOWN = 0
FCL_QUIRK_MEASURED = 1
FCL_QUIRK_CACHED = 2
FCL_QUIRK_FORCED = 3

FCL_FLAG_PORTABLE_ONLY = 1
FCL_MAX_HEAD_DIM = 256

# OpenCL handles are pointers.
cl_context = ctypes.c_void_p
cl_device_id = ctypes.c_void_p
cl_command_queue = ctypes.c_void_p
cl_mem = ctypes.c_void_p
cl_event = ctypes.c_void_p
cl_uint = ctypes.c_uint32
fcl_status = ctypes.c_int  # C enums are int-sized on every ABI flashcl targets
fcl_dtype = ctypes.c_int
fcl_operation = ctypes.c_int
fcl_cache_source = ctypes.c_int
fcl_quirk_source = ctypes.c_int


class fcl_context_options(ctypes.Structure):
    _fields_ = [
        ("cache_dir", ctypes.c_char_p),
        ("build_options", ctypes.c_char_p),
        ("flags", ctypes.c_uint),
    ]


class fcl_attention_desc(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", fcl_dtype),
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("o_stride", ctypes.c_int64 * 3),
        ("q_offset", ctypes.c_int64),
        ("k_offset", ctypes.c_int64),
        ("v_offset", ctypes.c_int64),
        ("o_offset", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", cl_mem),
        ("alibi_batch_stride", ctypes.c_int64),
        ("alibi_offset", ctypes.c_int64),
        ("mask", cl_mem),
        ("mask_dtype", fcl_dtype),
        ("mask_stride", ctypes.c_int64 * 3),
        ("mask_offset", ctypes.c_int64),
        ("window", ctypes.c_int),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("sinks", cl_mem),
        ("d_sinks", cl_mem),
        ("cu_seqlens_q", cl_mem),
        ("total_q", ctypes.c_int64),
        ("cu_seqlens_k", cl_mem),
        ("total_k", ctypes.c_int64),
        ("seqlens_k", cl_mem),
        ("block_table", cl_mem),
        ("block_table_stride", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("num_blocks", ctypes.c_int64),
    ]


class fcl_kv_append_desc(ctypes.Structure):
    _fields_ = [
        ("num_tokens", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", fcl_dtype),
        ("block_size", ctypes.c_int64),
        ("num_blocks", ctypes.c_int64),
        ("k_new_stride", ctypes.c_int64 * 2),
        ("v_new_stride", ctypes.c_int64 * 2),
        ("k_new_offset", ctypes.c_int64),
        ("v_new_offset", ctypes.c_int64),
        ("k_pool_stride", ctypes.c_int64 * 3),
        ("v_pool_stride", ctypes.c_int64 * 3),
        ("k_pool_offset", ctypes.c_int64),
        ("v_pool_offset", ctypes.c_int64),
    ]


class fcl_plan_info(ctypes.Structure):
    _fields_ = [
        ("kernel", ctypes.c_char * 64),
        ("reason", ctypes.c_char * 256),
        ("block_q", ctypes.c_int),
        ("block_k", ctypes.c_int),
        ("work_group_size", ctypes.c_int),
        ("local_mem_bytes", ctypes.c_size_t),
        ("work_groups", ctypes.c_size_t),
        ("splits", ctypes.c_int),
    ]


class fcl_cache_stats(ctypes.Structure):
    _fields_ = [
        ("cache_dir", ctypes.c_char_p),
        ("memory_hits", ctypes.c_uint64),
        ("disk_hits", ctypes.c_uint64),
        ("disk_rejected", ctypes.c_uint64),
        ("source_builds", ctypes.c_uint64),
        ("disk_writes", ctypes.c_uint64),
        ("disk_write_failures", ctypes.c_uint64),
        ("last", fcl_cache_source),
        ("device_entries", ctypes.c_uint64),
        ("device_bytes", ctypes.c_uint64),
        ("cache_refused", ctypes.c_char_p),
    ]


class fcl_tune_result(ctypes.Structure):
    _fields_ = [
        ("shape", ctypes.c_char * 64),
        ("default_shape", ctypes.c_char * 64),
        ("best_ms", ctypes.c_double),
        ("default_ms", ctypes.c_double),
        ("candidates", ctypes.c_int),
        ("recorded", ctypes.c_int),
        ("saved", ctypes.c_int),
        ("wall_clock", ctypes.c_int),
    ]


class fcl_device_quirks(ctypes.Structure):
    _fields_ = [
        ("loop_budget", ctypes.c_uint64),
        ("profiling_clock_unusable", ctypes.c_int),
        ("source", fcl_quirk_source),
        ("detail", ctypes.c_char * 192),
    ]


#: The structs of the header, by their C names (the layout test walks this table).
STRUCTS = {
    "fcl_context_options": fcl_context_options,
    "fcl_attention_desc": fcl_attention_desc,
    "fcl_kv_append_desc": fcl_kv_append_desc,
    "fcl_plan_info": fcl_plan_info,
    "fcl_cache_stats": fcl_cache_stats,
    "fcl_tune_result": fcl_tune_result,
    "fcl_device_quirks": fcl_device_quirks,
}

#: The enum constants of the header (the layout test checks their values).
CONSTANTS = {
    name: value
    for name, value in dict(globals()).items()
    if name.startswith(("FCL_SUCCESS", "FCL_ERROR_", "FCL_DTYPE_", "FCL_OP_", "FCL_FLAG_", "FCL_MAX_", "FCL_QUIRK_"))
}

_P = ctypes.POINTER
_desc_p = _P(fcl_attention_desc)

# name: (restype, argtypes)
_SIGNATURES = {
    "fcl_version": (ctypes.c_char_p, []),
    "fcl_status_string": (ctypes.c_char_p, [fcl_status]),
    "fcl_last_error": (ctypes.c_char_p, []),
    "fcl_context_create": (
        fcl_status,
        [cl_context, cl_device_id, _P(fcl_context_options), _P(ctypes.c_void_p)],
    ),
    "fcl_context_release": (None, [ctypes.c_void_p]),
    "fcl_attention_forward": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _desc_p, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem,
         cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_attention_forward_workspace_size": (ctypes.c_size_t, [ctypes.c_void_p, _desc_p]),
    "fcl_attention_forward_with_workspace": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _desc_p, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem,
         cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_attention_merge": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _desc_p, cl_uint, cl_mem, ctypes.c_int64, cl_mem, cl_mem, cl_mem,
         cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_attention_reference": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _desc_p, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem,
         cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_attention_backward_workspace_size": (ctypes.c_size_t, [ctypes.c_void_p, _desc_p]),
    "fcl_attention_backward": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _desc_p, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem, cl_mem,
         cl_mem, cl_mem, cl_mem, cl_mem, cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_kv_cache_append": (
        fcl_status,
        [ctypes.c_void_p, cl_command_queue, _P(fcl_kv_append_desc), cl_mem, cl_mem, cl_mem, cl_mem, cl_mem,
         cl_uint, _P(cl_event), _P(cl_event)],
    ),
    "fcl_describe_plan": (fcl_status, [ctypes.c_void_p, fcl_operation, _desc_p, _P(fcl_plan_info)]),
    "fcl_context_cache_stats": (fcl_status, [ctypes.c_void_p, _P(fcl_cache_stats)]),
    "fcl_tune_forward": (fcl_status, [ctypes.c_void_p, cl_command_queue, _desc_p, _P(fcl_tune_result)]),
    "fcl_context_device_quirks": (fcl_status, [ctypes.c_void_p, _P(fcl_device_quirks)]),
}

# ---- loading ----

_SONAMES = ("libflashcl.so.0", "libflashcl.so") if sys.platform != "darwin" else ("libflashcl.0.dylib", "libflashcl.dylib")
if sys.platform == "win32":
    _SONAMES = ("flashcl.dll",)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def candidates() -> List[str]:
    """The places the library is looked for, in order.

    1. ``$FLASHCL_LIBRARY``: the library file, or a folder that holds it;
    2. the build tree of the source checkout this package was imported from (``<repo>/build``), when it
       was imported from one (``PYTHONPATH=python``) rather than installed;
    3. ``<sys.prefix>/lib`` and ``<sys.prefix>/lib64`` (a ``cmake --install --prefix $VIRTUAL_ENV``; CMake installs
       into ``lib64`` on 64-bit Fedora, RHEL and openSUSE), then the dynamic loader's own search
       (``LD_LIBRARY_PATH``, the ld.so cache: an install prefix such as ``/usr/local``).
    """
    out: List[str] = []
    env = os.environ.get("FLASHCL_LIBRARY")
    if env:
        p = Path(env)
        out += [str(p / n) for n in _SONAMES] if p.is_dir() else [str(p)]
        return out  # an explicit choice is the only one tried
    repo = Path(__file__).resolve().parent.parent.parent
    if (repo / "include" / "flashcl.h").is_file():
        out += [str(repo / "build" / n) for n in _SONAMES]
    out += [str(Path(sys.prefix) / d / n) for d in ("lib", "lib64") for n in _SONAMES]
    out += list(_SONAMES)  # bare names: the dynamic loader's search path
    return out


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libflashcl (once per process) and declares its functions.

    ``path`` (or ``$FLASHCL_LIBRARY``) names the file; otherwise :func:`candidates` are tried in order.
    Raises :class:`flashcl.LibraryNotFoundError` when none loads, and :class:`flashcl.InvalidArgumentError` when
    ``path`` names another file than the one already loaded (contexts made through it call it, and each call's
    error message is read from it: a process uses one library).
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None and path is not None:
            # The dynamic loader hands out the same handle for the same file, whatever path names it.
            try:
                same = ctypes.CDLL(path)._handle == _lib._handle
            except OSError:
                same = False
            if not same:
                from .errors import InvalidArgumentError

                raise InvalidArgumentError(f"libflashcl is already loaded from {_lib_path}; it cannot be replaced by {path}")
        if _lib is not None:
            return _lib
        tried = []
        for cand in [path] if path else candidates():
            if os.sep in cand and not os.path.exists(cand):
                tried.append(f"{cand} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            try:
                _declare(lib)
            except AttributeError as e:
                tried.append(f"{cand} (not a usable libflashcl: {e})")
                continue
            _lib, _lib_path = lib, os.path.abspath(cand) if os.sep in cand else cand
            return lib
        from .errors import LibraryNotFoundError

        raise LibraryNotFoundError(
            "libflashcl was not found; set FLASHCL_LIBRARY to the library (e.g. build/libflashcl.so). Tried:\n  "
            + "\n  ".join(tried)
        )


def library_path() -> str:
    """The path libflashcl was loaded from (loading it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path
