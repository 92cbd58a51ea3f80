/* The table of kernel variants: per operation, the vendor variants first and the portable one last. Each
 * entry names its .cl files and kernels, its planner (whether it applies to a problem on a device, and with
 * what plan), the -D defines its kernels are built with, and whether a context's tuned shapes apply to it.
 * Selection walks the table; a vendor variant whose kernels fail to build is remembered per (dtype, head_dim)
 * and passed over from then on. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static const char *const portable_forward_files[] = {"common.cl", "flash_fwd.cl"};
static const char *const nvidia_forward_files[] = {"common.cl", "nvidia/ptx.cl", "nvidia/flash_fwd_mma.cl"};
static const char *const portable_backward_files[] = {"common.cl", "flash_bwd.cl"};
static const char *const nvidia_backward_files[] = {"common.cl", "nvidia/ptx.cl", "nvidia/flash_bwd_mma.cl"};

static const char *const portable_forward_kernels[] = {"flash_fwd"};
static const char *const nvidia_forward_kernels[] = {"flash_fwd_mma"};
static const char *const portable_backward_kernels[] = {"flash_bwd_dkdv", "flash_bwd_dq"};
static const char *const nvidia_backward_kernels[] = {"flash_bwd_dkdv_mma", "flash_bwd_dq_mma"};

static void portable_forward_defines(const fcl_problem *p, const fcl_tile_plan *t, int which, const char *mods,
                                     char *out, size_t size) {
  (void)which;
  snprintf(out, size,
           "-DDTYPE=%d -DD=%d -DDP=%d -DDS=%d -DBR=%d -DBC=%d -DTR=%d -DTC=%d -DRM=%d -DRN=%d -DDN=%d -DKT=%d -DSUBGROUP=%d"
           "%s%s%s%s%s",
           (int)p->dtype, t->head_dim, t->dp, t->ds, t->br, t->bc, t->tr, t->tc, t->rm, t->rn, t->dn, t->kt, t->subgroup,
           t->direct ? " -DDIRECT=1" : "", mods, t->pack ? " -DPACK=1" : "", t->splits > 1 ? " -DSPLIT=1" : "",
           t->sg_required ? " -DSUBGROUP_REQUIRED=1" : "");
}

/* Whether p's mask offset and strides are multiples of elems (the buffer's base is aligned far beyond any). With 2,
   each pair of keys from an even key is one aligned word (two for f32): MASK_PAIRS. */
static int mask_aligned(const fcl_problem *p, int64_t elems) {
  return p->mask && p->mask_offset % elems == 0 && p->mask_stride[0] % elems == 0 &&
         p->mask_stride[1] % elems == 0 && p->mask_stride[2] % elems == 0;
}
static int mask_pairs(const fcl_problem *p) { return mask_aligned(p, 2); }

/* Whether p's mask rows start on 16 bytes (offset and strides multiples of 8 elements of 2 bytes, 4 of f32), so
   that the forward reads a lane's run of a row's keys 16 bytes a load (MASK_VEC). */
static int mask_vec(const fcl_problem *p) { return mask_aligned(p, p->mask_dtype == FCL_DTYPE_F32 ? 4 : 8); }

static void nvidia_forward_defines(const fcl_problem *p, const fcl_tile_plan *t, int which, const char *mods,
                                   char *out, size_t size) {
  (void)which;
  snprintf(out, size,
           "-DDTYPE=%d -DD=%d -DDP=%d -DDS=%d -DNW=%d -DMT=%d -DBC=%d -DQSMEM=%d -DQREG=%d -DSTAGES=%d -DPACK=%d "
           "-DSPLIT=%d -DMBAR_RING=%d -DFCL_PTX=1%s%s%s",
           (int)p->dtype, t->head_dim, t->dp, t->ds, t->tr, t->rm, t->bc, t->qsmem, t->qregs, t->stages, t->pack,
           t->splits > 1, t->mbar_ring, mask_pairs(p) ? " -DMASK_PAIRS=1" : "", mask_vec(p) ? " -DMASK_VEC=1" : "",
           mods);
}

static void portable_backward_defines(const fcl_problem *p, const fcl_tile_plan *t, int which, const char *mods,
                                      char *out, size_t size) {
  snprintf(out, size, "-DBWD_KIND=%d -DDTYPE=%d -DD=%d -DDP=%d -DDS=%d -DTR=%d -DTC=%d -DRM=%d -DRN=%d -DDN=%d%s",
           which + 1, (int)p->dtype, t->head_dim, t->dp, t->ds, t->tr, t->tc, t->rm, t->rn, t->dn, mods);
}

