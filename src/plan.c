/* The portable forward's plan (cl/flash_fwd.cl): a pure function of the device's capabilities and the problem.
 * Every plan returned fits the device's local memory and work-group limits. Also the split-KV count of both
 * forward variants. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

size_t fcl_forward_local_bytes(const fcl_tile_plan *p) {
  /* Q tile [br][ds], one K-or-V tile, P tile [br][bc+4], row max and sum partials [br][tc]. */
  size_t kv = (size_t)p->bc * p->ds;
  if (p->kt && (size_t)p->dp * (p->bc + 1) > kv) kv = (size_t)p->dp * (p->bc + 1); /* K^T [dp][bc+1] */
  const size_t floats =
      (size_t)p->br * p->ds + (kv + 3) / 4 * 4 + (size_t)p->br * (p->bc + 4) + 2 * (size_t)p->br * p->tc;
  return floats * sizeof(float);
}

/* Per work-item register budget in floats for the O accumulator plus the S block. */
#define FCL_REGISTER_BUDGET 96

size_t fcl_work_group_limit(const fcl_device_caps *caps, size_t kernel_max_wg) {
  size_t max_wg = caps->max_work_group_size;
  if (caps->max_work_item_size0 && caps->max_work_item_size0 < max_wg) max_wg = caps->max_work_item_size0;
  if (kernel_max_wg && kernel_max_wg < max_wg) max_wg = kernel_max_wg;
  return max_wg;
}

int fcl_plan_forward_shape(const fcl_device_caps *caps, int head_dim, size_t kernel_max_wg, int tr, int tc, int rm,
                           int rn, int pad, int kt, fcl_tile_plan *out) {
  memset(out, 0, sizeof *out);
  out->variant = FCL_VARIANT_PORTABLE_FORWARD;
  out->head_dim = head_dim;
  if (head_dim < 1 || head_dim > FCL_MAX_HEAD_DIM || tr < 1 || tc < 1 || rm < 1 || rn < 1) return -1;
  /* Every product below stays an int: no device has 2^16 work-items in a group or could hold such tiles. */
  if (tr > 65535 || tc > 65535 || rm > 65535 || rn > 65535 || (long long)tr * tc > 65535 ||
      (long long)tr * rm > 65535 || (long long)tc * rn > 65535)
    return -1;
  /* The kernel reads rows four floats at a time: dp and bc are multiples of 4, dp one of tc too. */
  const int unit = tc > 4 ? tc : 4;
  out->tr = tr;
  out->tc = tc;
  out->rm = rm;
  out->rn = rn;
  out->dp = (head_dim + unit - 1) / unit * unit;
  out->dn = out->dp / tc;
  out->br = tr * rm;
  out->bc = tc * rn;
  out->wg = tr * tc;
  /* ds = 4 mod 8 puts eight consecutive rows' float4s in distinct banks. */
  out->ds = out->dp + (pad && out->dp % 8 == 0 ? 4 : 0);
  out->kt = kt >= 0 ? kt != 0 : caps->is_cpu; /* KT in flash_fwd.cl: by device type unless given */
  /* A row's tc work-items combine maxima and sums by shuffles where the device has them (power-of-two runs;
     NVIDIA's warp shuffles need whole warps). */
  if (tc > 1 && (tc & (tc - 1)) == 0 &&
      (caps->sg_shuffle == FCL_SG_OPENCL || (caps->sg_shuffle == FCL_SG_NVIDIA_WARP && out->wg % 32 == 0)))
    out->subgroup = caps->sg_shuffle;
  out->sg_required = caps->sg_required && out->subgroup;
  out->local_bytes = fcl_forward_local_bytes(out);
  if (out->bc % 4 != 0 || (size_t)out->wg > fcl_work_group_limit(caps, kernel_max_wg) ||
      out->local_bytes > caps->local_mem_size)
    return -1;
  return 0;
}

/* ---- The portable forward's default shapes, by device class ---- */

/* tr x tc work-items, each rm query rows x rn keys of S. */
typedef struct portable_shape {
  int tr, tc, rm, rn;
} portable_shape;

