"""flashcl: exact FlashAttention for OpenCL, on PyOpenCL objects.

Array level (shapes, dtypes and strides read from ``pyopencl.array.Array`` objects)::

    out = flashcl.flash_attn_func(q, k, v, causal=True)              # [batch, seq, heads, head_dim]
    out = flashcl.scaled_dot_product_attention(q, k, v, is_causal=True)  # [batch, heads, seq, head_dim]
    out, lse = flashcl.attention(q, k, v, layout="bshd", return_lse=True, window_size=(256, 0))
    dq, dk, dv = flashcl.attention_backward(dout, q, k, v, out, lse)
    out = flashcl.merge(o_parts, lse_parts)        # partial results over disjoint key sets -> exact
    out = flashcl.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)   # packed [total, heads, head_dim]
    out = flashcl.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)  # paged

Buffer level (one function per C entry point, a :class:`Descriptor` like ``fcl_attention_desc``):
:func:`forward`, :func:`forward_workspace_size`, :func:`merge_buffers`, :func:`reference`, :func:`backward`,
:func:`backward_workspace_size`; the paged KV cache append: :func:`kv_cache_append` (a
:class:`KVAppendDescriptor` like ``fcl_kv_append_desc``) and, on arrays, vLLM's :func:`reshape_and_cache`.

The library is found through ``$FLASHCL_LIBRARY``, the source checkout's ``build/``, ``<sys.prefix>/lib``,
then the dynamic loader's path; it is loaded at the first call, so ``import flashcl`` always works.
"""

from ._core import (
    Context,
    Descriptor,
    backward,
    backward_workspace_size,
    default_context,
    forward,
    forward_workspace_size,
    merge as merge_buffers,
    reference,
    status_string,
    version,
)
from ._kv_cache import KVAppendDescriptor, kv_cache_append, reshape_and_cache
from ._attention import attention, attention_backward, flash_attn_func, merge, scaled_dot_product_attention
from ._sequences import flash_attn_varlen_func, flash_attn_with_kvcache
from ._lib import library_path, load as load_library
from .errors import (
    BuildError,
    CLBlastError,
    FlashclError,
    InvalidArgumentError,
    LibraryNotFoundError,
    OpenCLError,
    OutOfResourcesError,
    Status,
    UnsupportedError,
)

__version__ = "0.2.0"

__all__ = [
    "attention", "attention_backward", "merge", "flash_attn_func", "scaled_dot_product_attention",
    "flash_attn_varlen_func", "flash_attn_with_kvcache",
    "Context", "Descriptor", "default_context", "forward", "forward_workspace_size", "merge_buffers", "reference", "backward", "backward_workspace_size",
    "KVAppendDescriptor", "kv_cache_append", "reshape_and_cache",
    "version", "status_string", "library_path", "load_library",
    "Status", "FlashclError", "InvalidArgumentError", "UnsupportedError", "OpenCLError", "BuildError",
    "OutOfResourcesError", "CLBlastError", "LibraryNotFoundError",
]
