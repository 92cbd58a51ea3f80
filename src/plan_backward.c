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

/* The plan of kernel `which` (FCL_BWD_*) within kernel_max_wg work-items (0: the device's limit). */
static int plan_kernel(const fcl_device_caps *caps, int which, int head_dim, size_t kernel_max_wg, fcl_tile_plan *out) {
  memset(out, 0, sizeof *out);
  out->variant = FCL_VARIANT_PORTABLE_BACKWARD;
  out->head_dim = head_dim;
  if (head_dim < 1 || head_dim > FCL_MAX_HEAD_DIM) {
    snprintf(out->reason, sizeof out->reason, "head_dim %d is outside 1..%d", head_dim, FCL_MAX_HEAD_DIM);
    return -1;
  }
  const size_t max_wg = fcl_work_group_limit(caps, kernel_max_wg);
  const size_t local_limit = (size_t)caps->local_mem_size;
  const int accumulators = which == FCL_BWD_DKDV ? 2 : 1; /* dK and dV, or dQ */

  for (int pass = 0; pass < 2; ++pass) {
    for (int tc = fcl_first_tc(first_tcs, sizeof first_tcs / sizeof first_tcs[0], head_dim); tc >= 1; tc /= 2) {
      /* The kernels read rows four floats at a time: dp is a multiple of 4 and of tc. */
      const int unit = tc > 4 ? tc : 4;
      const int dp = (head_dim + unit - 1) / unit * unit;
      for (int tr = 128 / tc; tr >= 1; tr /= 2) {
        if ((size_t)tr * tc > max_wg) continue;
        for (int pad = 1; pad >= 0; --pad) {
          for (int i = 0; i < FCL_ITEM_BLOCKS; ++i) { /* rm owned rows, rn streamed rows */
            fcl_tile_plan p = *out;
            p.tc = tc;
            p.tr = tr;
            p.dp = dp;
            p.dn = dp / tc;
            /* ds = 4 mod 8 puts consecutive rows' float4s in distinct banks. */
            p.ds = dp + (pad && dp % 8 == 0 ? 4 : 0);
            p.rm = fcl_item_blocks[i].rm;
            p.rn = fcl_item_blocks[i].rn;
            if ((tc * p.rn) % 4 != 0) continue; /* streamed rows: P and dS rows are read as float4 */
            if (which == FCL_BWD_DKDV) {
              p.bc = tr * p.rm; /* key rows owned */
              p.br = tc * p.rn; /* query rows streamed */
            } else {
              p.br = tr * p.rm; /* query rows owned */
              p.bc = tc * p.rn; /* key rows streamed */
            }
            p.wg = tr * tc;
            if (pass == 0 && accumulators * p.rm * p.dn + 2 * p.rm * p.rn > FCL_BWD_REGISTER_BUDGET) continue;
            p.local_bytes = fcl_backward_local_bytes(&p, which);
            if (p.local_bytes > local_limit) continue;
            snprintf(p.reason, sizeof p.reason,
                     "%s: largest tiles within %zu B of local memory and %zu work-items: %dx%d work-items, "
                     "each %d owned rows x %d streamed rows, %d head_dim columns",
                     which == FCL_BWD_DKDV ? "dK/dV" : "dQ", local_limit, max_wg, tr, tc, p.rm, p.rn, p.dn);
            *out = p;
            return 0;
          }
        }
      }
    }
  }
  snprintf(out->reason, sizeof out->reason,
           "no backward tiling of head_dim %d fits %zu B of local memory and %zu work-items", head_dim,
           local_limit, max_wg);
  return -1;
}

int fcl_plan_backward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p, unsigned flags,
                      const size_t *kernel_wg, fcl_tile_plan out[2]) {
  (void)ov, (void)flags; /* no override of the backward; the portable kernels apply everywhere */
  for (int which = FCL_BWD_DKDV; which <= FCL_BWD_DQ; ++which)
    if (plan_kernel(caps, which, (int)p->d, kernel_wg ? kernel_wg[which] : 0, &out[which]) != 0) {
      if (which != 0) memcpy(out[0].reason, out[which].reason, sizeof out[0].reason);
      out[0].variant = -1;
      return -1;
    }
  return 0;
}
