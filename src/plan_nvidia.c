/* Plans of the NVIDIA tensor-core kernels (cl/nvidia/flash_fwd_mma.cl, flash_bwd_mma.cl): whether they apply
 * to a problem on a device, and their tiles. Pure functions of (capabilities, problem, context flags). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Local memory of the kernel: its ring of K/V tiles of bc rows (and the Q tile of br rows when qsmem, less
   the columns of its qregs k steps of 16 kept in registers), reused for the O tile at the end; elements of
   elem_bytes (2, or 4 for f32). */
size_t fcl_nvidia_forward_local_bytes(const fcl_tile_plan *p, int elem_bytes, int paged) {
  size_t kv = (size_t)p->stages * (size_t)p->bc * (size_t)p->ds +
              (p->qsmem ? (size_t)p->br * (size_t)(p->ds - 16 * p->qregs) : 0),
         o = (size_t)p->br * (size_t)p->ds;
  /* Paged keys add two slots of a tile's rows' K and V offsets (flash_fwd_mma.cl's `page`), the mbarrier ring
     two mbarriers a buffer. */
  return (kv > o ? kv : o) * (size_t)elem_bytes + (paged ? 4 * (size_t)p->bc * sizeof(int64_t) : 0) +
         (p->mbar_ring ? 2 * (size_t)p->stages * sizeof(uint64_t) : 0);
}

/* KiB of shared memory a multiprocessor holds, by compute capability (CUDA's table of them); 0 where unknown. Each
   block also takes 1 KiB the driver reserves, so one block may take 1 KiB less than the whole. */
static unsigned unit_shared_kib(int major, int minor) {
  const int cc = major * 10 + minor;
  return cc == 80 || cc == 87 ? 164 : cc == 86 || cc == 89 || major == 12 ? 100 : major == 9 || major == 10 ? 228 : 0;
}

int fcl_nvidia_groups_per_unit(const fcl_device_caps *caps, size_t local_bytes) {
  const size_t kib = unit_shared_kib(caps->nv_cc_major, caps->nv_cc_minor);
  return kib ? (int)((kib << 10) / (local_bytes + 1024)) : 0;
}

cl_ulong fcl_nvidia_block_local(int major, int minor) {
  const unsigned kib = unit_shared_kib(major, minor);
  return kib ? (cl_ulong)(kib - 1) << 10 : 0;
}

/* Every row of the tensor starts on a 16-byte boundary (per16 elements: 8 of 2 bytes, 4 of 4), as cp.async
   and the vector O store need. A stride along a dimension of extent 1 is never used, so it does not count. */
static int rows_aligned(const int64_t stride[3], int64_t offset, const int64_t extent[3], int per16) {
  if (offset % per16) return 0;
  for (int i = 0; i < 3; ++i)
    if (extent[i] > 1 && stride[i] % per16) return 0;
  return 1;
}
#define ROWS_ALIGNED(p, per16)                                                      \
  (rows_aligned((p)->q_stride, (p)->q_offset, (p)->q_counts, per16) &&              \
   rows_aligned((p)->k_stride, (p)->k_offset, (p)->kv_counts, per16) &&             \
   rows_aligned((p)->v_stride, (p)->v_offset, (p)->kv_counts, per16) &&             \
   rows_aligned((p)->o_stride, (p)->o_offset, (p)->q_counts, per16))

/* head_dim padded to the k step and the local tiles' row stride, both kernels: f16/bf16 k steps of 16, rows
   16 bytes apart modulo 128 (ldmatrix reads 8 rows from 8 different bank groups); f32 k steps of 8 (head_dim
   is a multiple of 8), rows 4 words apart modulo 8 (a warp's 32 float fragment reads fall in 32 banks). */
static void tile_rows(const fcl_problem *p, fcl_tile_plan *t) {
  const int f32 = p->dtype == FCL_DTYPE_F32;
  t->dp = f32 ? ((int)p->d + 7) / 8 * 8 : ((int)p->d + 15) / 16 * 16;
  t->ds = t->dp + (f32 ? 4 : 8);
}

/* A plan's tiles fit the device: the compiler keeps 16 bytes of local memory for itself. */
static int fits(const fcl_device_caps *caps, size_t local_bytes, int wg) {
  const cl_ulong limit = caps->nv_static_local > caps->local_mem_size ? caps->nv_static_local : caps->local_mem_size;
  return local_bytes + 16 <= limit && (size_t)wg <= caps->max_work_group_size;
}

/* It fits, and (two_a_unit) two such work-groups fit a multiprocessor: the default rows beyond the reported 48 KiB. */
static int fits_rule(const fcl_device_caps *caps, size_t local_bytes, int wg, int two_a_unit) {
  return fits(caps, local_bytes, wg) && (!two_a_unit || fcl_nvidia_groups_per_unit(caps, local_bytes) >= 2);
}

/* ---- The tensor-core forward's default shapes (NVIDIA, compute capability 8.0 and above) ---- */

/* warps of 16-row mma tiles, tiles a warp (rm), key-tile rows (bc), Q tile in local memory (else registers),
   K/V tile buffers of the ring (stages; stages - 1 tiles in flight), with the Q tile in local memory its first
   k steps (16 columns each) kept in registers instead (qregs; f16 and bf16). */
typedef struct nvidia_forward_shape {
  int warps, tiles, keys, qsmem, stages, qregs;
} nvidia_forward_shape;

