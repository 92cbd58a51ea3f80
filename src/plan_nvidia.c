/* Plan of the NVIDIA tensor-core forward kernel (cl/nvidia/flash_fwd_mma.cl): whether it applies to a
 * problem on a device, and its tiles. A pure function of (capabilities, problem, context flags). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Local memory of the kernel: K and V tiles of bc rows, reused for the O tile of br rows at the end. */
size_t fcl_nvidia_forward_local_bytes(const fcl_tile_plan *p) {
  size_t kv = 2 * (size_t)p->bc * (size_t)p->ds, o = (size_t)p->br * (size_t)p->ds;
  return (kv > o ? kv : o) * 2;
}

/* Every row of the tensor starts on a 16-byte boundary (8 elements of 2 bytes), as cp.async and the
   vector O store need. A stride along a dimension of extent 1 is never used, so it does not count. */
static int rows_aligned(const int64_t stride[3], int64_t offset, int64_t batch, int64_t heads, int64_t rows) {
  const int64_t extent[3] = {batch, heads, rows};
  if (offset % 8) return 0;
  for (int i = 0; i < 3; ++i)
    if (extent[i] > 1 && stride[i] % 8) return 0;
  return 1;
}

int fcl_plan_nvidia_forward(const fcl_device_caps *caps, const fcl_problem *p, unsigned flags, fcl_tile_plan *out) {
  memset(out, 0, sizeof *out);
  out->kernel = FCL_KERNEL_PORTABLE;
  out->head_dim = (int)p->d;
#define DECLINE(...)                                          \
  do {                                                        \
    snprintf(out->reason, sizeof out->reason, __VA_ARGS__);   \
    return -1;                                                \
  } while (0)
  if (flags & FCL_FLAG_PORTABLE_ONLY) DECLINE("portable only by request");
  if (caps->vendor != FCL_VENDOR_NVIDIA) DECLINE("tensor-core kernel: not an NVIDIA platform");
  if (caps->nv_cc_major < 8)
    DECLINE("tensor-core kernel: compute capability %d.%d is below 8.0", caps->nv_cc_major, caps->nv_cc_minor);
  if (p->dtype != FCL_DTYPE_F16 && p->dtype != FCL_DTYPE_BF16) DECLINE("tensor-core kernel: f16 and bf16 only");
  if (p->d % 8 != 0 || p->d > 256) DECLINE("tensor-core kernel: head_dim %lld is not a multiple of 8 up to 256", (long long)p->d);
  if (!(p->scale > 0.0f) || !isfinite(p->scale)) DECLINE("tensor-core kernel: scale must be positive and finite");
  if (p->nq > INT32_MAX / 2 || p->nk > INT32_MAX / 2) DECLINE("tensor-core kernel: sequence too long");
  if (!rows_aligned(p->q_stride, p->q_offset, p->batch, p->heads, p->nq) ||
      !rows_aligned(p->k_stride, p->k_offset, p->batch, p->kv_heads, p->nk) ||
      !rows_aligned(p->v_stride, p->v_offset, p->batch, p->kv_heads, p->nk) ||
      !rows_aligned(p->o_stride, p->o_offset, p->batch, p->heads, p->nq))
    DECLINE("tensor-core kernel: rows of q, k, v and o must start on 16 bytes (offsets and strides multiples of 8)");

  fcl_tile_plan t = *out;
  t.kernel = FCL_KERNEL_NVIDIA_MMA;
  t.dp = ((int)p->d + 15) / 16 * 16;
  t.ds = t.dp + 8; /* rows 16 bytes apart modulo 128: ldmatrix reads 8 rows from 8 different bank groups */
  /* Warps of 16-row mma tiles; m tiles per warp and key-tile rows by head_dim, within the 255 registers
     a work-item may hold (Q fragments + O accumulators + S + P). */
  int nw = 4, mt, bc;
  if (p->d <= 64) {
    mt = 2;
    bc = 64;
  } else if (p->d <= 128) {
    mt = 1;
    bc = 64;
  } else {
    mt = 1;
    bc = 32;
  }
  for (; bc >= 16; bc /= 2) {
    t.tr = nw;
    t.tc = 32;
    t.wg = nw * 32;
    t.rm = mt;
    t.br = nw * mt * 16;
    t.bc = bc;
    t.local_bytes = fcl_nvidia_forward_local_bytes(&t);
    if (t.local_bytes <= caps->local_mem_size && (size_t)t.wg <= caps->max_work_group_size) break;
  }
  if (bc < 16) DECLINE("tensor-core kernel: %zu B of local memory is too little", (size_t)caps->local_mem_size);
  snprintf(t.reason, sizeof t.reason,
           "tensor cores (mma.sync m16n8k16) on compute capability %d.%d: %d warps x %d m16 tiles, %d query rows, "
           "%d-key tiles, %zu B local",
           caps->nv_cc_major, caps->nv_cc_minor, nw, mt, t.br, t.bc, t.local_bytes);
  *out = t;
  return 0;
#undef DECLINE
}
