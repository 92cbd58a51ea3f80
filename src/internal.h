/* Internal declarations shared by the host runtime's files. Nothing here is installed. */
#ifndef FLASHCL_INTERNAL_H
#define FLASHCL_INTERNAL_H

#include "flashcl.h"

#include <pthread.h>
#include <stdarg.h>

/* ---- status.c: the calling thread's last error ---- */

/* Records a formatted message for fcl_last_error() and returns status, so a failure reads
   `return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->head_dim is %lld", ...)`. */
fcl_status fcl_fail(fcl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fcl_clear_error(void);
/* How many failures fcl_fail has recorded on the calling thread: tells whether a step wrote the last error. */
unsigned long fcl_failure_count(void);
const char *fcl_cl_error_name(cl_int code);

/* Checks one OpenCL call; on failure records "<call text>: <error name> (<code>)" and returns
   FCL_ERROR_OPENCL (FCL_ERROR_OUT_OF_RESOURCES for allocation failures) from the enclosing function. */
#define FCL_CL_CHECK(call)                                                                  \
  do {                                                                                      \
    cl_int fcl_cl_err_ = (call);                                                            \
    if (fcl_cl_err_ != CL_SUCCESS) return fcl_cl_failure(#call, fcl_cl_err_);              \
  } while (0)
fcl_status fcl_cl_failure(const char *call_text, cl_int code);

/* ---- device.c: what the library needs to know about a device ---- */

enum { FCL_VENDOR_OTHER, FCL_VENDOR_NVIDIA, FCL_VENDOR_AMD, FCL_VENDOR_INTEL };
/* Sub-group shuffles: none; OpenCL's (cl_intel_subgroups, or cl_khr_subgroup_shuffle with cl_khr_subgroups);
   NVIDIA's warp shuffles through PTX. The values are flash_fwd.cl's SUBGROUP. */
enum { FCL_SG_NONE, FCL_SG_OPENCL, FCL_SG_NVIDIA_WARP };

typedef struct fcl_device_caps {
  char platform_name[128], platform_version[128];
  char device_name[256], device_version[128], driver_version[128], vendor_name[128];
  int vendor;               /* FCL_VENDOR_*, from the platform and device vendor strings */
  int is_cpu, is_gpu;
  cl_uint compute_units;
  cl_ulong local_mem_size;  /* bytes of local memory one work-group may use */
  int local_mem_dedicated;  /* CL_LOCAL (on-chip) rather than CL_GLOBAL */
  cl_ulong global_mem_size, max_alloc_size;
  size_t max_work_group_size;
  size_t max_work_item_size0;
  size_t preferred_multiple; /* preferred work-group size multiple (warp / wavefront / SIMD width) */
  int has_fp16, has_fp64;
  /* A CPU whose OpenCL runs a sub-group's work-items as SIMD lanes (Intel's CPU runtime): the planners give it
     GPU-like rows of work-items instead of other CPUs' few large ones. */
  int cpu_simd_subgroups;
  /* FCL_SG_*: the sub-group shuffles kernels may use (the portable forward's row reductions). NVIDIA's warp
     shuffles only under FLASHCL_SUBGROUPS=on until they are measured; FLASHCL_SUBGROUPS=off takes any away. */
  int sg_shuffle;
  int sg_required; /* FLASHCL_SUBGROUPS=required: kernels that plan shuffles and cannot take them write NaN */
  int nv_cc_major, nv_cc_minor; /* NVIDIA compute capability; 0 when not reported */
  /* NVIDIA: bytes of local memory a kernel's own __local arrays may take, the multiprocessor's per-block maximum
     by compute capability (0 where unknown). NVIDIA's OpenCL reports 48 KiB (CL_DEVICE_LOCAL_MEM_SIZE), which
     bounds __local kernel arguments; a kernel's static arrays may take up to this (docs/notes-nvidia.md, v37). */
  cl_ulong nv_static_local;
  /* loop_budget.c: measured driver quirks (fcl_device_quirks in flashcl.h). loop_budget: iterations one
     work-item may run in one launch, all loops together (0: no limit); planning keeps launches inside it. */
  unsigned long long loop_budget;
  int loop_budget_source;   /* FCL_QUIRK_* */
  int profiling_clock_unusable; /* 1 (fcl_profiling_time_unusable), 0 works, -1 not measured */
  char quirk_detail[192];
} fcl_device_caps;

/* The device's capabilities; FLASHCL_LOCAL_MEM_LIMIT and FLASHCL_MAX_WORK_GROUP_SIZE lower them (a smaller
   device, emulated). */
fcl_status fcl_probe_device(cl_device_id device, fcl_device_caps *caps);

/* ---- overrides.c: development overrides of the plans, apart from the device ---- */

/* What a developer forces on the planners (tuning, tests), read once per context; every planner takes it beside
   the capabilities. Zero: none. */
typedef struct fcl_plan_overrides {
  /* FLASHCL_FORWARD_SHAPE: the portable forward's shape, used when it fits: tr, tc, rm, rn (tr 0: none) and kt
     (-1: by device type). */
  int forward_shape[5];
  int forward_splits; /* FLASHCL_FORWARD_SPLITS: the split-KV count of every forward (0: the planner's) */
  /* FLASHCL_BACKWARD_SHAPE: the tensor-core backward's first shapes, used where they fit: dK/dV warps and query
     rows a step, dQ warps and keys a tile (0: none), whether dK/dV keeps K and V in local memory (2: with warp
     tiles), the dQ kernel's m16 tiles a warp and the dK/dV kernel's */
  int backward_shape[7];
  /* FLASHCL_FORWARD_MMA_SHAPE: the tensor-core forward's first shape, used where it fits: warps, m16 tiles a
     warp, key-tile rows, Q tile in local memory, K/V tile buffers of its ring, Q's k steps in registers with
     the tile in local memory (warps 0: none) */
  int forward_mma_shape[6];
  /* FLASHCL_PORTABLE_BACKWARD_SHAPE: the portable backward's shapes, used where they fit: tr, tc, rm, rn of the
     dK/dV kernel, then of the dQ kernel (tr 0: none) */
  int portable_backward_shape[8];
} fcl_plan_overrides;

void fcl_read_plan_overrides(fcl_plan_overrides *out);
/* Parses FLASHCL_FORWARD_SHAPE's "tr,tc,rm,rn[,kt]" into shape (kt -1 when absent): 0 when it is four or
   five integers within bounds (tr, tc 1..4096; rm, rn 1..256; kt -1..1), else -1 and shape untouched. */
int fcl_parse_forward_shape(const char *text, int shape[5]);
/* Parses FLASHCL_BACKWARD_SHAPE's "dkdv_warps,dkdv_rows,dq_warps,dq_keys[,kv_resident[,dq_tiles[,dkdv_tiles]]]": 0
   when it is four to seven integers, warps 1..8, rows or keys multiples of 16 in 16..128, kv_resident 0, 1 or 2 (0
   when absent) and the tiles 1 or 2 (1 when absent), else -1 and shape untouched. */
int fcl_parse_backward_shape(const char *text, int shape[7]);
/* Parses FLASHCL_FORWARD_MMA_SHAPE's "warps,tiles,keys,qsmem[,stages[,qregs]]": 0 when it is four to six
   integers, warps 1..8, tiles 1..4, keys a multiple of 16 in 16..128, qsmem 0 or 1, stages 2..8 (2 when absent),
   qregs 0..15 (0 when absent), else -1 and shape untouched. */
int fcl_parse_forward_mma_shape(const char *text, int shape[6]);
/* Parses FLASHCL_PORTABLE_BACKWARD_SHAPE's "tr,tc,rm,rn" (both kernels) or "tr,tc,rm,rn,tr,tc,rm,rn" (dK/dV, then
   dQ) into shape[8]: 0 when it is four or eight integers, tr and tc 1..4096, rm and rn 1..256, else -1 and shape
   untouched. */
int fcl_parse_portable_backward_shape(const char *text, int shape[8]);

/* ---- loop_budget.c: the per-work-item loop budget and the profiling clock, measured once ---- */

/* Fills caps' quirk fields: $FLASHCL_LOOP_BUDGET, else the record in cache_dir (NULL: none), else a run of
   cl/loop_budget.cl, whose result is then recorded there. Never fails: a probe that cannot run leaves "no
   limit" with the reason in caps->quirk_detail. */
void fcl_measure_device_quirks(cl_context context, cl_device_id device, const char *cache_dir, fcl_device_caps *caps);
/* One run of the probe kernel asking for n iterations: *count completed, *clock_unusable 1 when its profiling
   times fail fcl_profiling_time_unusable. */
fcl_status fcl_run_loop_probe(cl_context context, cl_device_id device, int n, int *count, int *clock_unusable);
/* 1 when an event's profiling START and END cannot time a command that took wall_ns on the host (enqueue to
   completion): zero, not increasing, or under a thousandth of the wall time (rusticl on llvmpipe counts 0, 1,
   2, 3 ns per command). Used wherever the library times with events. */
int fcl_profiling_time_unusable(cl_ulong start, cl_ulong end, double wall_ns);
/* The record's file in dir for caps' device (malloc'd), or NULL when dir is NULL. */
char *fcl_loop_budget_file_path(const fcl_device_caps *caps, const char *dir);

/* ---- plan.c: tile sizes and work-group shape (pure functions of capabilities and problem) ---- */

/* The kernel variants (variants.c): index into fcl_variants, each operation's vendor variants before its
   portable one. */
enum {
  FCL_VARIANT_NVIDIA_FORWARD,
  FCL_VARIANT_PORTABLE_FORWARD,
  FCL_VARIANT_NVIDIA_BACKWARD,
  FCL_VARIANT_PORTABLE_BACKWARD,
  FCL_VARIANT_COUNT
};

typedef struct fcl_tile_plan {
  int variant;      /* FCL_VARIANT_* it plans; -1 in a declined plan */
  int head_dim;     /* D: the problem's head_dim */
  int dp;           /* D padded to a multiple of tc */
  int ds;           /* row stride of the local Q/K/V tiles (dp, or dp + 1 against bank conflicts) */
  int br, bc;       /* query rows per work-group, key rows per tile */
  int tr, tc;       /* work-items arranged tr x tc */
  int rm, rn, dn;   /* per work-item: rm query rows, rn key columns of S, dn columns of O */
  int wg;           /* tr * tc */
  int kt;           /* portable forward: K tile kept transposed (CPUs) */
  int qsmem;        /* nvidia_mma forward: Q tile kept in local memory (fragments loaded per k step) */
  int qregs;        /* nvidia_mma forward with qsmem: Q's first qregs k steps kept in registers, the local tile
                       holding only the columns after them (QREG) */
  int splits;       /* forward: chunks each block's keys are split into (1: none; SPLIT in common.cl) */
  int stages;       /* nvidia_mma forward: K/V tile buffers in its ring (STAGES; 2..8, stages - 1 in flight) */
  int direct;       /* portable forward: S and P V read K and V from global memory, not from local tiles
                       (DIRECT in flash_fwd.cl: few rows on a CPU) */
  int pack;         /* forward: GQA packing, a work-group's rows are (query row, head) pairs of one kv head's
                       group (PACK in common.cl; fcl_forward_packs for the portable kernel, plan_nvidia.c's own
                       rule for the tensor-core kernel) */
  int mbar_ring;    /* nvidia_mma forward: the K/V ring synchronised by mbarriers, not barriers (MBAR_RING;
                       compute capability 9.0, dense keys, more than one warp of real rows: plan_nvidia.c) */
  int copy_warps;   /* nvidia_mma forward: warps whose rows are all padding, added for their share of the tile
                       copies (batch-1 decode, plan_nvidia.c); fcl_plan_splits counts only the others */
  int kv_resident;  /* nvidia_mma backward's dK/dV: K and V tiles stay in local memory, their fragments read at each
                       step (KV_RESIDENT in flash_bwd_mma.cl); 2: with FlashAttention-2's warp tiles (WARP2D) */
  int wave;         /* nvidia_mma forward on a small grid (plan_nvidia.c): the work-groups a compute unit is to
                       run at once, for which fcl_plan_splits cuts the keys into chunks (0: not such a plan) */
  int subgroup;     /* portable forward: FCL_SG_* shuffles for the row maxima and sums (SUBGROUP in flash_fwd.cl) */
  int sg_required;  /* portable forward: SUBGROUP_REQUIRED (FLASHCL_SUBGROUPS=required, rows of tc > 1) */
  size_t local_bytes;
  char reason[256];
} fcl_tile_plan;

/* Every planner has one signature (fcl_planner, variants.c): the device's capabilities, the development
   overrides (fcl_plan_overrides), the resolved problem, flags (the context's FCL_FLAG_*, and FCL_PLAN_RULE) and
   kernel_wg, per kernel of the variant the work-items its built kernel admits (NULL, or 0 for a kernel: the
   device's limits alone). It returns 0 and a plan per kernel of the variant (out[0], and out[1] for the
   backward's dQ), or -1 with out[0].reason saying why not. Each planner's defaults per device class are const
   tables beside it. */
struct fcl_problem;

/* A planner bit beside the public FCL_FLAG_*: the portable forward's rule for the problem's head_dim alone (no
   FLASHCL_FORWARD_SHAPE, tuned or few-row shape, no GQA packing, no paged reserve): the default fcl_tune_forward
   compares its candidates against. */
#define FCL_PLAN_RULE (1u << 30)

/* The portable planners' defaults: a table of the first tc (work-items across head_dim) by head_dim, read as
   the first row with head_dim <= max_head_dim (the last row beyond); and the (rm, rn) blocks of rows and keys a
   work-item takes, tried largest first for each (tr, tc). */
typedef struct fcl_tc_row {
  int max_head_dim, tc;
} fcl_tc_row;
int fcl_first_tc(const fcl_tc_row *rows, size_t n, int head_dim);
/* The smallest power of two of work-items a row that leaves each at most max_columns of head_dim's columns. */
int fcl_row_width(int head_dim, int max_columns);
typedef struct fcl_item_block {
  int rm, rn;
} fcl_item_block;
#define FCL_ITEM_BLOCKS 9
extern const fcl_item_block fcl_item_blocks[FCL_ITEM_BLOCKS];

/* The largest work-group a plan may use: the device's limits and the kernel's own (0: none). */
size_t fcl_work_group_limit(const fcl_device_caps *caps, size_t kernel_max_wg);
/* Local memory the portable forward kernel uses for plan p. */
size_t fcl_forward_local_bytes(const fcl_tile_plan *p);
/* The portable forward (cl/flash_fwd.cl): FLASHCL_FORWARD_SHAPE when it fits, else the rule's plan by device
   type; for a problem of fewer query rows (or packed GQA rows) than the rule's block, blocks just large enough
   (decode); paged keys plan within the local memory their block indices leave. Never declines a head_dim in
   1..FCL_MAX_HEAD_DIM on a device with room for one work-item's tile. */
int fcl_plan_forward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const struct fcl_problem *p,
                     unsigned flags, const size_t *kernel_wg, fcl_tile_plan *out);

/* The most chunks split-KV cuts a block's keys into. */
#define FCL_MAX_SPLITS 128
/* Split-KV: how many chunks to cut each row block's keys into when p's work-groups under plan t cannot
   fill the device (ov->forward_splits instead when set). The portable kernel: the smallest count whose wave
   efficiency is within 85% of the best (FlashAttention-2's rule), counting two work-groups per compute unit on
   a GPU and one on a CPU, at most FCL_MAX_SPLITS and the block's key tiles. The tensor-core kernel: about four
   warps a compute unit, chunks of at least four tiles; with paged keys up to 1.5x that (plan.c says why); a
   small grid's plan (t->wave) as many chunks as give each unit t->wave work-groups. */
/* Work-groups of local_bytes each that one multiprocessor of caps holds by shared memory; 0 when its compute
   capability is not in the table (plan_nvidia.c). */
int fcl_nvidia_groups_per_unit(const fcl_device_caps *caps, size_t local_bytes);
/* The most shared memory one block may take on compute capability major.minor (CUDA's table), 0 where unknown. */
cl_ulong fcl_nvidia_block_local(int major, int minor);
int fcl_plan_splits(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const struct fcl_problem *p,
                    const fcl_tile_plan *t);
/* The forward's launch under plan t: row blocks per (batch, grid head) of one chunk of keys, and the grid's
   heads (the kv heads when t packs a GQA group into each work-group, else the query heads). */
int64_t fcl_forward_row_blocks(const struct fcl_problem *p, const fcl_tile_plan *t);
int64_t fcl_forward_grid_heads(const struct fcl_problem *p, const fcl_tile_plan *t);
/* 1 when the portable forward packs p's GQA groups: few query rows (decode, speculative) sharing kv heads. */
int fcl_forward_packs(const struct fcl_problem *p);
/* The rows of one (batch, grid head) the portable forward's blocks cover: p's query rows, times the group when
   it packs. */
int64_t fcl_forward_block_rows(const struct fcl_problem *p);
/* Fills the portable forward plan of one shape: tr x tc work-items, rm x rn of S per work-item, pad
   (stagger rows across banks, 0/1), kt (K tile transposed, 0/1; -1: by device type). Returns 0 when it
   fits the device, -1 otherwise. */
int fcl_plan_forward_shape(const fcl_device_caps *caps, int head_dim, size_t kernel_max_wg, int tr, int tc, int rm,
                           int rn, int pad, int kt, fcl_tile_plan *out);

/* ---- plan_nvidia.c: the NVIDIA tensor-core kernels (cl/nvidia/flash_fwd_mma.cl, flash_bwd_mma.cl) ---- */

/* Local memory the tensor-core forward kernel uses for plan p (tr warps, rm m16 tiles, bc, ds), with paged
   keys or without. */
size_t fcl_nvidia_forward_local_bytes(const fcl_tile_plan *p, int elem_bytes, int paged);
/* The tensor-core forward's planner: its plan (splits included) when it applies to p on this device under
   flags, else -1 with out->reason saying why. kernel_wg is not used: a kernel that admits fewer work-items than
   planned is declined. */
int fcl_plan_nvidia_forward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const struct fcl_problem *p,
                            unsigned flags, const size_t *kernel_wg, fcl_tile_plan *out);