/* The first shape by head_dim, from the measurements in docs/notes-nvidia.md (H200): 32 query rows a warp
   halve the ldmatrix bytes per mma against 16, and with the Q tile in local memory instead of registers that
   fits 255 registers without spilling. The first row that applies is taken, a row with conditions only where
   it fits the device's local memory (forward_default); the planner has declined head_dims above 256. All keep two buffers: a second K tile
   measured 1-5% slower on the H200 (docs/notes-nvidia.md, v5). A row with conditions (0: none) applies only to
   causal problems of at most causal_max_rows query rows, problems of at least min_rows query rows and at most
   max_keys keys, dtype (fcl_dtype + 1), with `plain` problems without softcap, ALiBi or a mask (the scores'
   modifiers) and without paged keys, with `no_mask` problems without an additive mask, and with `two_a_unit`
   devices whose multiprocessors hold two such work-groups, each beyond the 48 KiB NVIDIA's OpenCL reports
   (compute capability 8.0, 8.7, 9.0 and 10.x; caps->nv_static_local). */
typedef struct forward_default_row {
  int max_head_dim, causal_max_rows, min_rows, max_keys, dtype, plain, no_mask, two_a_unit;
  nvidia_forward_shape shape;
} forward_default_row;
static const forward_default_row forward_defaults[] = {
    /* Causal up to 1024 query rows: the causal row below (4 warps x 1 tile, 128-key tiles, Q in registers),
       ahead of FlashAttention-2's tile, which ran 6-8% slower there on an H100 (docs/notes-nvidia.md v40). */
    {.max_head_dim = 64, .causal_max_rows = 1024, .min_rows = 128, .max_keys = 4096, .shape = {4, 1, 128, 0, 2, 0}},
    /* FlashAttention-2's tile at head_dim 64: 4 warps x 2 tiles (128 rows), 128-key tiles, Q in local memory
       (18 KiB + K,V 36 KiB): on an H100 3-4% faster than the rows below not causal and 6-7% faster causal, f16
       and bf16, at N = 4096 and 16384 (docs/notes-nvidia.md v39), 2.5-4% at 2048 (causal 2%) and not causal at
       1024 (v40). The scores' modifiers and paged keys were not measured with it and keep the rows below. */
    {.max_head_dim = 64, .min_rows = 1024, .plain = 1, .no_mask = 1, .two_a_unit = 1, .shape = {4, 2, 128, 1, 2, 0}},
    /* 4 warps x 1 tile (64 rows), 128-key tiles, Q in registers: causal, at N = 1024 8-9% faster than 4 x 2 x
       64, at 2048 2%, at 4096 0-1%, at 16384 10% slower (v26). From 128 query rows on, so that the GQA packing
       and decode rules (fcl_plan_nvidia_forward, by the rule's 128 rows) see what they saw before. */
    {.max_head_dim = 64, .causal_max_rows = 4096, .min_rows = 128, .max_keys = 4096, .shape = {4, 1, 128, 0, 2, 0}},
    /* f16: 4 warps x 2 tiles (128 rows), 128-key tiles (FlashAttention-2's tile at head_dim 64), Q in
       registers: 1.5-3.7% faster than 64-key tiles not causal, equal causal; bf16 ran 3.5-8% slower (v26).
       It spills (148 B in f16, 252 B in bf16 on the H200); the modifiers' code and paged keys' would spill
       more (by clang's code generator several times as much, 720 B with every modifier), so those keep
       64-key tiles. */
    {.max_head_dim = 64, .min_rows = 128, .dtype = FCL_DTYPE_F16 + 1, .plain = 1, .shape = {4, 2, 128, 0, 2, 0}},
    /* 4 warps x 2 tiles (128 rows), 64-key tiles, Q in registers: causal 4-6% faster than Q in local memory
       at N = 4096 and 16384, f16 and bf16 (v12); not causal, once O was rarely rescaled (v25), 0-3% faster */
    {.max_head_dim = 64, .shape = {4, 2, 64, 0, 2, 0}},
    /* causal with at most 2048 query rows: 4 warps x 1 tile, 64-key tiles, Q in registers measured faster */
    {.max_head_dim = 128, .causal_max_rows = 2048, .shape = {4, 1, 64, 0, 2, 0}},
    /* FlashAttention-2's tile: 4 warps x 2 tiles (128 rows), 64-key tiles, all of Q in local memory (35 KiB +
       K,V 35 KiB): on an H100 2-10% faster than the next row at N = 1024 to 16384 (causal from 4096 rows), with
       softcap or ALiBi too; with a mask 2% faster not causal but 17% slower causal (docs/notes-nvidia.md v37) */
    {.max_head_dim = 128, .no_mask = 1, .two_a_unit = 1, .shape = {4, 2, 64, 1, 2, 0}},
    /* 4 warps x 2 tiles (128 rows), 32-key tiles; Q's first 32 columns in registers and the other 96 in local
       memory (26 KiB + K,V 17 KiB of 48 KiB), where the whole Q tile (35 KiB) would not fit: 7-13% faster than
       2 warps x 2 tiles with all of Q in local memory (v20) */
    {.max_head_dim = 128, .shape = {4, 2, 32, 1, 2, 2}},
    {.max_head_dim = 256, .shape = {4, 1, 32, 0, 2, 0}}, /* 4 warps x 1 tile, 32-key tiles, Q in registers */
};