/* CPUs, tried in order: CPUs run a work-group as a loop over its work-items, so few work-items with large
   tiles each do several times the work per CPU-second of the GPU shapes under PoCL: two work-items of 64
   rows x 64 keys and every output column ran 1.3-1.6x faster than 4x4 of 16 x 16 at head_dim 64 to 256 and
   2x faster on one-row decode (docs/notes-portable.md, v4). Registers do not bound this: the tiles live in
   cache. The smaller shapes serve devices with less local memory or a loop budget. */
static const portable_shape cpu_shapes[] = {{2, 1, 64, 64}, {4, 4, 16, 16}, {4, 4, 8, 8}};

/* CPUs whose OpenCL runs a sub-group's work-items as the lanes of SIMD vectors (Intel's CPU runtime) want what GPUs
   want instead: a row of tc work-items, tc the smallest power of two that leaves
   each at most 8 output columns, 16 rows of them, each 3 query rows x 4 keys, K transposed. On Intel's CPU
   runtime 2026.2 that ran 1.1-2.9x faster than the shapes above at head_dim 32 to 256 (docs/notes-portable.md,
   v14). */
#define CPU_SUBGROUP_ROWS 16
#define CPU_SUBGROUP_RM 3
#define CPU_SUBGROUP_RN 4
#define CPU_SUBGROUP_COLUMNS 8

/* Every other device (and a CPU where neither fits): a search from the largest tiles down, tc from the row of
   this table that applies to head_dim (the first with head_dim <= max_head_dim) down to 1. tc sets each
   work-item's O slice at about 8 columns (dn) for head_dim 64 and 128, the fastest of the shapes measured on
   an H200 (docs/notes-portable.md); 128 work-items per group. */
static const fcl_tc_row first_tcs[] = {{15, 4}, {64, 8}, {FCL_MAX_HEAD_DIM, 16}};

int fcl_row_width(int head_dim, int max_columns) {
  int tc = 1;
  while (tc * max_columns < head_dim) tc *= 2;
  return tc;
}

int fcl_first_tc(const fcl_tc_row *rows, size_t n, int head_dim) {
  for (size_t i = 0; i < n; ++i)
    if (head_dim <= rows[i].max_head_dim) return rows[i].tc;
  return rows[n - 1].tc;
}

const fcl_item_block fcl_item_blocks[FCL_ITEM_BLOCKS] = {{4, 4}, {4, 2}, {2, 4}, {2, 2}, {4, 1},
                                                          {1, 4}, {2, 1}, {1, 2}, {1, 1}};