/* The NVIDIA tensor-core backward: local memory of plan p of kernel `which` (FCL_BWD_DKDV: tr warps of 16
   owned keys, bc = 16 tr, br query rows a step; FCL_BWD_DQ: br = 16 tr owned query rows, bc keys a tile) with
   elements of elem_bytes (4 for f32, else 2), and
   the planner of both kernels (out[2]); kernel_wg is not used, as for the forward. */
size_t fcl_nvidia_backward_local_bytes(const fcl_tile_plan *p, int which, int elem_bytes);
int fcl_plan_nvidia_backward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const struct fcl_problem *p,
                             unsigned flags, const size_t *kernel_wg, fcl_tile_plan out[2]);

/* ---- program.c: kernels built from embedded source with -D defines, kept per context ---- */

typedef struct fcl_program_entry fcl_program_entry;

/* Returns the kernel `name` of the program made from the listed .cl files (in order) built with
   `defines`. The kernel is shared: callers set its arguments and enqueue while holding ctx->lock. The
   caller holds ctx->lock; a build (source or disk cache) runs with it released, so state read under the
   lock before the call may have changed after it. */
fcl_status fcl_get_kernel(fcl_context *ctx, const char *const *files, int num_files, const char *name,
                          const char *defines, cl_kernel *out);