/* f32 (3xTF32, m16n8k8): floats take twice the local memory and their Q fragments twice the registers, so
   one 16-row tile a warp. Swept on the H200 (B=4, H=16, N=4096, causal and not; docs/notes-portable.md v10):
   head_dim 64, 8 warps and 32-key tiles with Q in registers (7% faster than 4 x 64 not causal, within 2% of
   the best causal); 128, 2 warps and 16-key tiles with Q in local memory, which frees its 64 registers a
   lane (3% faster than 4 warps with Q in registers not causal, equal causal; Q in registers spilled 100 B).
   With the three-instruction TF32 split (v11) 64-key tiles at head_dim 64 (4 or 8 warps) ran 0-8% faster on
   the six rows timed once each; the default waits for a sweep over more rows. The planner declines f32 above
   head_dim 128. */
static const nvidia_forward_shape forward_f32_defaults[] = {{8, 1, 32, 0, 2, 0}, {2, 1, 16, 1, 2, 0}};

/* Grids of few blocks (fcl_plan_nvidia_forward), head_dim up to 64 and up to 128: 4 warps x 1 tile (64 rows), Q
   in registers, 128- and 64-key tiles. */
static const nvidia_forward_shape small_grid_shapes[] = {{4, 1, 128, 0, 2, 0}, {4, 1, 64, 0, 2, 0}};

/* Then smaller shapes for devices with less local memory, in this order (the first is head_dim 128's default
   before v20: 2 warps x 2 tiles, all of Q in local memory). */
static const nvidia_forward_shape forward_fallbacks[] = {
    {2, 2, 32, 1, 2, 0}, {4, 1, 32, 0, 2, 0}, {4, 1, 16, 0, 2, 0}, {2, 1, 16, 0, 2, 0}};

/* The plan's tile fields and local memory for shape sh (copying: its first warp's rows are padding). */
static void take_shape(const fcl_device_caps *caps, const fcl_problem *p, const nvidia_forward_shape *sh, int copying,
                       fcl_tile_plan *t) {
  const int f32 = p->dtype == FCL_DTYPE_F32;
  t->tr = sh->warps;
  t->tc = 32;
  t->wg = t->tr * 32;
  t->rm = sh->tiles;
  t->bc = sh->keys;
  t->qsmem = sh->qsmem;
  /* The kernel takes QREG only beside a local Q tile, in f16/bf16, and for fewer k steps than head_dim has. */
  t->qregs = sh->qsmem && !f32 && sh->qregs * 16 < t->dp ? sh->qregs : 0;
  t->stages = sh->stages;
  t->br = t->tr * t->rm * 16;
  /* The ring on mbarriers from compute capability 9.0 (its waits), for dense keys (paged rows are resolved
     a tile ahead between the ring's barriers) and blocks of more than one warp of real rows: a lone warp's
     barrier costs next to nothing, its mbarrier waits do (docs/notes-nvidia.md, v24). */
  t->mbar_ring = caps->nv_cc_major >= 9 && !p->block_table && t->tr - copying > 1;
  t->local_bytes = fcl_nvidia_forward_local_bytes(t, (int)p->elem_size, p->block_table != NULL);
}

/* Whether row r of forward_defaults applies to p by its head_dim and conditions. */
static int row_applies(const forward_default_row *r, const fcl_problem *p) {
  if (p->d > r->max_head_dim || p->nq < r->min_rows || (r->max_keys && p->nk > r->max_keys)) return 0;
  if (r->causal_max_rows && !(p->causal && p->nq <= r->causal_max_rows)) return 0;
  if (r->dtype && (int)p->dtype + 1 != r->dtype) return 0;
  if (r->no_mask && p->mask) return 0;
  return !r->plain || !(fcl_problem_score_mods(p) || p->block_table);
}

static const nvidia_forward_shape *forward_default(const fcl_device_caps *caps, const fcl_problem *p) {
  if (p->dtype == FCL_DTYPE_F32) return &forward_f32_defaults[p->d > 64];
  const size_t n = sizeof forward_defaults / sizeof forward_defaults[0];
  for (size_t i = 0; i < n; ++i) {
    const forward_default_row *r = &forward_defaults[i];
    if (!row_applies(r, p)) continue;
    /* A row with conditions gives way to the next when it does not fit; the first without any is the head_dim's
       own default, and where that does not fit the fallbacks follow (fcl_plan_nvidia_forward). */
    const int conditional = r->causal_max_rows || r->min_rows || r->max_keys || r->dtype || r->plain || r->no_mask ||
                            r->two_a_unit;
    if (!conditional) return &r->shape;
    fcl_tile_plan t;
    memset(&t, 0, sizeof t);
    tile_rows(p, &t);
    take_shape(caps, p, &r->shape, 0, &t);
    if (fits_rule(caps, t.local_bytes, t.wg, r->two_a_unit)) return &r->shape;
  }
  return &forward_defaults[n - 1].shape;
}