/* The rule's plan for head_dim (tiles hold float whatever the storage type), or FLASHCL_FORWARD_SHAPE's. */
static int rule_plan(const fcl_device_caps *caps, const fcl_plan_overrides *ov, int head_dim, size_t kernel_max_wg,
                     fcl_tile_plan *out) {
  memset(out, 0, sizeof *out);
  out->variant = FCL_VARIANT_PORTABLE_FORWARD;
  out->head_dim = head_dim;
  if (head_dim < 1 || head_dim > FCL_MAX_HEAD_DIM) {
    snprintf(out->reason, sizeof out->reason, "head_dim %d is outside 1..%d", head_dim, FCL_MAX_HEAD_DIM);
    return -1;
  }
  const size_t max_wg = fcl_work_group_limit(caps, kernel_max_wg);
  const int *fs = ov->forward_shape;
  if (fs[0] && fcl_plan_forward_shape(caps, head_dim, kernel_max_wg, fs[0], fs[1], fs[2], fs[3], 1, fs[4], out) == 0) {
    snprintf(out->reason, sizeof out->reason, "shape from FLASHCL_FORWARD_SHAPE");
    return 0;
  }
  if (caps->cpu_simd_subgroups && !caps->loop_budget) {
    const int tc = fcl_row_width(head_dim, CPU_SUBGROUP_COLUMNS);
    if (fcl_plan_forward_shape(caps, head_dim, kernel_max_wg, CPU_SUBGROUP_ROWS, tc, CPU_SUBGROUP_RM, CPU_SUBGROUP_RN, 1,
                               1, out) == 0) {
      snprintf(out->reason, sizeof out->reason,
               "CPU with sub-groups: %dx%d work-items, each %d rows x %d keys, %d output columns, K tile transposed",
               out->tr, out->tc, out->rm, out->rn, out->dn);
      return 0;
    }
  }
  if (caps->is_cpu)
    for (size_t i = 0; i < sizeof cpu_shapes / sizeof cpu_shapes[0]; ++i) {
      const portable_shape *c = &cpu_shapes[i];
      /* Under a loop budget (llvmpipe) a shape must run at least one key tile within it, counted as for paged keys
         (the larger count) whatever the problem's layout. */
      if (fcl_plan_forward_shape(caps, head_dim, kernel_max_wg, c->tr, c->tc, c->rm, c->rn, 1, -1, out) == 0 &&
          !(caps->loop_budget && fcl_forward_max_key_tiles(out, 1, caps->loop_budget) < 0)) {
        snprintf(out->reason, sizeof out->reason,
                 "CPU shape: %dx%d work-items, each %d rows x %d keys, %d output columns, K tile transposed", c->tr,
                 c->tc, c->rm, c->rn, out->dn);
        return 0;
      }
    }
  const int tc_first = fcl_first_tc(first_tcs, sizeof first_tcs / sizeof first_tcs[0], head_dim);
  /* First pass: work-groups a multiple of the device's preferred multiple (whole warps or wavefronts);
     second pass: anything that fits, so a small device still gets a plan. */
  const size_t multiple = caps->preferred_multiple ? caps->preferred_multiple : 1;
  for (int whole = 1; whole >= 0; --whole)
  for (int tc = tc_first; tc >= 1; tc /= 2)
    for (int tr = 128 / tc; tr >= 1; tr /= 2)
      for (int pad = 1; pad >= 0; --pad)
        for (int i = 0; i < FCL_ITEM_BLOCKS; ++i) {
          fcl_tile_plan p;
          if ((whole && (size_t)(tr * tc) % multiple) ||
              fcl_plan_forward_shape(caps, head_dim, kernel_max_wg, tr, tc, fcl_item_blocks[i].rm, fcl_item_blocks[i].rn, pad,
                                     -1, &p))
            continue;
          /* Registers: the last resort (one work-item, one row) is allowed to exceed the budget. */
          if (p.rm * p.dn + p.rm * p.rn > FCL_REGISTER_BUDGET && !(tc == 1 && tr == 1 && p.rm == 1)) continue;
          snprintf(p.reason, sizeof p.reason,
                   "largest tiles within %llu B of local memory and %zu work-items: %dx%d work-items, "
                   "each %d rows x %d keys, %d output columns",
                   (unsigned long long)caps->local_mem_size, max_wg, tr, tc, p.rm, p.rn, p.dn);
          *out = p;
          return 0;
        }
  snprintf(out->reason, sizeof out->reason, "no tiling of head_dim %d fits %llu B of local memory and %zu work-items",
           head_dim, (unsigned long long)caps->local_mem_size, max_wg);
  return -1;
}

int64_t fcl_forward_row_blocks(const fcl_problem *p, const fcl_tile_plan *t) {
  return (p->nq * (t->pack ? p->group : 1) + t->br - 1) / t->br;
}

int64_t fcl_forward_grid_heads(const fcl_problem *p, const fcl_tile_plan *t) { return t->pack ? p->kv_heads : p->heads; }

/* Packed tiles of up to 64 rows: decode and speculative decoding, where a head's few rows would leave most of
   a tile empty and every head of a group would read the same keys again. */
int fcl_forward_packs(const fcl_problem *p) { return p->group > 1 && p->nq * p->group <= 64; }