/* fcl_get_kernel for a kernel whose work-group size is its -DWG define: the largest power of two up to max_wg
   that the device and the built kernel admit (*wg); FCL_ERROR_UNSUPPORTED when none does. Caller holds
   ctx->lock. */
fcl_status fcl_get_kernel_wg(fcl_context *ctx, const char *const *files, int num_files, const char *name,
                             const char *defines, size_t max_wg, cl_kernel *out, size_t *wg);

typedef struct fcl_embedded_source {
  const char *name;
  const char *text;
} fcl_embedded_source;
extern const fcl_embedded_source fcl_embedded_sources[];
extern const int fcl_embedded_source_count;
void fcl_release_programs(fcl_context *ctx);

/* ---- variants.c: the table of kernel variants ---- */

/* The planner every variant has (plan.c, plan_backward.c, plan_nvidia.c describe its arguments). */
typedef int fcl_planner(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const struct fcl_problem *p,
                        unsigned flags, const size_t *kernel_wg, fcl_tile_plan *out);

/* One kernel variant of an operation. Adding one (an AMD or Intel kernel) is an entry in fcl_variants, before
   its operation's portable entry, plus its .cl file. */
typedef struct fcl_variant {
  const char *name;           /* as fcl_describe_plan reports it: "nvidia_mma", "portable" */
  const char *title;          /* in reasons: "tensor-core forward" */
  fcl_operation op;
  int vendor;                 /* FCL_VENDOR_* it is written for; FCL_VENDOR_OTHER: every device */
  const char *const *files;   /* its .cl files, in build order */
  int num_files;
  const char *const *kernels; /* its kernels: the forward's; the backward's dK/dV and dQ (FCL_BWD_*) */
  int num_kernels;
  fcl_planner *plan;          /* whether it applies to a problem on a device, and with what plan */
  /* The context's tuned plan (tune_record.c), tried before the planner (NULL: none). Not pure: caller holds
     ctx->lock. */
  int (*tuned)(fcl_context *ctx, const struct fcl_problem *p, const size_t *kernel_wg, fcl_tile_plan *out);
  /* The -D defines of kernel `which` under plan t, mods (fcl_modifier_defines, or fewer) included. */
  void (*defines)(const struct fcl_problem *p, const fcl_tile_plan *t, int which, const char *mods, char *out,
                  size_t size);
} fcl_variant;