int fcl_plan_nvidia_forward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p,
                            unsigned flags, const size_t *kernel_wg, fcl_tile_plan *out) {
  (void)kernel_wg;
  memset(out, 0, sizeof *out);
  out->variant = -1;
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
  const int f32 = p->dtype == FCL_DTYPE_F32, elem_bytes = (int)p->elem_size;
  if (p->d % 8 != 0 || p->d > 256) DECLINE("tensor-core kernel: head_dim %lld is not a multiple of 8 up to 256", (long long)p->d);
  /* f32's fragments and accumulators are floats, twice the registers of f16's: above 128 they would spill. */
  if (f32 && p->d > 128)
    DECLINE("tensor-core kernel: f32 (3xTF32) takes head_dim up to 128, not %lld", (long long)p->d);
  if (!(p->scale > 0.0f) || !isfinite(p->scale)) DECLINE("tensor-core kernel: scale must be positive and finite");
  if (p->nq > INT32_MAX / 2 || p->nk > INT32_MAX / 2) DECLINE("tensor-core kernel: sequence too long");
  /* The kernel forms offsets within a tile (at most 256 rows) in 32 bits. */
  if (p->q_stride[2] > (1 << 22) || p->k_stride[2] > (1 << 22) || p->v_stride[2] > (1 << 22) || p->o_stride[2] > (1 << 22))
    DECLINE("tensor-core kernel: row stride above 2^22 elements");
  if (!ROWS_ALIGNED(p, 16 / elem_bytes))
    DECLINE("tensor-core kernel: rows of q, k, v and o must start on 16 bytes (offsets and strides multiples of %d)",
            16 / elem_bytes);

  fcl_tile_plan t = *out;
  t.variant = FCL_VARIANT_NVIDIA_FORWARD;
  tile_rows(p, &t);
  const nvidia_forward_shape *rule = forward_default(caps, p);
  nvidia_forward_shape first = *rule; /* then forward_fallbacks */
  int copying = 0;                     /* first has a warp of padding rows (copy_warps) */
  /* Few query rows (decode): when one head's rows fill less than a block of that shape, the query heads of
     a GQA group share one work-group's tile (GQA packing: K and V are read once per kv head, not once per
     query head), and a block has just enough warps of one 16-row tile each to cover its rows (one more on a
     tiny grid, below), with 64-key tiles (32 above head_dim 128) and Q in registers. Split-KV
     (fcl_plan_splits) then fills the device. */
  const int64_t rule_rows = (int64_t)rule->warps * rule->tiles * 16;
  t.pack = p->group > 1 && p->nq < rule_rows;
  const int64_t block_rows = p->nq * (t.pack ? p->group : 1);
  /* A grid of few 128-row blocks (on the H200, 16 heads of 1024 query rows: 128 blocks on 132 units) leaves
     most compute units a single work-group of four warps, which waits out every key tile's copies and barriers
     alone. Blocks of one 16-row tile a warp, with longer key tiles, make twice the work-groups. They are taken
     where they fit one wave (11-30% faster at 128 to 192 blocks; 26-38% slower at 200 to 256, in two waves),
     and beyond it where they need no more waves than the rule's 128-row blocks, two a unit (7-14% faster at
     320, 384 and 576 blocks, two or three waves either way; docs/notes-nvidia.md v28, v29). A unit holds three
     of them by registers (164-168 a work-item, measured for problems without modifiers, sequences or windows
     other than causal, which this rule is kept to), fewer where its shared memory holds fewer, and two are
     assumed where the compute capability is not in fcl_nvidia_groups_per_unit's table. Within one wave
     fcl_plan_splits then cuts the keys into chunks for two such work-groups a unit (also where the rule's own
     shape is already this one: short causal rows); three ran 7% faster at head_dim 128 but 20-24% slower in f16
     (not bf16) at head_dim 64, where the cause was not found. At least 128 query rows: fewer were not
     measured. */
  int wave = 0;
  if (!f32 && !t.pack && p->d <= 128 && p->nq >= 128 && caps->compute_units > 0 &&
      !fcl_problem_score_mods(p) && !fcl_problem_sequences(p) && !p->sinks && fcl_problem_window_kind(p) <= 1) {
    const nvidia_forward_shape *small = &small_grid_shapes[p->d > 64];
    take_shape(caps, p, small, 0, &t);
    const int by_local = fcl_nvidia_groups_per_unit(caps, t.local_bytes);
    const int resident = by_local == 0 ? 2 : by_local < 3 ? by_local : 3;
    const double heads = (double)p->heads * (double)p->batch, units = caps->compute_units;
    const double blocks = (double)fcl_forward_row_blocks(p, &t) * heads;
    const double rule_blocks = (double)((block_rows + rule_rows - 1) / rule_rows) * heads;
    /* The rule's 128-row blocks take 255 registers: two a unit. */
    const double waves = ceil(blocks / (resident * units)), rule_waves = ceil(rule_blocks / (2 * units));
    if (fits(caps, t.local_bytes, t.wg) && resident >= 2 && (waves <= 1 || (rule->tiles > 1 && waves <= rule_waves))) {
      first = *small;
      wave = 2;
    }
  }
  if (block_rows < rule_rows && block_rows <= 64) {
    first.warps = block_rows <= 16 ? 1 : block_rows <= 32 ? 2 : 4;
    /* A grid of at most one such block per sixteen compute units (batch-1 decode with GQA packing: 8 blocks)
       leaves each chunk's tile copies to one warp with nothing beside it on its unit; a second warp, whose
       rows are padding, halves the copies' issue time (it also computes on its zero rows, which costs less).
       On the H200 (docs/notes-nvidia.md, v15) that took (1,32,8,1,4096) from 20.0 to 17.7 us dense and 29.7
       to 19.8 paged, (1,32,8,1,32768) paged 58.1 to 55.5; grids of 32 blocks or more gained nothing, and
       those between were not measured, so they keep one warp. */
    const int64_t blocks = p->batch * (t.pack ? p->kv_heads : p->heads);
    if (first.warps == 1 && caps->compute_units > 0 && blocks * 16 <= (int64_t)caps->compute_units) {
      first.warps = 2;
      copying = 1;
    }
    first.tiles = 1;
    first.keys = p->d <= (f32 ? 64 : 128) ? 64 : 32;
    first.qsmem = 0;
    /* A grid of 1.7 to 2 blocks a compute unit (two on most units, so they share each unit's loads in
       flight) runs unsplit (fcl_plan_splits), so without the combine kernel, through a ring of four 32-key
       buffers that keeps in flight what the split rule's second chunk would, with a padding warp sharing its
       copies. On the H200 (docs/notes-nvidia.md, v19) that took grids of 240 to 264 blocks 1.6-4.8% faster
       ((32,32,8,1,4096) 144.4 to 139.3 us); 136 blocks unsplit ran 47% slower than in four chunks (four units
       held two), 368 blocks 1.2% slower than in two, 512 (unsplit already) 0.6% slower. */
    const double units = caps->compute_units;
    if (first.warps == 1 && !f32 && p->d <= 128 && !p->block_table && !p->cu_k && !p->seqlens_k && units > 0 &&
        blocks >= 1.7 * units && blocks <= 2 * units) {
      first.warps = 2;
      copying = 1;
      first.keys = 32;
      first.stages = 4;
    }
  }
  /* FLASHCL_FORWARD_MMA_SHAPE (development) is tried before that shape (never with a deeper ring for paged
     keys, whose rows are resolved a tile ahead); where it does not fit, the default plan follows. */
  const int *ms = ov->forward_mma_shape;
  const nvidia_forward_shape forced = {ms[0], ms[1], ms[2], ms[3], p->block_table || ms[4] < 2 ? 2 : ms[4], ms[5]};
  const size_t nfall = sizeof forward_fallbacks / sizeof forward_fallbacks[0];
  int found = 0, took_forced = 0;
  for (size_t i = ms[0] ? 0 : 1; i <= nfall + 1 && !found; ++i) {
    const nvidia_forward_shape *sh = i == 0 ? &forced : i == 1 ? &first : &forward_fallbacks[i - 2];
    take_shape(caps, p, sh, i == 1 ? copying : 0, &t);
    found = fits(caps, t.local_bytes, t.wg);
    took_forced = found && i == 0;
    t.copy_warps = found && i == 1 ? copying : 0;
    t.wave = found && i == 1 ? wave : 0;
  }
  if (!found) DECLINE("tensor-core kernel: %zu B of local memory is too little", (size_t)caps->local_mem_size);
  t.splits = fcl_plan_splits(caps, ov, p, &t);
  char qsplit[32] = ""; /* (qregs is at most 15; the mask tells the compiler the text fits) */
  if (t.qregs) snprintf(qsplit, sizeof qsplit, " past its first %d columns", 16 * (t.qregs & 15));
  snprintf(t.reason, sizeof t.reason,
           "tensor cores (mma.sync %s) on compute capability %d.%d: %d warps%s x %d m16 tiles, %d %s, "
           "%d-key tiles in %d buffers%s, Q in %s%s, %zu B local%s",
           f32 ? "m16n8k8 3xTF32" : "m16n8k16", caps->nv_cc_major, caps->nv_cc_minor, t.tr,
           t.copy_warps ? " (one of padding rows)" : "", t.rm, t.br,
           t.pack ? "(query row, head) rows packed per kv head" : "query rows", t.bc,
           t.stages, t.mbar_ring ? " on mbarriers" : "", t.qsmem ? "local memory" : "registers", qsplit, t.local_bytes,
           t.wave ? " (small grid)" : took_forced ? " (FLASHCL_FORWARD_MMA_SHAPE)" : "");
  *out = t;
  return 0;
#undef DECLINE
}