int fcl_plan_splits(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p,
                    const fcl_tile_plan *t) {
  if (ov->forward_splits) return ov->forward_splits;
  const double groups = (double)fcl_forward_row_blocks(p, t) * (double)fcl_forward_grid_heads(p, t) * (double)p->batch;
  const double cus = caps->compute_units ? caps->compute_units : 1;
  /* The keys one block of rows can see: all of them, or its window's span (a padding warp's rows see
     nothing). */
  const int64_t rows = (int64_t)t->br - (int64_t)t->copy_warps * t->rm * 16;
  const int64_t span = p->wl + p->wr + rows < p->nk ? p->wl + p->wr + rows : p->nk;
  const int64_t tiles = (span + t->bc - 1) / t->bc;
  if (t->variant == FCL_VARIANT_NVIDIA_FORWARD) {
    /* The tensor-core kernel streams a chunk through a ring of K and V tiles (two at the defaults), so its
       speed is that of the loads in flight: the H200's decode sweep (docs/notes-nvidia.md, v8) was fastest with about four warps a
       compute unit in all, and chunks of at least four tiles. So the power of two nearest 4 CUs / (groups x
       warps), halved while a chunk would hold fewer than four tiles: with the one-pass combine the fastest
       count or within 3% of it on the six decode rows measured (v13). */
    /* A decode grid of at least a block a compute unit with a padding warp is unsplit: the planner gave it a
       deeper ring of K/V tiles instead (fcl_plan_nvidia_forward; docs/notes-nvidia.md, v19). */
    if (t->copy_warps && groups >= cus) return 1;
    /* A small grid's blocks of one 16-row tile a warp (fcl_plan_nvidia_forward) are compute-bound: as many
       chunks of at least four tiles as give each unit at most t->wave work-groups (on the H200, 8 heads of
       1024 rows at head_dim 128 in 2 chunks ran 18% faster than in 1, in 4 (a second wave) 15% slower than
       in 2; docs/notes-nvidia.md, v28). That count stands in for the rules below, which such plans (dense
       keys of one length) do not meet. */
    if (t->wave > 0) {
      const double fill = floor(t->wave * cus / groups);
      int s = fill > FCL_MAX_SPLITS ? FCL_MAX_SPLITS : (int)fill;
      while (s > 1 && tiles < 4LL * s) --s;
      return s > 1 ? s : 1;
    }
    /* Warps that own rows: a decode block's padding warp (fcl_plan_nvidia_forward) adds no rows to compute. */
    const int row_warps = t->tr - t->copy_warps;
    const double warps = groups * (row_warps > 0 ? row_warps : 1), want = 4.0 * cus / warps;
    int s = want <= 1 ? 1 : 1 << (int)lround(log2(want > FCL_MAX_SPLITS ? FCL_MAX_SPLITS : want));
    /* Keys counted per sequence in a batch (cu_seqlens_k, seqlens_k): the host does not see the lengths, and
       mixed ones leave the longest sequences' work-groups running alone at the end. On a small grid (under 8
       warps a compute unit) the longest sequence's keys go in chunks of at most 16 tiles: the H200's
       vLLM-shaped decode (64 sequences of 100-8000 keys) ran 1.8x faster paged and 8% faster dense at the 8
       chunks this gives than at the rule's 1 (docs/notes-nvidia.md, v11). */
    if ((p->cu_k || p->seqlens_k) && p->batch >= 2 && warps < 8.0 * cus) {
      int floor = 1;
      while (floor < FCL_MAX_SPLITS && tiles > 16LL * floor) floor *= 2;
      if (s < floor) s = floor;
    }
    /* With a padding warp sharing the tile copies, chunks of two tiles (the H200's batch-1 decode
       at N = 4096: 32 chunks 17.7 us, 16 chunks 19.3). */
    const int64_t min_chunk = t->copy_warps ? 2 : 4;
    while (s > 1 && tiles < min_chunk * s) s /= 2;
    /* Paged keys resolve each tile's rows through the block table before loading them, so a work-group waits
       longer and more of them pay: 1.5x the count, within the work-groups the units hold at once by local
       memory (one more would start a second wave: 56% slower on one row), and beyond the dense count only in
       chunks of at least eight tiles (the last may hold fewer). That is the fastest count measured on all six
       of the H200's paged decode rows (six work-groups a unit there), 6-13% faster than the dense count on
       four (docs/notes-nvidia.md, v13). Where the units' local memory is not known, the dense count. */
    const int resident = p->block_table ? fcl_nvidia_groups_per_unit(caps, t->local_bytes) : 0;
    if (resident > 0 && s > 1) {
      int more = s + s / 2 > FCL_MAX_SPLITS ? FCL_MAX_SPLITS : s + s / 2;
      const double slots = (double)resident * cus / groups;
      if (more > slots) more = (int)slots;
      if (more > tiles / 8) more = (int)(tiles / 8);
      /* As few chunks as hold the tiles at that size (fcl_split_keys cuts whole chunks of ceil(tiles / s)
         tiles, so a larger count would only add empty work-groups). */
      if (more > s) {
        const int64_t per = (tiles + more - 1) / more, trimmed = (tiles + per - 1) / per;
        if (trimmed > s) s = (int)trimmed;
      }
    }
    return s;
  }
  /* Work-groups a compute unit runs at once: two on a GPU (FlashAttention-2's count, for work-groups of 4
     warps), one on a CPU. */
  const double slots = cus * (caps->is_cpu ? 1 : 2);
  if (groups >= 0.8 * slots) return 1;
  int max_splits = FCL_MAX_SPLITS;
  if (tiles < max_splits) max_splits = (int)tiles;
  if (slots < max_splits) max_splits = (int)slots;
  /* A count is worth trying only if it changes the tiles per chunk. */
#define CHUNK(s) ((tiles + (s) - 1) / (s))
  double eff[FCL_MAX_SPLITS + 1], best = 0;
  for (int s = 1; s <= max_splits; ++s) {
    eff[s] = 0;
    if (s > 1 && CHUNK(s) == CHUNK(s - 1)) continue;
    const double waves = groups * s / slots;
    eff[s] = waves / ceil(waves);
    if (eff[s] > best) best = eff[s];
  }
  for (int s = 1; s <= max_splits; ++s)
    if (eff[s] > 0 && eff[s] >= 0.85 * best) return s;
#undef CHUNK
  return 1;
}