extern const fcl_variant fcl_variants[FCL_VARIANT_COUNT];

/* Kernel `which` of variant v for plan t (its -D defines from v->defines with mods) and the work-items it
   admits (*kernel_wg). Caller holds ctx->lock. */
fcl_status fcl_variant_kernel(fcl_context *ctx, const fcl_variant *v, const struct fcl_problem *p,
                              const fcl_tile_plan *t, int which, const char *mods, cl_kernel *kernel,
                              size_t *kernel_wg);
/* Plans (the tuned plan first, unless flags has FCL_PLAN_RULE) and builds every kernel of variant v for p,
   re-planned within what a built kernel admits while it admits fewer work-items than planned. On failure
   fcl_last_error() has the detail (a build log) and why a short reason. Caller holds ctx->lock. */
fcl_status fcl_variant_build(fcl_context *ctx, const fcl_variant *v, const struct fcl_problem *p, unsigned flags,
                             const char *mods, fcl_tile_plan *plans, cl_kernel *kernels, char *why, size_t why_size);
/* The first variant of op, in table order, that plans and builds for p (*chosen, with plans and kernels). A
   vendor variant that declines or fails is passed over (one whose kernels failed to build is not tried again
   for p's dtype and head_dim); the portable variant's failure is the call's. why: the reason the vendor
   variant written for this device was passed over (any, with FCL_FLAG_PORTABLE_ONLY), else "". Caller holds
   ctx->lock. */
fcl_status fcl_select_variant(fcl_context *ctx, fcl_operation op, const struct fcl_problem *p, const char *mods,
                              const fcl_variant **chosen, fcl_tile_plan *plans, cl_kernel *kernels, char *why,
                              size_t why_size);

/* ---- tune_record.c and tune.c: tuned portable forward shapes, and the opt-in autotune that finds them ---- */

/* One portable forward shape, as fcl_plan_forward_shape takes it. */
typedef struct fcl_forward_shape {
  int tr, tc, rm, rn, pad, kt;
} fcl_forward_shape;

/* The tuned shape of one (head_dim, dtype) in a context: state 0 not looked up yet, 1 none (the rule's
   default), 2 shape. */
typedef struct fcl_tuned_slot {
  unsigned char state, tr, tc, rm, rn, pad, kt;
} fcl_tuned_slot;

/* The portable forward's tuned plan for p's (head_dim, dtype), loaded once from the disk cache and verified,
   when there is one, FLASHCL_FORWARD_SHAPE is not set, p's keys are not paged (shapes are timed without), its
   block covers no more rows than p has (fcl_forward_block_rows), and it fits within kernel_wg[0] (NULL or 0:
   only the device limit). Returns 0 with out->reason saying "tuned on this device", else -1. Caller holds
   ctx->lock. */
int fcl_plan_forward_tuned(fcl_context *ctx, const struct fcl_problem *p, const size_t *kernel_wg, fcl_tile_plan *out);
/* Records shape (NULL: the rule's default) as the tuned choice for (head_dim, dtype) in the context and, with
   a disk cache, in its tune file (NULL: the file is removed). *saved (optional): 1 when the file was
   written. Takes ctx->lock. Used by fcl_tune_forward, and by tests to make a choice deterministic. */
fcl_status fcl_tune_record(fcl_context *ctx, int head_dim, fcl_dtype dtype, const fcl_forward_shape *shape,
                           double best_ms, double default_ms, int *saved);
/* tune_record.c: plan's shape as a record, and as "tr,tc,rm,rn,kt" (FLASHCL_FORWARD_SHAPE's syntax). */
void fcl_forward_shape_of_plan(const fcl_tile_plan *t, fcl_forward_shape *s);
void fcl_forward_shape_string(const fcl_tile_plan *t, char *out, size_t size);
/* The tune file of (head_dim, dtype) in ctx's cache directory (malloc'd), or NULL without a disk cache. */
char *fcl_tune_file_path(const fcl_context *ctx, int head_dim, fcl_dtype dtype);

/* ---- scratch.c: device scratch per command queue, owned by the context (split-KV partials) ---- */

typedef struct fcl_scratch fcl_scratch;
/* The context's scratch buffer for queue, at least bytes long; *last is the completion event of its
   previous use (NULL: none, or an in-order queue, which orders the uses itself), which work that writes it
   must wait for. Caller holds ctx->lock from here
   until fcl_scratch_used. */
fcl_status fcl_scratch_get(fcl_context *ctx, cl_command_queue queue, size_t bytes, cl_mem *buf, cl_event *last);
/* Records done (retained; may be NULL) as the completion of the buffer's latest use (out-of-order queues). */
void fcl_scratch_used(fcl_context *ctx, cl_command_queue queue, cl_event done);
/* Bytes of scratch the context holds over all queues. */
size_t fcl_scratch_bytes(const fcl_context *ctx);
void fcl_scratch_release_all(fcl_context *ctx);

/* ---- context.c ---- */