/* ---- The tensor-core backward (cl/nvidia/flash_bwd_mma.cl): dK/dV and dQ ---- */

/* The dQ kernel keeps Q and dO rows in local memory where a warp owns two m16 tiles above a padded head_dim of 64:
   their fragments would not fit in registers beside the tiles' dQ accumulators. flash_bwd_mma.cl's QLOCAL is the
   same predicate on its defines (QT, DP); the two must agree. */
static int dq_rows_local(int tiles, int dp) { return tiles > 1 && dp > 64; }

size_t fcl_nvidia_backward_local_bytes(const fcl_tile_plan *p, int which, int elem_bytes) {
  if (which == FCL_BWD_DKDV) { /* two buffers of Q and dO [br][ds], the second shared with K and V [bc][ds] (read
                                  into registers before step 1), or when they outgrow it but each fits a buffer,
                                  K over the second and V over the first, or with kv_resident K and V after both;
                                  f32 reads K and V from global memory and keeps the two buffers alone; lse and
                                  Dvec [2][br] */
    const size_t br = (size_t)p->br, bc = (size_t)p->bc;
    const size_t rows = p->kv_resident ? 4 * br + 2 * bc
                        : elem_bytes == 4 || (bc > br && bc <= 2 * br) ? 4 * br
                                                                       : 2 * br + (2 * bc > 2 * br ? 2 * bc : 2 * br);
    const size_t exchange = p->kv_resident == 2 ? bc * (br + 8) : 0; /* WARP2D's P^T / dS^T tile [bc][br + 8] */
    return (rows * (size_t)p->ds + exchange) * (size_t)elem_bytes + 4 * br * sizeof(float);
  }
  /* dQ: K and V [2][bc][ds], reused for the dQ tile [br][ds] at the end; with two tiles a warp above a padded
     head_dim of 64, Q and dO [br][ds] after them. */
  const size_t kv = 4 * (size_t)p->bc * (size_t)p->ds, o = (size_t)p->br * (size_t)p->ds;
  if (dq_rows_local(p->rm, p->dp)) return (kv + 2 * o) * (size_t)elem_bytes;
  return (kv > o ? kv : o) * (size_t)elem_bytes;
}

