/* Aliasing between the buffers of one call, by byte ranges rather than handles: sub-buffers of one parent
 * (CL_MEM_ASSOCIATED_MEMOBJECT, CL_MEM_OFFSET) and CL_MEM_USE_HOST_PTR buffers over one host array
 * (CL_MEM_HOST_PTR) share memory under different handles. An output that shares a byte with any other
 * buffer of the call gives wrong results (work-items read what others write), so it is refused. Ranges are
 * each tensor's span from its first to its last byte, so interleaved tensors whose spans cross count as
 * overlapping: conservative for outputs, never applied between two inputs. */
#include "internal.h"

/* Where a use's bytes live: in its root buffer (the parent of a sub-buffer, else itself) and, for memory
   over a host array, in host addresses. */
typedef struct placed {
  cl_mem root;
  uint64_t first, end;
  uintptr_t host_first, host_end; /* 0, 0: not over a host array */
} placed;

static fcl_status place(const fcl_buffer_use *u, placed *out) {
  cl_mem parent = NULL;
  size_t offset = 0;
  cl_mem_flags flags = 0;
  void *host = NULL;
  FCL_CL_CHECK(clGetMemObjectInfo(u->buf, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL));
  FCL_CL_CHECK(clGetMemObjectInfo(u->buf, CL_MEM_OFFSET, sizeof offset, &offset, NULL));
  FCL_CL_CHECK(clGetMemObjectInfo(u->buf, CL_MEM_FLAGS, sizeof flags, &flags, NULL));
  /* The kernels write outputs and read inputs; a buffer created to forbid that is refused. */
  if (u->is_output && (flags & CL_MEM_READ_ONLY))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s was created CL_MEM_READ_ONLY; the kernels write it", u->name);
  if (!u->is_output && (flags & CL_MEM_WRITE_ONLY))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s was created CL_MEM_WRITE_ONLY; the kernels read it", u->name);
  out->root = parent ? parent : u->buf;
  out->first = (uint64_t)offset + u->first; /* both below 2^62 (fcl_tensor_bytes, CL_MEM_SIZE) */
  out->end = (uint64_t)offset + u->end;
  out->host_first = out->host_end = 0;
  if (flags & CL_MEM_USE_HOST_PTR) {
    FCL_CL_CHECK(clGetMemObjectInfo(u->buf, CL_MEM_HOST_PTR, sizeof host, &host, NULL));
    if (host) { /* a sub-buffer reports its parent's pointer plus its offset */
      out->host_first = (uintptr_t)host + (uintptr_t)u->first;
      out->host_end = (uintptr_t)host + (uintptr_t)u->end;
    }
  }
  return FCL_SUCCESS;
}

static int overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) { return a0 < b1 && b0 < a1; }

fcl_status fcl_check_aliasing(const fcl_buffer_use *uses, int n) {
  enum { MAX_USES = 32 };
  if (n > MAX_USES) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "internal: %d buffers in one aliasing check", n);
  placed at[MAX_USES];
  for (int i = 0; i < n; ++i) {
    fcl_status st;
    if (uses[i].buf && (st = place(&uses[i], &at[i]))) return st;
  }
  for (int i = 0; i < n; ++i) {
    if (!uses[i].buf || !uses[i].is_output) continue;
    for (int j = 0; j < n; ++j) {
      if (j == i || !uses[j].buf || (uses[j].is_output && j > i)) continue; /* each pair of outputs once */
      const int device = at[i].root == at[j].root && overlap(at[i].first, at[i].end, at[j].first, at[j].end);
      const int host = at[i].host_end && at[j].host_end &&
                       overlap(at[i].host_first, at[i].host_end, at[j].host_first, at[j].host_end);
      if (device || host)
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                        "%s overlaps %s: %s; outputs must not alias inputs or each other",
                        uses[i].name, uses[j].name,
                        uses[i].buf == uses[j].buf ? "they are the same buffer and their bytes overlap"
                        : device                   ? "their bytes overlap in one parent buffer (sub-buffers)"
                                                   : "their bytes overlap in one host array (CL_MEM_USE_HOST_PTR)");
    }
  }
  return FCL_SUCCESS;
}