struct fcl_context {
  cl_context context;
  cl_device_id device;
  fcl_device_caps caps;
  fcl_plan_overrides overrides; /* the environment's, read when the context was created */
  char *build_options; /* the caller's, may be "" */
  char *cache_dir;     /* resolved disk cache directory; NULL: no disk cache */
  char cache_refused[320]; /* why the resolved directory was not trusted (cache_dir is then NULL); "" */
  unsigned flags;
  pthread_mutex_t lock; /* guards programs and every set-args-and-enqueue on a shared kernel; released
                           by fcl_get_kernel while it builds */
  pthread_mutex_t stats_lock; /* guards the cache_* counters below */
  fcl_program_entry *programs;
  /* variants.c: the variants whose kernels failed to build, per (variant, dtype, head_dim) bit */
  unsigned char variant_failed[FCL_VARIANT_COUNT][3][(FCL_MAX_HEAD_DIM + 8) / 8];
  fcl_scratch *scratch;          /* scratch.c (guarded by lock) */
  /* cache.c: where kernel requests were served from (guarded by stats_lock) */
  uint64_t cache_memory_hits, cache_disk_hits, cache_disk_rejected, cache_source_builds, cache_disk_writes,
      cache_disk_write_failures;
  int cache_last; /* fcl_cache_source of the last kernel request */
  /* tune.c: tuned portable forward shapes per (dtype, head_dim) (guarded by lock) */
  fcl_tuned_slot tuned[3][FCL_MAX_HEAD_DIM + 1];
};

/* ---- cache.c: the on-disk binary cache (layout described at the top of cache.c) ---- */

#define FCL_CACHE_KEY_SIZE 32
#define FCL_CACHE_TAG_SIZE 16
#define FCL_CACHE_HEADER_SIZE 112 /* the fixed part; the label (kernel name, build options) follows */
typedef struct fcl_cache_key {
  unsigned char bytes[FCL_CACHE_KEY_SIZE];
} fcl_cache_key;

/* sha256.c: one-shot and incremental SHA-256. */
typedef struct fcl_sha256_state {
  uint32_t h[8];
  uint64_t length;
  unsigned char block[64];
  size_t used;
} fcl_sha256_state;
void fcl_sha256_init(fcl_sha256_state *s);
void fcl_sha256_update(fcl_sha256_state *s, const void *data, size_t n);
void fcl_sha256_final(fcl_sha256_state *s, unsigned char out[32]);
void fcl_sha256(const void *data, size_t n, unsigned char out[32]);
/* SHA-256 of (library version, platform name and version, device name and version, driver version,
   source text, build options). */
void fcl_cache_key_compute(const fcl_device_caps *caps, const char *source, const char *options,
                           fcl_cache_key *key);
void fcl_cache_key_hex(const fcl_cache_key *key, char hex[2 * FCL_CACHE_KEY_SIZE + 1]);
/* The device identity alone (platform, device, driver), recorded in each entry's header. */
void fcl_cache_device_tag(const fcl_device_caps *caps, unsigned char tag[FCL_CACHE_TAG_SIZE]);
/* 0 when dir may hold the cache: it does not exist yet, or it is a directory owned by this user that group
   and others cannot write; else -1 with why (the context then runs without the disk cache). */
int fcl_cache_dir_check(const char *dir, char *why, size_t why_size);
/* Writes <dir>/<hex key>.bin with a header and the label (name, options) for payload (temporary file +
   rename; creates dir 0700; refuses an untrusted dir). 0: written. */
int fcl_cache_write_entry(const char *dir, const fcl_cache_key *key, const unsigned char tag[FCL_CACHE_TAG_SIZE],
                          const char *name, const char *options, const void *payload, size_t size);
/* Parses the bytes of a whole entry file, with no I/O: the payload (inside data) of a well-formed entry of
   key labelled exactly (name, options) whose checksum holds, or NULL. */
const unsigned char *fcl_cache_parse_entry(const unsigned char *data, size_t size, const fcl_cache_key *key,
                                           const char *name, const char *options, size_t *payload_size);
/* The payload of the verified entry <dir>/<hex key>.bin labelled (name, options) (malloc'd; *size its
   length), or NULL when it is missing, not a regular file, too large, short, corrupt or another's. */
unsigned char *fcl_cache_read_entry(const char *dir, const fcl_cache_key *key, const char *name, const char *options,
                                    size_t *size);
/* Hooks for program.c, called with ctx->lock released (they read only what a context fixes at its creation and
   count under stats_lock). fcl_cache_load computes *key and returns a built program
   from a verified entry with its kernel `name` in *kernel, or NULL (a miss: anything that fails after the
   file is read counts as rejected). fcl_cache_store counts a source build and writes its binary. */
cl_program fcl_cache_load(fcl_context *ctx, const char *source, const char *options, const char *name,
                          fcl_cache_key *key, cl_kernel *kernel);
void fcl_cache_store(fcl_context *ctx, const fcl_cache_key *key, const char *name, const char *options,
                     cl_program program);
/* The label name of tune records (tune.c) in the cache's entry format. */
#define FCL_TUNE_ENTRY_NAME "flashcl forward tune"
/* The label name of loop-budget records (loop_budget.c). */
#define FCL_LOOP_BUDGET_ENTRY_NAME "flashcl loop budget"
void fcl_cache_note_memory_hit(fcl_context *ctx);

/* ---- chain.c: an event chain, for every operation of more than one command ---- */

/* The commands of one operation, enqueued in order, each waiting on the one before; the first waits on the
   caller's list. Their events stay alive until the last command completes or fails (see chain.c for why).
   Use:
     fcl_chain ch;
     fcl_chain_begin(&ch, queue, num_wait, wait);
     for each command:
       cl_uint nw; const cl_event *w; cl_event *ev;
       if ((st = fcl_chain_next(&ch, last, &nw, &w, &ev))) break; // nothing enqueued for this step
       err = clEnqueueNDRangeKernel(queue, kernel, ..., nw, w, ev); // or any call that returns an event
       fcl_chain_push(&ch);                                         // keeps *ev when the call made one
       if (err != CL_SUCCESS) { st = fcl_cl_failure(...); break; }
     fcl_status end = fcl_chain_end(&ch, st ? NULL : event);
     return st ? st : end;
   A command that takes no wait list (CLBlast) is passed only ev; on an in-order queue the order holds
   anyway, on an out-of-order queue put a barrier step (clEnqueueBarrierWithWaitList(queue, nw, w, ev))
   before it. Call fcl_chain_end on failure too: what was enqueued still runs and its events are released
   after it. The caller learns of a failed dependency from its event's negative status. */
typedef struct fcl_chain {
  cl_command_queue queue;
  cl_uint num_wait;
  const cl_event *wait;
  cl_event *events; /* one per enqueued command that has one, owned until fcl_chain_end hands them to a callback */
  size_t count, capacity;
  void *record; /* the callback's record, allocated with the first slot so that ending the chain allocates nothing */
  int in_order; /* an in-order queue and no wait list: only the last command gets an event */
} fcl_chain;

void fcl_chain_begin(fcl_chain *c, cl_command_queue queue, cl_uint num_wait, const cl_event *wait);
/* 1 when queue runs its commands in order (0 also when its properties cannot be read). */
int fcl_queue_in_order(cl_command_queue queue);
/* What the next command waits on (*num_wait, *wait) and where its event goes (*event: a slot set to NULL
   here, or NULL itself for a command that gets none: one not `last`, on an in-order queue, in a call without
   a wait list). `last`: the operation's last command, whose event fcl_chain_end hands out. Fails only when
   out of host memory, before anything is enqueued. */
