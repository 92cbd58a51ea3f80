/* The portable backward's plans (cl/flash_bwd.cl): a pure function of the device's capabilities and the
 * problem (its head_dim: tiles hold float whatever the storage type), like fcl_plan_forward. Every plan
 * returned fits the device's local memory and work-group limits. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Rows a work-group owns (tr * rm) and rows it streams per step (tc * rn), by kernel. */
static void owned_streamed(const fcl_tile_plan *p, int which, size_t *bm, size_t *bn) {
  *bm = which == FCL_BWD_DKDV ? (size_t)p->bc : (size_t)p->br;
  *bn = which == FCL_BWD_DKDV ? (size_t)p->br : (size_t)p->bc;
}

size_t fcl_backward_local_bytes(const fcl_tile_plan *p, int which) {
  size_t bm, bn;
  owned_streamed(p, which, &bm, &bn);
  /* dK/dV: K, V tiles [bm][ds], Q, dO tiles [bn][ds], P^T and dS^T [bm][bn+4], lse and Dvec [bn].
     dQ:    Q, dO tiles [bm][ds], K, V tiles [bn][ds], dS [bm][bn+4], lse and Dvec [bm]. */
  size_t floats = 2 * bm * (size_t)p->ds + 2 * bn * (size_t)p->ds;
  if (which == FCL_BWD_DKDV)
    floats += 2 * bm * (bn + 4) + 2 * bn;
  else
    floats += bm * (bn + 4) + 2 * bm;
  return floats * sizeof(float);
}

/* Per work-item register budget in floats (accumulators plus the S and dP blocks) in the first pass;
   a second pass drops it, so a device with little local memory still gets a (slow) plan. */
#define FCL_BWD_REGISTER_BUDGET 128

/* ---- The portable backward's default shapes (every device) ---- */

/* A search from the largest tiles down, tc from the row of this table that applies to head_dim (the first with
   head_dim <= max_head_dim) down to 1; tc sets each work-item's head_dim columns (dn = dp / tc). The rows are the
   forward's, except that head_dim 64 starts at 16 (no measurement of the backward's choice is recorded). */
static const fcl_tc_row first_tcs[] = {{15, 4}, {63, 8}, {FCL_MAX_HEAD_DIM, 16}};

/* CPUs without a loop budget (PoCL) take few work-items of many rows, as the forward's CPU shapes do: two
   work-items, each 32 owned rows x 16 streamed rows, for both kernels (docs/notes-portable.md, v6: 2.1-2.5x the
   speed of the search's 8 x 16 work-items on PoCL). Under a loop budget (llvmpipe) larger blocks would let fewer
   tiles run, so those devices keep the search. */
static const int cpu_shape[4] = {2, 1, 32, 16};

/* CPUs that run a sub-group's work-items as SIMD lanes (Intel's CPU runtime; src/plan.c): up to head_dim 192,
   16 x tc work-items of 2 x 2 rows, tc the smallest power of two that leaves each at most 6 head_dim columns. On
   Intel's CPU runtime 2026.2 that ran 1.1-1.4x faster than the CPU shape above at head_dim 8 to 192, and slower at
   256 with 8 columns (docs/notes-portable.md, v15). */
#define CPU_SUBGROUP_MAX_HEAD_DIM 192 /* 32 work-items a row */
#define CPU_SUBGROUP_COLUMNS 6

/* Kernel `which`'s plan (FCL_BWD_*) at one shape: tr x tc work-items, each rm owned rows x rn streamed rows, the
   local row stride padded when pad is set and room allows. 0 and *out filled when the shape is consistent and fits
   max_wg work-items, local memory and (with budget set) the register budget; else -1 and *out untouched. */
static int shape_plan(const fcl_device_caps *caps, int which, int head_dim, size_t max_wg, int tr, int tc, int rm,
                      int rn, int pad, int budget, fcl_tile_plan *out) {
  if ((size_t)tr * tc > max_wg) return -1;
  if ((tc * rn) % 4 != 0) return -1; /* streamed rows: P and dS rows are read as float4 */
  const int accumulators = which == FCL_BWD_DKDV ? 2 : 1; /* dK and dV, or dQ */
  fcl_tile_plan p;
  memset(&p, 0, sizeof p);
  p.variant = FCL_VARIANT_PORTABLE_BACKWARD;
  p.head_dim = head_dim;
  p.tc = tc;
  p.tr = tr;
  /* The kernels read rows four floats at a time: dp is a multiple of 4 and of tc. */
  const int unit = tc > 4 ? tc : 4;
  p.dp = (head_dim + unit - 1) / unit * unit;
  p.dn = p.dp / tc;
  /* ds = 4 mod 8 puts consecutive rows' float4s in distinct banks. */
  p.ds = p.dp + (pad && p.dp % 8 == 0 ? 4 : 0);
  p.rm = rm;
  p.rn = rn;
  if (which == FCL_BWD_DKDV) {
    p.bc = tr * rm; /* key rows owned */
    p.br = tc * rn; /* query rows streamed */
  } else {
    p.br = tr * rm; /* query rows owned */
    p.bc = tc * rn; /* key rows streamed */
  }
  p.wg = tr * tc;
  if (budget && accumulators * rm * p.dn + 2 * rm * rn > FCL_BWD_REGISTER_BUDGET) return -1;
  p.local_bytes = fcl_backward_local_bytes(&p, which);
  if (p.local_bytes > (size_t)caps->local_mem_size) return -1;
  *out = p;
  return 0;
}