static void nvidia_backward_defines(const fcl_problem *p, const fcl_tile_plan *t, int which, const char *mods,
                                    char *out, size_t size) {
  const int dq = which == FCL_BWD_DQ; /* the dQ kernel reads the mask as the forward does */
  snprintf(out, size, "-DMMA_KIND=%d -DDTYPE=%d -DD=%d -DDP=%d -DDS=%d -DNW=%d -DBN=%d -DFCL_PTX=1%s%s%s%s%s",
           which + 1, (int)p->dtype, t->head_dim, t->dp, t->ds, t->tr, dq ? t->bc : t->br,
           t->rm > 1 ? " -DQT=2" : "",
           t->kv_resident == 2 ? " -DKV_RESIDENT=1 -DWARP2D=1" : t->kv_resident ? " -DKV_RESIDENT=1" : "",
           dq && mask_pairs(p) ? " -DMASK_PAIRS=1" : "", dq && mask_vec(p) ? " -DMASK_VEC=1" : "", mods);
}

#define FILES(f) f, (int)(sizeof f / sizeof f[0])
const fcl_variant fcl_variants[FCL_VARIANT_COUNT] = {
    [FCL_VARIANT_NVIDIA_FORWARD] = {"nvidia_mma", "tensor-core forward", FCL_OP_FORWARD, FCL_VENDOR_NVIDIA,
                                    FILES(nvidia_forward_files), FILES(nvidia_forward_kernels),
                                    fcl_plan_nvidia_forward, NULL, nvidia_forward_defines},
    [FCL_VARIANT_PORTABLE_FORWARD] = {"portable", "portable forward", FCL_OP_FORWARD, FCL_VENDOR_OTHER,
                                      FILES(portable_forward_files), FILES(portable_forward_kernels),
                                      fcl_plan_forward, fcl_plan_forward_tuned, portable_forward_defines},
    [FCL_VARIANT_NVIDIA_BACKWARD] = {"nvidia_mma", "tensor-core backward", FCL_OP_BACKWARD, FCL_VENDOR_NVIDIA,
                                     FILES(nvidia_backward_files), FILES(nvidia_backward_kernels),
                                     fcl_plan_nvidia_backward, NULL, nvidia_backward_defines},
    [FCL_VARIANT_PORTABLE_BACKWARD] = {"portable", "portable backward", FCL_OP_BACKWARD, FCL_VENDOR_OTHER,
                                       FILES(portable_backward_files), FILES(portable_backward_kernels),
                                       fcl_plan_backward, NULL, portable_backward_defines},
};
#undef FILES

/* ---- build-failure memory: one bit per (variant, dtype, head_dim) in the context ---- */

/* The portable variants (every device) end the walk: their failure is the call's, reported each time with
   its build log, so only vendor variants are remembered and passed over. */
static int falls_back(const fcl_variant *v) { return v->vendor != FCL_VENDOR_OTHER; }

static unsigned char *failure_byte(fcl_context *ctx, const fcl_variant *v, const fcl_problem *p, unsigned *bit) {
  const ptrdiff_t i = v - fcl_variants;
  if (i < 0 || i >= FCL_VARIANT_COUNT || p->d < 0 || p->d > FCL_MAX_HEAD_DIM || (int)p->dtype < 0 || p->dtype > 2)
    return NULL; /* not a table entry: nothing to remember */
  *bit = 1u << (p->d % 8);
  return &ctx->variant_failed[i][p->dtype][p->d / 8];
}

/* ---- building ---- */

fcl_status fcl_variant_kernel(fcl_context *ctx, const fcl_variant *v, const fcl_problem *p, const fcl_tile_plan *t,
                              int which, const char *mods, cl_kernel *kernel, size_t *kernel_wg) {
  char defines[512];
  v->defines(p, t, which, mods, defines, sizeof defines);
  fcl_status st = fcl_get_kernel(ctx, v->files, v->num_files, v->kernels[which], defines, kernel);
  if (st) return st;
  FCL_CL_CHECK(clGetKernelWorkGroupInfo(*kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof *kernel_wg, kernel_wg,
                                        NULL));
  return FCL_SUCCESS;
}

static int plan_variant(fcl_context *ctx, const fcl_variant *v, const fcl_problem *p, unsigned flags,
                        const size_t *kernel_wg, fcl_tile_plan *plans) {
  if (v->tuned && !(flags & FCL_PLAN_RULE) && v->tuned(ctx, p, kernel_wg, plans) == 0) return 0;
  return v->plan(&ctx->caps, &ctx->overrides, p, flags, kernel_wg, plans);
}