fcl_status fcl_chain_next(fcl_chain *c, int last, cl_uint *num_wait, const cl_event **wait, cl_event **event);
/* Keeps the event the last fcl_chain_next slot received, if the command made one. */
void fcl_chain_push(fcl_chain *c);
/* Ends the chain: *event (optional; untouched when nothing was enqueued) receives the last command's event,
   which the caller releases; a callback on it releases every other event. Returns FCL_SUCCESS, or the
   failure of clSetEventCallback: then *event is untouched and the events are left unreleased, since no release
   is safe before the commands are done and waiting for them could hang on a wait list that completes later. */
fcl_status fcl_chain_end(fcl_chain *c, cl_event *event);

/* ---- desc.c: descriptor validation shared by every operation ---- */

/* Largest element index or byte count the library accepts: device addresses are 64-bit and kernels
   index with signed 64-bit arithmetic. */
#define FCL_MAX_EXTENT ((uint64_t)1 << 62)
/* a * b + c into *out; 0 on success, -1 when c or the result would exceed FCL_MAX_EXTENT. */
int fcl_mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out);

/* A validated descriptor with defaults resolved. */
typedef struct fcl_problem {
  int64_t batch, heads, kv_heads, group; /* group = heads / kv_heads */
  int64_t nq, nk, d;
  fcl_dtype dtype;
  size_t elem_size;
  float scale;
  int causal;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  int64_t q_offset, k_offset, v_offset, o_offset;
  /* Score modifiers. The window, causal folded in, as the kernels take it: key j is visible from row i
     iff p - wl <= j <= p + wr with p = i + nk - nq; wl in [0, nk] and wr in [0, nq], where nk and nq mean
     unbounded (every key of the row's range then passes). */
  int64_t wl, wr;
  float softcap; /* 0: off */
  cl_mem alibi;  /* NULL: off */
  int64_t alibi_sb, alibi_offset;
  cl_mem mask; /* NULL: off */
  fcl_dtype mask_dtype;
  int64_t mask_stride[3], mask_offset;
  cl_mem sinks, d_sinks; /* NULL: off */
  /* Sequences (NULL: dense). With cu_q, nq is the longest sequence's query rows and q, o are packed
     [total_q, heads, d]; with cu_k likewise for k, v; with block_table, k and v are pools of num_blocks
     blocks of block_size rows. */
  cl_mem cu_q, cu_k, seqlens_k, block_table;
  int64_t total_q, total_k, table_stride, block_size, num_blocks;
  /* What the strides of q and o (q_counts) and of k and v (kv_counts) step over: (batch, heads, rows)
     dense, (1, heads, total) packed, (num_blocks, kv_heads, block_size) paged. */
  int64_t q_counts[3], kv_counts[3];
} fcl_problem;

/* 1 when p has packed or paged sequences (cu_q, cu_k, seqlens_k or block_table). */
int fcl_problem_sequences(const fcl_problem *p);

/* 1 when some key is hidden from some row by the window (a causal mask included). */
int fcl_problem_windowed(const fcl_problem *p);
/* The window as common.cl's WINDOW takes it: 0 none, 1 causal only, 2 any other window. */
int fcl_problem_window_kind(const fcl_problem *p);
/* 1 when p's scores go through a modifier (softcap, ALiBi or a mask): the kernels' SCORE_MODS. */
int fcl_problem_score_mods(const fcl_problem *p);
/* The -D defines of p's window and modifiers (WINDOW, SOFTCAP, ALIBI, MASK, SINKS; common.cl), with a
   leading space. */
void fcl_modifier_defines(const fcl_problem *p, char *out, size_t size);
/* The -D defines of p's sequence layout alone (VARLEN_Q, KV, SEQLENS_K; common.cl), with a leading space; ""
   for dense tensors. fcl_modifier_defines ends with them. */
void fcl_sequence_defines(const fcl_problem *p, char *out, size_t size);
/* Sets the sequence arguments (FCL_SEQ_ARGS in common.cl) from index a on; *a is advanced past them. */
fcl_status fcl_set_sequence_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p);
/* Sets the modifier arguments every attention kernel takes (FCL_MOD_ARGS in common.cl) from index a on;
   *a is advanced past them. */
fcl_status fcl_set_modifier_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p);

fcl_status fcl_resolve_problem(const fcl_attention_desc *desc, fcl_problem *p);
/* The bytes [*first, *end) of a buffer that a tensor of counts[0] x counts[1] x counts[2] rows of d elements
   (p->q_counts or p->kv_counts) with these strides and offset can reach (no I/O; every product checked
   against overflow). what names the tensor in messages. */
fcl_status fcl_tensor_bytes(const fcl_problem *p, const char *what, const int64_t counts[3],
                            const int64_t stride[3], int64_t offset, uint64_t *first, uint64_t *end);
/* Checks that buf belongs to ctx's cl_context and holds every element of such a tensor. what names the
   argument in messages. */
fcl_status fcl_check_tensor(const fcl_context *ctx, cl_mem buf, const char *what, const fcl_problem *p,
                            const int64_t counts[3], const int64_t stride[3], int64_t offset);
/* Checks that an output's elements do not overlap each other (work-items write them concurrently). what
   names the output in messages, desc_field the descriptor field whose strides it uses. Call after
   fcl_check_tensor. */
fcl_status fcl_check_no_overlap(const char *what, const fcl_problem *p, const int64_t counts[3],
                                const int64_t stride[3], const char *desc_field);
/* The bytes [first, end) of the modifiers' buffers that p can reach, for fcl_check_aliasing: ALiBi slopes,
   mask, sinks ({0, 0} for one that is off). Call after fcl_check_modifiers. */
void fcl_modifier_bytes(const fcl_problem *p, uint64_t alibi[2], uint64_t mask[2], uint64_t sinks[2]);
/* Checks the sequence index buffers (cu_q, cu_k, seqlens_k, block_table): context and size for p. */
fcl_status fcl_check_sequences(const fcl_context *ctx, const fcl_problem *p);
/* The bytes [0, end) of the index buffers cu_q, cu_k, seqlens_k and block_table that p reads, for
   fcl_check_aliasing (0, 0 for a buffer not set). */