/* ---- The tensor-core backward's default shapes (NVIDIA, compute capability 8.0 and above) ---- */

/* warps (owned rows: 16 a warp, keys for dK/dV, query rows for dQ; 32 for dQ with two tiles) and rows streamed per
   step. */
typedef struct nvidia_backward_shape {
  int warps, streamed, kv_resident; /* kv_resident: the dK/dV kernel's K and V stay in local memory (KV_RESIDENT) */
  int tiles;                        /* m16 tiles a warp (QT), 1 or 2: of query rows (dQ) or keys (dK/dV) */
} nvidia_backward_shape;

/* The first shapes by head_dim. Registers bound them as much as local memory (48 KiB a work-group as NVIDIA's
   OpenCL reports it, 16 bytes of it kept by the compiler; more for a kernel's own arrays, caps->nv_static_local):
   dK/dV keeps dK and dV accumulators (DP / 2 registers a lane for 16 keys); dQ keeps Q and dO fragments and dQ
   in registers and streams K, V through two buffers. f32 reads the fragments from global memory at each use
   (4-byte elements: half the rows a buffer). The first row that applies is taken: a `two_a_unit` row only where
   both kernels' work-groups, beyond the 48 KiB NVIDIA's OpenCL reports, fit the device two a multiprocessor (by
   compute capability, fcl_nvidia_groups_per_unit), a `no_mask` row only for problems without an additive mask, a
   `no_score_mods` row only for problems whose scores go through no modifier (softcap, ALiBi or a mask), and a row
   with `above_head_dim` only above that head_dim. A row's two dQ tiles give way to `dq_windowed` (one tile) where
   a window (causal included) hides keys from rows and there are at most `windowed_rows` query rows: the dQ
   work-groups then differ in work, and twice as many smaller ones even it out. The planner has declined head_dims
   above 128. */
typedef struct nvidia_backward_default {
  int max_head_dim;
  nvidia_backward_shape dkdv, dq;
  int two_a_unit, no_mask, no_score_mods, above_head_dim;
  int64_t windowed_rows;
  nvidia_backward_shape dq_windowed;
} nvidia_backward_default;
static const nvidia_backward_default backward_defaults[] = {
    /* dK/dV: 4 warps of two m16 tiles of keys (128 keys), 128-row steps taken in chunks of 32, K and V kept in local
       memory (110 KiB); dQ as in the next row. On an H100 8.5-12% less backward time than the next row at head_dim 64
       (causal the least), 10-15% at head_dim 32, where that row does not apply, 6-15% with a softcap or ALiBi, but 30%
       more with an f16 mask, which keeps the next rows (docs/notes-nvidia.md v49, v50). Not measured at head_dim 16
       and below. */
    {.max_head_dim = 64, .dkdv = {4, 128, 1, 2}, .dq = {4, 64, 0, 2}, .two_a_unit = 1, .no_mask = 1,
     .above_head_dim = 16, .windowed_rows = 1024, .dq_windowed = {4, 64, 0, 1}},
    /* dK/dV: 4 warps (64 keys), 128-row steps, K and V kept in local memory (KV_RESIDENT, 92 KiB); dQ: 4 warps of
       two m16 tiles of query rows (QT, 128 rows), 64-key tiles (36 KiB). On an H100 at head_dim 64 3-5% faster than
       the next row not causal, 0-3% causal, equal with a softcap; 2% slower at head_dim 32 and 62% slower with an
       f16 mask, which keep the next row (docs/notes-nvidia.md v39, v40). The two dQ tiles: 1-6% less backward time
       than one, but 2-3% more causal at 1024 rows (v45). */
    {.max_head_dim = 64, .dkdv = {4, 128, 1, 1}, .dq = {4, 64, 0, 2}, .two_a_unit = 1, .no_mask = 1,
     .above_head_dim = 32, .windowed_rows = 1024, .dq_windowed = {4, 64, 0, 1}},
    /* dK/dV: 4 warps (64 keys), 64-row steps (37 KiB: a Q, dO buffer 18 KiB, the second over K and V);
       dQ: 4 warps of two m16 tiles (128 query rows), 64-key tiles (36 KiB); 3.3% less backward time than one tile with
       an f16 mask (v45). Shapes timed on the H200: docs/notes-nvidia.md, v17. */
    {.max_head_dim = 64, .dkdv = {4, 64, 0, 1}, .dq = {4, 64, 0, 2}, .windowed_rows = 1024,
     .dq_windowed = {4, 64, 0, 1}},
    /* The next row with FlashAttention-2's warp tiles in the dK/dV kernel (WARP2D: pairs of warps share a P^T / dS^T
       exchange tile, 9 KiB more): on an H100 at head_dim 128 0.9-2.3% faster without a modifier (a window included),
       0.2-0.7% at head_dim 96, but 1-10% slower with a softcap, ALiBi or a mask (docs/notes-nvidia.md v44). dQ as
       in the next row. */
    {.max_head_dim = 128, .dkdv = {4, 64, 2, 1}, .dq = {4, 32, 0, 2}, .two_a_unit = 1, .no_score_mods = 1,
     .windowed_rows = 1024, .dq_windowed = {4, 64, 0, 1}},
    /* dK/dV: 4 warps (64 keys), 64-row steps, K and V kept in local memory after both step buffers (KV_RESIDENT,
       103 KiB) and read with ldmatrix at each step, which leaves their 64 registers a lane to the step; on an H100
       8-10% faster than the next row at head_dim 128 (docs/notes-nvidia.md v38). dQ: 4 warps of two m16 tiles (128
       query rows) with Q and dO in local memory after two 32-key K and V buffers (102 KiB; QLOCAL): on an H100 at
       head_dim 128 3.5-6.8% less backward time than one tile with 64-key tiles (68 KiB), which stays where a window
       hides keys from at most 1024 query rows (v47, v48); 1.5% less with an f16 mask (v48). */
    {.max_head_dim = 128, .dkdv = {4, 64, 1, 1}, .dq = {4, 32, 0, 2}, .two_a_unit = 1, .windowed_rows = 1024,
     .dq_windowed = {4, 64, 0, 1}},
    /* dK/dV: 4 warps (64 keys), 32-row steps (35 KiB: K over the second step buffer, V over the first; 128
       accumulator registers), 3% faster than 2 warps (v20); dQ: 4 warps, 32-key tiles (34 KiB). */
    {.max_head_dim = 128, .dkdv = {4, 32, 0, 1}, .dq = {4, 32, 0, 1}},
};
static const nvidia_backward_default backward_defaults_f32[] = {
    /* dK/dV: 4 warps (64 keys), 32-row steps (35 KiB of step buffers); dQ: 4 warps, 32-key tiles (34 KiB). */
    {.max_head_dim = 64, .dkdv = {4, 32, 0, 1}, .dq = {4, 32, 0, 1}},
    /* 32-row steps and 32-key tiles (66.5 and 66 KiB): each K or V fragment a warp reads and splits serves twice
       the products of 16: on an H100 20% faster than the next row (docs/notes-nvidia.md v37). */
    {.max_head_dim = 128, .dkdv = {4, 32, 0, 1}, .dq = {4, 32, 0, 1}, .two_a_unit = 1},
    /* 16-row steps and 16-key tiles (33 KiB each). */
    {.max_head_dim = 128, .dkdv = {4, 16, 0, 1}, .dq = {4, 16, 0, 1}},
};