fcl_status fcl_variant_build(fcl_context *ctx, const fcl_variant *v, const fcl_problem *p, unsigned flags,
                             const char *mods, fcl_tile_plan *plans, cl_kernel *kernels, char *why, size_t why_size) {
  const char *op = v->op == FCL_OP_FORWARD ? "forward" : "backward";
  size_t limits[2] = {0, 0};
  /* A vendor variant passed over (declined, or remembered as failed) is no failure of the call: it says why
     and leaves the thread's last error alone. */
  if (plan_variant(ctx, v, p, flags, limits, plans) != 0) {
    snprintf(why, why_size, "%s", plans[0].reason);
    return falls_back(v) ? FCL_ERROR_UNSUPPORTED
                         : fcl_fail(FCL_ERROR_UNSUPPORTED, "no %s plan on %s: %s", op, ctx->caps.device_name,
                                    plans[0].reason);
  }
  unsigned bit = 0;
  unsigned char *failed = falls_back(v) ? failure_byte(ctx, v, p, &bit) : NULL;
  if (failed && (*failed & bit)) {
    snprintf(why, why_size, "the %s kernel for this head_dim and dtype failed to build earlier", v->title);
    return FCL_ERROR_UNSUPPORTED;
  }
  for (int which = 0; which < v->num_kernels; ++which)
    for (int attempt = 1;; ++attempt) {
      size_t wg = 0;
      const fcl_status st = fcl_variant_kernel(ctx, v, p, &plans[which], which, mods, &kernels[which], &wg);
      /* A tile beyond the local memory the device reports (NVIDIA: a kernel's own arrays may take more,
         caps->nv_static_local) that does not build: this driver keeps kernels to what it reports. Plan within it
         from now on and try the variant again, once (the capability is then gone). */
      if (st == FCL_ERROR_BUILD && falls_back(v) && ctx->caps.nv_static_local > ctx->caps.local_mem_size &&
          plans[which].local_bytes + 16 > ctx->caps.local_mem_size) {
        ctx->caps.nv_static_local = 0;
        fcl_clear_error();
        return fcl_variant_build(ctx, v, p, flags, mods, plans, kernels, why, why_size);
      }
      if (st) {
        if (st == FCL_ERROR_BUILD && failed) *failed |= bit;
        snprintf(why, why_size, "the %s kernel %s %s: %s", v->title, v->kernels[which],
                 st == FCL_ERROR_BUILD ? "failed to build" : "is unavailable", fcl_status_string(st));
        return st;
      }
      if ((size_t)plans[which].wg <= wg) break;
      /* Re-plan within what the compiled kernel admits; a planner that cannot go below its plan declines. Only
         this kernel's plan is taken from the new plans: the earlier kernels are built to theirs. */
      const int planned = plans[which].wg;
      limits[which] = wg;
      fcl_tile_plan again[2];
      if (attempt < 4 && plan_variant(ctx, v, p, flags, limits, again) != 0) {
        snprintf(why, why_size, "%s", again[0].reason);
        return fcl_fail(FCL_ERROR_UNSUPPORTED, "no %s plan on %s: %s", op, ctx->caps.device_name, again[0].reason);
      }
      if (attempt < 4) plans[which] = again[which];
      if (attempt == 4 || (size_t)plans[which].wg > wg) {
        snprintf(why, why_size, "the %s kernel %s admits %zu work-items, fewer than its %d", v->title, v->kernels[which],
                 wg, planned);
        return fcl_fail(FCL_ERROR_UNSUPPORTED, "the %s kernel %s for head_dim %d admits too few work-items on %s", op,
                        v->kernels[which], (int)p->d, ctx->caps.device_name);
      }
    }
  return FCL_SUCCESS;
}

fcl_status fcl_select_variant(fcl_context *ctx, fcl_operation op, const fcl_problem *p, const char *mods,
                              const fcl_variant **chosen, fcl_tile_plan *plans, cl_kernel *kernels, char *why,
                              size_t why_size) {
  why[0] = '\0';
  for (const fcl_variant *v = fcl_variants; v < fcl_variants + FCL_VARIANT_COUNT; ++v) {
    if (v->op != op) continue;
    char reason[sizeof plans[0].reason];
    const unsigned long failures = fcl_failure_count();
    const fcl_status st = fcl_variant_build(ctx, v, p, ctx->flags, mods, plans, kernels, reason, sizeof reason);
    if (st == FCL_SUCCESS || !falls_back(v)) {
      *chosen = v;
      return st;
    }
    /* A vendor kernel that failed (its build log is in the last error) is no failure of the call either. */
    if (fcl_failure_count() != failures) fcl_clear_error();
    /* Said (by fcl_describe_plan) where the variant exists for the platform, or was turned off. */
    if (v->vendor == ctx->caps.vendor || (ctx->flags & FCL_FLAG_PORTABLE_ONLY)) snprintf(why, why_size, "%s", reason);
  }
  /* Not reached: the table ends each operation with its portable variant. */
  return fcl_fail(FCL_ERROR_UNSUPPORTED, "no kernel variant for operation %d", (int)op);
}