/* Kernel `which`'s plan at a given shape (tr, tc, rm, rn; the local rows padded where that fits, else not; no
   register budget), its reason the kernel, tag, the shape and suffix: 0 when it fits, else -1. */
static int given_shape(const fcl_device_caps *caps, int which, int head_dim, size_t max_wg, const int shape[4],
                       const char *tag, const char *suffix, fcl_tile_plan *out) {
  for (int pad = 1; pad >= 0; --pad)
    if (shape_plan(caps, which, head_dim, max_wg, shape[0], shape[1], shape[2], shape[3], pad, 0, out) == 0) {
      snprintf(out->reason, sizeof out->reason,
               "%s: %s%dx%d work-items, each %d owned rows x %d streamed rows, %d head_dim columns%s",
               which == FCL_BWD_DKDV ? "dK/dV" : "dQ", tag, out->tr, out->tc, out->rm, out->rn, out->dn, suffix);
      return 0;
    }
  return -1;
}

/* The plan of kernel `which` (FCL_BWD_*) within kernel_max_wg work-items (0: the device's limit): the forced shape
   (FLASHCL_PORTABLE_BACKWARD_SHAPE; tr, tc, rm, rn, or NULL) where it fits, else a CPU's shape where it applies
   and fits, else the largest tiles that fit. */
static int plan_kernel(const fcl_device_caps *caps, int which, int head_dim, size_t kernel_max_wg, const int *forced,
                       fcl_tile_plan *out) {
  memset(out, 0, sizeof *out);
  out->variant = FCL_VARIANT_PORTABLE_BACKWARD;
  out->head_dim = head_dim;
  if (head_dim < 1 || head_dim > FCL_MAX_HEAD_DIM) {
    snprintf(out->reason, sizeof out->reason, "head_dim %d is outside 1..%d", head_dim, FCL_MAX_HEAD_DIM);
    return -1;
  }
  const size_t max_wg = fcl_work_group_limit(caps, kernel_max_wg);
  const size_t local_limit = (size_t)caps->local_mem_size;
  if (forced && forced[0] &&
      given_shape(caps, which, head_dim, max_wg, forced, "", " (FLASHCL_PORTABLE_BACKWARD_SHAPE)", out) == 0)
    return 0;
  if (caps->cpu_simd_subgroups && !caps->loop_budget && head_dim <= CPU_SUBGROUP_MAX_HEAD_DIM) {
    const int shape[4] = {16, fcl_row_width(head_dim, CPU_SUBGROUP_COLUMNS), 2, 2};
    if (given_shape(caps, which, head_dim, max_wg, shape, "CPU with sub-groups: ", "", out) == 0) return 0;
  }
  if (caps->is_cpu && !caps->loop_budget &&
      given_shape(caps, which, head_dim, max_wg, cpu_shape, "CPU shape: ", "", out) == 0)
    return 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int tc = fcl_first_tc(first_tcs, sizeof first_tcs / sizeof first_tcs[0], head_dim); tc >= 1; tc /= 2)
      for (int tr = 128 / tc; tr >= 1; tr /= 2)
        for (int pad = 1; pad >= 0; --pad)
          for (int i = 0; i < FCL_ITEM_BLOCKS; ++i) /* rm owned rows, rn streamed rows */
            if (shape_plan(caps, which, head_dim, max_wg, tr, tc, fcl_item_blocks[i].rm, fcl_item_blocks[i].rn, pad,
                           pass == 0, out) == 0) {
              snprintf(out->reason, sizeof out->reason,
                       "%s: largest tiles within %zu B of local memory and %zu work-items: %dx%d work-items, "
                       "each %d owned rows x %d streamed rows, %d head_dim columns",
                       which == FCL_BWD_DKDV ? "dK/dV" : "dQ", local_limit, max_wg, tr, tc, out->rm, out->rn, out->dn);
              return 0;
            }
  snprintf(out->reason, sizeof out->reason,
           "no backward tiling of head_dim %d fits %zu B of local memory and %zu work-items", head_dim,
           local_limit, max_wg);
  return -1;
}

int fcl_plan_backward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p, unsigned flags,
                      const size_t *kernel_wg, fcl_tile_plan out[2]) {
  (void)flags; /* the portable kernels apply everywhere */
  for (int which = FCL_BWD_DKDV; which <= FCL_BWD_DQ; ++which)
    if (plan_kernel(caps, which, (int)p->d, kernel_wg ? kernel_wg[which] : 0, ov->portable_backward_shape + 4 * which,
                    &out[which]) != 0) {
      if (which != 0) memcpy(out[0].reason, out[which].reason, sizeof out[0].reason);
      out[0].variant = -1;
      return -1;
    }
  return 0;
}