/* Then smaller shapes for devices with less local memory, per kernel (FCL_BWD_*), in this order (dK/dV first
   2 warps with 32-row steps, head_dim 128's default before v20). */
static const nvidia_backward_shape backward_fallbacks[2][3] = {{{2, 32, 0, 1}, {2, 16, 0, 1}, {1, 16, 0, 1}},
                                                               {{4, 16, 0, 1}, {2, 16, 0, 1}, {1, 16, 0, 1}}};

/* Kernel `which`'s (FCL_BWD_*) plan fields and local memory for shape sh. */
static void take_backward_shape(const fcl_problem *p, const nvidia_backward_shape *sh, int which, fcl_tile_plan *t) {
  memset(t, 0, sizeof *t);
  t->variant = FCL_VARIANT_NVIDIA_BACKWARD;
  t->head_dim = (int)p->d;
  tile_rows(p, t);
  t->tc = 32;
  t->rm = 1;
  t->splits = 1;
  t->tr = sh->warps;
  t->wg = t->tr * 32;
  if (which == FCL_BWD_DKDV) {
    t->br = sh->streamed; /* query rows streamed per step */
    t->kv_resident = p->dtype == FCL_DTYPE_F32 ? 0 : sh->kv_resident;
    /* FlashAttention-2's warp tiles take 4 warps and steps and padded head dims of multiples of 32. */
    if (t->kv_resident == 2 && (t->tr != 4 || t->br % 32 || t->dp % 32)) t->kv_resident = 1;
    /* Two m16 tiles of keys a warp (QT) take K and V resident without the warp tiles, and a padded head_dim up to
       64: their dK and dV accumulators are 128 registers a lane, beside S^T and dP^T of a step's rows, which they
       take in chunks of 32. flash_bwd_mma.cl refuses QT 2 in the dK/dV kernel outside these conditions; the two
       must agree. */
    t->rm = sh->tiles == 2 && t->kv_resident == 1 && t->dp <= 64 && t->br % 32 == 0 ? 2 : 1;
    t->bc = t->tr * 16 * t->rm; /* key rows owned */
  } else {
    /* Two m16 tiles a warp (QT) take f16 or bf16: each ldmatrix of K or V then feeds both tiles' products, and
       their Q, dO and dQ fragments double (64 more registers at head_dim 64); above a padded head_dim of 64 Q and
       dO stay in local memory (QLOCAL), read in chunks of 32 keys, which takes key tiles of a multiple of 32. */
    t->rm = sh->tiles == 2 && p->dtype != FCL_DTYPE_F32 && (!dq_rows_local(2, t->dp) || sh->streamed % 32 == 0) ? 2 : 1;
    t->br = t->tr * 16 * t->rm; /* query rows owned */
    t->bc = sh->streamed;       /* key rows streamed per tile */
  }
  t->local_bytes = fcl_nvidia_backward_local_bytes(t, which, (int)p->elem_size);
}

static const nvidia_backward_default *backward_default(const fcl_device_caps *caps, const fcl_problem *p) {
  const int f32 = p->dtype == FCL_DTYPE_F32;
  const nvidia_backward_default *table = f32 ? backward_defaults_f32 : backward_defaults;
  const size_t n = f32 ? sizeof backward_defaults_f32 / sizeof backward_defaults_f32[0]
                       : sizeof backward_defaults / sizeof backward_defaults[0];
  for (size_t i = 0; i < n; ++i) {
    if (p->d > table[i].max_head_dim || p->d <= table[i].above_head_dim || (table[i].no_mask && p->mask) ||
        (table[i].no_score_mods && fcl_problem_score_mods(p)))
      continue;
    int take = 1;
    for (int which = 0; which < 2 && take && table[i].two_a_unit; ++which) {
      fcl_tile_plan t;
      take_backward_shape(p, which == FCL_BWD_DKDV ? &table[i].dkdv : &table[i].dq, which, &t);
      take = fits_rule(caps, t.local_bytes, t.wg, 1);
    }
    if (take) return &table[i];
  }
  return &table[n - 1];
}