int64_t fcl_forward_block_rows(const fcl_problem *p) { return p->nq * (fcl_forward_packs(p) ? p->group : 1); }

/* The rule's plan, or for fewer rows than its block one just large enough. */
static int rows_plan(const fcl_device_caps *caps, const fcl_plan_overrides *ov, int head_dim, size_t kernel_max_wg,
                     int64_t rows, fcl_tile_plan *out) {
  if (rule_plan(caps, ov, head_dim, kernel_max_wg, out) != 0) return -1;
  if (rows >= out->br || ov->forward_shape[0]) return 0;
  /* Few query rows (decode): the same keys per tile and work-items per row, with as few rows per block as
     cover them, so that no work-item computes padding rows; whole warps where the device has them. */
  const fcl_tile_plan rule = *out;
  const size_t multiple = caps->preferred_multiple ? caps->preferred_multiple : 1;
  for (int whole = 1; whole >= 0; --whole)
    for (int tr = 1; tr <= rule.tr; tr *= 2)
      for (int rm = 1; rm <= rule.rm; rm *= 2) {
        fcl_tile_plan p;
        if (tr * rm < rows || (whole && (size_t)(tr * rule.tc) % multiple) ||
            fcl_plan_forward_shape(caps, head_dim, kernel_max_wg, tr, rule.tc, rm, rule.rn, 1, rule.kt, &p) != 0)
          continue;
        /* On a CPU a block of so few rows reuses a K or V element too little to pay for staging it in local
           memory: the kernel reads both from global memory (docs/benchmarks.md: 2.1x on PoCL at one row). */
        p.direct = caps->is_cpu;
        snprintf(p.reason, sizeof p.reason, "%lld query rows: %dx%d work-items, each %d rows x %d keys, %d output columns%s",
                 (long long)rows, tr, rule.tc, rm, rule.rn, p.dn, p.direct ? ", K and V read from global memory" : "");
        *out = p;
        return 0;
      }
  return 0;
}

int fcl_plan_forward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p, unsigned flags,
                     const size_t *kernel_wg, fcl_tile_plan *out) {
  const size_t kernel_max_wg = kernel_wg ? kernel_wg[0] : 0;
  static const fcl_plan_overrides none;
  if (flags & FCL_PLAN_RULE) return rule_plan(caps, &none, (int)p->d, kernel_max_wg, out);
  fcl_device_caps c = *caps;
  /* Paged keys keep a tile's block indices in local memory (8 bytes a key row, flash_fwd.cl's `page`): plan
     the tiles in what remains (2 KiB covers the largest tile). */
  if (p->block_table) c.local_mem_size = c.local_mem_size > 4096 ? c.local_mem_size - 2048 : c.local_mem_size / 2;
  if (rows_plan(&c, ov, (int)p->d, kernel_max_wg, fcl_forward_block_rows(p), out) != 0) return -1;
  out->pack = fcl_forward_packs(p);
  return 0;
}