void fcl_sequence_bytes(const fcl_problem *p, uint64_t out[4][2]);
/* Checks the modifiers' buffers (ALiBi slopes, mask, sinks): context and size for p. */
fcl_status fcl_check_modifiers(const fcl_context *ctx, const fcl_problem *p);
/* The lse elements: batch * heads * seqlen_q, or heads * total_q with cu_q; checked against overflow. */
fcl_status fcl_row_count(const fcl_problem *p, size_t *rows);
/* batch * heads * seqlen_q, the rows of a launch's grid (and of split-KV's partials), checked likewise. */
fcl_status fcl_padded_rows(const fcl_problem *p, size_t *rows);
/* Checks a contiguous float32 buffer of `count` elements (lse, workspaces). */
fcl_status fcl_check_float_buffer(const fcl_context *ctx, cl_mem buf, const char *what, size_t count);
fcl_status fcl_check_queue(const fcl_context *ctx, cl_command_queue queue);
/* Checks the wait list: num_wait and wait agree, no NULL event, every event of ctx's cl_context. */
fcl_status fcl_check_wait_list(const fcl_context *ctx, cl_uint num_wait, const cl_event *wait);

/* ---- alias.c: no output may share memory with another buffer of the call ---- */

/* One buffer of a call: the bytes [first, end) of buf it may touch, whether the call writes it, and its
   argument name for messages. An operation lists every buffer it takes, one line each (buf NULL: an
   optional buffer not passed, skipped):
     const fcl_buffer_use uses[] = {{q, q0, q1, 0, "q"}, ..., {o, o0, o1, 1, "o"}, {lse, 0, rows * 4, 1, "lse"}};
   with tensor ranges from fcl_tensor_bytes. */
typedef struct fcl_buffer_use {
  cl_mem buf;
  uint64_t first, end;
  int is_output;
  const char *name;
} fcl_buffer_use;

/* The inputs every attention call reads, for fcl_check_aliasing: q, k, v (byte ranges r from
   fcl_attention_bytes), the modifiers' buffers and the sequence index buffers (NULL ones are skipped there).
   Fills out and returns how many (FCL_INPUT_USES). */
#define FCL_INPUT_USES 10
int fcl_input_uses(const fcl_problem *p, cl_mem q, cl_mem k, cl_mem v, const uint64_t r[4][2],
                   fcl_buffer_use out[FCL_INPUT_USES]);

/* Refuses (FCL_ERROR_INVALID_ARGUMENT, "<output> overlaps <other>: ...") any output whose bytes overlap
   another use's: the same buffer, sub-buffers of one parent (or a sub-buffer and its parent), or
   CL_MEM_USE_HOST_PTR buffers over one host array. Inputs may overlap each other. Also refuses an output
   created CL_MEM_READ_ONLY and an input created CL_MEM_WRITE_ONLY. At most 32 uses. Call
   after each buffer has been checked (fcl_check_tensor, fcl_check_float_buffer). */
fcl_status fcl_check_aliasing(const fcl_buffer_use *uses, int n);

/* ---- launch.c: validation of the forward's arguments and the kernel arguments every attention kernel
   shares; forward.c: selection and enqueue of the forward (also used by fcl_describe_plan and the tuner) ---- */

/* The byte ranges [first, end) of q, k, v and o (r[0..3]) that p reaches, for fcl_check_aliasing. */
fcl_status fcl_attention_bytes(const fcl_problem *p, uint64_t r[4][2]);
/* Checks the forward's arguments into *p: the descriptor, every buffer (workspace: optional, a caller's split-KV
   scratch), the queue and the wait list, and with o_written that o's elements do not overlap; not how the buffers
   share memory. The backward, which reads o and lse where the forward writes them, runs its own aliasing pass. */
fcl_status fcl_check_forward_args(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                  cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                  cl_uint num_wait, const cl_event *wait, int o_written, fcl_problem *p);
/* fcl_check_forward_args with o written, then the forward's outputs (o, lse, workspace) kept apart from every
   input and each other. */
fcl_status fcl_validate_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                cl_uint num_wait, const cl_event *wait, fcl_problem *p);
/* Chooses the forward kernel variant for p (fcl_select_variant) and returns its plan, split count decided, and
   built kernel. Caller holds ctx->lock. */
fcl_status fcl_select_forward(fcl_context *ctx, const fcl_problem *p, fcl_tile_plan *plan, cl_kernel *kernel);
/* Sets the problem's arguments every attention kernel takes after its buffers, from index *a on (advanced
   past them): the offset
   and three strides of q, k, v and o, then num_heads, group, nq, nk, scale and the modifiers (FCL_MOD_ARGS). */
fcl_status fcl_set_problem_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p);
/* Sets kernel's arguments for p and plan and enqueues one forward. Caller holds ctx->lock. */
fcl_status fcl_enqueue_forward(cl_command_queue queue, const fcl_problem *p, const fcl_tile_plan *plan,
                               cl_kernel kernel, cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait,
                               const cl_event *wait, cl_event *event);

/* ---- merge.c: the exact merge of partial results (cl/combine.cl) ---- */

/* Partial results to merge: part i's O at element offset + i * part_stride of o (strides for batch, head,
   row; each row's D elements contiguous), its lse at lse[lse_offset + i * rows + row], rows = batch *
   heads * seqlen_q. in_dtype 0: O in float32; 1: in the problem's dtype. */
typedef struct fcl_merge_parts {
  cl_mem o;
  int64_t offset, stride[3], part_stride;
  cl_mem lse;
  int64_t lse_offset;
  cl_uint count;
  int in_dtype;
} fcl_merge_parts;
/* cl/combine.cl's layout for `parts` parts of d columns: pl, the part lanes asked for (the PL define); for a
   work-group of wg, vw columns a column group, the lanes it has, cv column groups a slice and the slices of a
   row. */
typedef struct fcl_combine_layout {
  int pl, vw, lanes, cv, slices;
} fcl_combine_layout;
fcl_combine_layout fcl_combine_layout_of(int64_t parts, int64_t d, size_t wg);
/* The combine kernel for count parts of in_dtype, its work-group and slices, checked against the loop budget:
   prepared before anything of the operation is enqueued. Caller holds ctx->lock. */
typedef struct fcl_combine {
  cl_kernel kernel;
  size_t wg;
  int slices;
} fcl_combine;
fcl_status fcl_prepare_combine(fcl_context *ctx, const fcl_problem *p, int in_dtype, cl_uint count, fcl_combine *out);
/* Enqueues the combine of parts into o (p's dtype and o layout) and lse (optional), adding p's sinks once.
   Caller holds ctx->lock. */
fcl_status fcl_enqueue_combine(cl_command_queue queue, const fcl_problem *p, const fcl_combine *c,
                               const fcl_merge_parts *parts, cl_mem o, cl_mem lse, cl_uint num_wait,
                               const cl_event *wait, cl_event *event);

/* ---- plan_backward.c and backward.c: the backward kernels ---- */

/* The two tiled backward kernels. dK/dV: a work-group owns bc = tr*rm key rows and streams br = tc*rn
   query rows; dQ: it owns br = tr*rm query rows and streams bc = tc*rn key rows. */
enum { FCL_BWD_DKDV = 0, FCL_BWD_DQ = 1 };