int fcl_plan_nvidia_backward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p,
                             unsigned flags, const size_t *kernel_wg, fcl_tile_plan out[2]) {
  (void)kernel_wg;
  memset(out, 0, 2 * sizeof *out);
  out[0].variant = out[1].variant = -1;
  out[0].head_dim = out[1].head_dim = (int)p->d;
#define DECLINE(...)                                              \
  do {                                                            \
    snprintf(out[0].reason, sizeof out[0].reason, __VA_ARGS__);  \
    memcpy(out[1].reason, out[0].reason, sizeof out[1].reason);   \
    return -1;                                                    \
  } while (0)
  if (flags & FCL_FLAG_PORTABLE_ONLY) DECLINE("portable only by request");
  if (caps->vendor != FCL_VENDOR_NVIDIA) DECLINE("tensor-core backward: not an NVIDIA platform");
  if (caps->nv_cc_major < 8)
    DECLINE("tensor-core backward: compute capability %d.%d is below 8.0", caps->nv_cc_major, caps->nv_cc_minor);
  const int f32 = p->dtype == FCL_DTYPE_F32, elem_bytes = (int)p->elem_size;
  /* 128 accumulator registers of dK and dV a lane at head_dim 128 (16 keys a warp): above it they would spill. */
  if (p->d % 8 != 0 || p->d > 128)
    DECLINE("tensor-core backward: head_dim %lld is not a multiple of 8 up to 128", (long long)p->d);
  if (!(p->scale > 0.0f) || !isfinite(p->scale)) DECLINE("tensor-core backward: scale must be positive and finite");
  if (p->block_table) DECLINE("tensor-core backward: paged K/V is not taken by the backward");
  if (p->nq > INT32_MAX / 2 || p->nk > INT32_MAX / 2) DECLINE("tensor-core backward: sequence too long");
  /* The kernels form offsets within a tile (at most 256 rows) in 32 bits. */
  if (p->q_stride[2] > (1 << 22) || p->k_stride[2] > (1 << 22) || p->v_stride[2] > (1 << 22) || p->o_stride[2] > (1 << 22))
    DECLINE("tensor-core backward: row stride above 2^22 elements");
  /* d_o, d_q, d_k, d_v share the strides and offsets of o, q, k, v. */
  if (!ROWS_ALIGNED(p, 16 / elem_bytes))
    DECLINE("tensor-core backward: rows of q, k, v and o must start on 16 bytes (offsets and strides multiples of %d)",
            16 / elem_bytes);

  nvidia_backward_default chosen = *backward_default(caps, p);
  if (fcl_problem_windowed(p) && p->nq <= chosen.windowed_rows) chosen.dq = chosen.dq_windowed;
  const nvidia_backward_default *first = &chosen;
  /* FLASHCL_BACKWARD_SHAPE (development) is tried before the default shapes, which follow where it does not fit. */
  const int *bs = ov->backward_shape;
  const nvidia_backward_default forced = {
      .max_head_dim = (int)p->d, .dkdv = {bs[0], bs[1], bs[4], bs[6]}, .dq = {bs[2], bs[3], 0, bs[5]}};
  const size_t nfall = sizeof backward_fallbacks[0] / sizeof backward_fallbacks[0][0];
  for (int which = 0; which < 2; ++which) {
    fcl_tile_plan t;
    memset(&t, 0, sizeof t);
    int found = 0, took_forced = 0;
    for (size_t i = bs[0] ? 0 : 1; i <= nfall + 1 && !found; ++i) {
      const nvidia_backward_default *shapes = i == 0 ? &forced : first;
      const nvidia_backward_shape *sh = i > 1 ? &backward_fallbacks[which][i - 2]
                                        : which == FCL_BWD_DKDV ? &shapes->dkdv : &shapes->dq;
      take_backward_shape(p, sh, which, &t);
      found = fits(caps, t.local_bytes, t.wg);
      took_forced = found && i == 0;
    }
    if (!found) DECLINE("tensor-core backward: %zu B of local memory is too little", (size_t)caps->local_mem_size);
    if (which == FCL_BWD_DKDV)
      snprintf(t.reason, sizeof t.reason,
               "tensor-core backward (mma.sync %s) on compute capability %d.%d: dK/dV %d warps x %d keys, "
               "%d query rows a step%s, %zu B local%s",
               f32 ? "m16n8k8, f32 as 3xTF32" : "m16n8k16", caps->nv_cc_major, caps->nv_cc_minor, t.tr, 16 * t.rm, t.br,
               t.kv_resident == 2 ? ", K and V in local memory, warp tiles 32 x 32"
               : t.kv_resident ? ", K and V in local memory" : "", t.local_bytes,
               took_forced ? " (FLASHCL_BACKWARD_SHAPE)" : "");
    else
      snprintf(t.reason, sizeof t.reason, "dQ %d warps x %d query rows, %d-key tiles, %zu B local%s", t.tr,
               16 * t.rm, t.bc, t.local_bytes, took_forced ? " (FLASHCL_BACKWARD_SHAPE)" : "");
    out[which] = t;
  }
  return 0;
#undef DECLINE
}