/* Local memory the backward kernel `which` (FCL_BWD_*) uses for plan p. */
size_t fcl_backward_local_bytes(const fcl_tile_plan *p, int which);
/* The portable backward's planner (cl/flash_bwd.cl): the plans of both kernels, out[FCL_BWD_DKDV] and
   out[FCL_BWD_DQ], each within kernel_wg[FCL_BWD_*]; -1 when nothing fits one of them (out[0].reason says why). */
int fcl_plan_backward(const fcl_device_caps *caps, const fcl_plan_overrides *ov, const fcl_problem *p, unsigned flags,
                      const size_t *kernel_wg, fcl_tile_plan out[2]);
/* Plans and builds the backward kernels for p: plans[FCL_BWD_DKDV], plans[FCL_BWD_DQ]; kernels[0] the
   pre-pass (Dvec = rowsum(dO * O)), kernels[1] dK/dV, kernels[2] dQ, kernels[3] the d_sinks reduction of
   *dsinks_wg work-items per head (NULL and 0 without desc->d_sinks). Caller holds ctx->lock. */
fcl_status fcl_select_backward(fcl_context *ctx, const fcl_problem *p, fcl_tile_plan plans[2], cl_kernel kernels[4],
                               size_t *dsinks_wg);
/* describe.c: fcl_describe_plan's answer for FCL_OP_BACKWARD: block_q the dQ kernel's query rows per work-group,
   block_k the dK/dV kernel's key rows per work-group, the larger work-group and local memory of the two,
   work_groups both launches together. Takes ctx->lock itself. */
fcl_status fcl_describe_backward(fcl_context *ctx, const fcl_problem *p, fcl_plan_info *out);
/* backward.c: FCL_SUCCESS when the backward takes p's layout (not paged K/V), else FCL_ERROR_UNSUPPORTED. */
fcl_status fcl_backward_supported(const fcl_problem *p);

/* ---- loop_bounds.c: loop iterations of one launch against the device's loop budget ---- */

/* Conservative upper bounds of the loop iterations one work-item runs in one launch, every loop of the kernel
   source counted: the portable forward over key_tiles key tiles of plan p (paged: keys through a block table);
   backward kernel `which` (FCL_BWD_*) over `tiles` streamed tiles (dK/dV: query tiles summed over the group's
   query heads; dQ: key tiles), group the query heads per kv head; the reference softmax over a row of nk keys
   with wg work-items. */
uint64_t fcl_forward_loop_iterations(const fcl_tile_plan *p, int paged, int64_t key_tiles);
uint64_t fcl_backward_loop_iterations(const fcl_tile_plan *p, int which, int64_t group, int64_t tiles);
uint64_t fcl_softmax_loop_iterations(int64_t nk, size_t wg);
/* The combine kernel (split-KV chunks, fcl_attention_merge) over `parts` parts of d columns, wg per row slice. */
uint64_t fcl_combine_loop_iterations(int64_t parts, int64_t d, size_t wg);
/* The backward's d_sinks kernel over batch sequences of at most nq query rows each, with wg work-items. */
uint64_t fcl_dsinks_loop_iterations(int64_t batch, int64_t nq, size_t wg);
/* What every kernel of p with packed sequences spends checking its cu_seqlens arrays (common.cl's
   fcl_sorted_prefix), on top of the counts here and there; each within_budget check below takes it off the budget. */
uint64_t fcl_prefix_loop_iterations(const fcl_problem *p);
/* The reference path's V cleaning over rows of d elements, and its non-finite fixup over `keys` keys of d. */
uint64_t fcl_gather_clean_loop_iterations(int64_t d);
uint64_t fcl_nonfinite_fixup_loop_iterations(int64_t keys, int64_t d);
/* fcl_kv_append's grid-stride loop over n elements on `global` work-items. */
uint64_t fcl_kv_append_loop_iterations(int64_t n, size_t global);
/* The most keys one launch of the fixup may cover within budget: 0 when budget is 0 (no limit), -1 when none. */
int64_t fcl_nonfinite_fixup_max_keys(int64_t d, uint64_t budget);
/* The most key tiles (of p->bc keys) one launch of the portable forward with plan p may process within budget
   loop iterations per work-item: 0 when budget is 0 (no limit), -1 when not even one tile fits. What a split of
   the key range into bounded launches (split-KV) needs: a launch over at most that many tiles stays exact. */
int64_t fcl_forward_max_key_tiles(const fcl_tile_plan *p, int paged, uint64_t budget);
/* The same for backward kernel `which`: dK/dV's query tiles (of p->br rows, summed over group heads), dQ's key
   tiles (of p->bc keys; pass group 1). */
int64_t fcl_backward_max_tiles(const fcl_tile_plan *p, int which, int64_t group, uint64_t budget);
/* FCL_SUCCESS when every launch of the operation stays inside caps->loop_budget; else FCL_ERROR_UNSUPPORTED with
   a message naming the quirk and the numbers. */
/* The fewest split-KV chunks that keep each launch of the portable forward with plan inside the loop budget
   (1 without a budget; at most FCL_MAX_SPLITS, which fcl_forward_within_budget may still refuse). */
int fcl_forward_budget_splits(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan *plan);
fcl_status fcl_forward_within_budget(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan *plan);
fcl_status fcl_backward_within_budget(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan plans[2],
                                      size_t dsinks_wg /* 0: no d_sinks launch */);
fcl_status fcl_softmax_within_budget(const fcl_device_caps *caps, const fcl_problem *p, size_t wg);
fcl_status fcl_combine_within_budget(const fcl_device_caps *caps, const fcl_problem *p, int64_t parts, size_t wg);
/* The same for the reference path's non-finite V kernels; *keys receives the keys each fixup launch covers (nk,
   or fewer under a budget: the fixup then runs as several launches over consecutive key ranges). */
fcl_status fcl_nonfinite_within_budget(const fcl_device_caps *caps, const fcl_problem *p, int64_t *keys);

/* ---- reference.c ---- */

/* Device memory fcl_attention_reference allocates for desc beyond its inputs and outputs (the score
   matrix and float32 copies, per chunk of (batch, head) pairs), in bytes; 0 when desc is invalid, the
   score matrix of one head does not fit, or the library was built without CLBlast. */
size_t fcl_reference_scratch_bytes(fcl_context *ctx, const fcl_attention_desc *desc);

/* ---- kv_append.c: the paged KV cache append ---- */

/* 1 when two pools of one geometry [num_blocks, heads, block_size, head_dim] with the same strides (block, head, row;
   each pool free of self-overlap, as fcl_check_no_overlap checks) whose first elements are delta elements apart
   share no element; 0 when they share one, or when the strides are not nested so (conservative). */
int fcl_kv_pools_disjoint(int64_t num_blocks, int64_t heads, int64_t block_size, int64_t head_dim,
                          const int64_t stride[3], int64_t delta);

#endif /* FLASHCL_INTERNAL_H */
