/* The backward planner over made-up devices: every plan it returns for the dK/dV and dQ kernels fits
 * local memory and the work-group limits, its shape is self-consistent, and every head_dim 1..256 gets
 * a plan on each device, including the 16 KiB / 256 work-item device that FLASHCL_LOCAL_MEM_LIMIT and
 * FLASHCL_MAX_WORK_GROUP_SIZE emulate. */
#include "test_problem.h"
#include "test_util.h"

#include <string.h>

static int consistent(const fcl_tile_plan *p, int which, const fcl_device_caps *caps) {
  const int owned = which == FCL_BWD_DKDV ? p->bc : p->br, streamed = which == FCL_BWD_DKDV ? p->br : p->bc;
  return p->variant == FCL_VARIANT_PORTABLE_BACKWARD && p->wg == p->tr * p->tc && owned == p->tr * p->rm &&
         streamed == p->tc * p->rn && streamed % 4 == 0 && p->dp == p->tc * p->dn && p->dp % 4 == 0 &&
         p->dp >= p->head_dim && p->dp < p->head_dim + (p->tc > 4 ? p->tc : 4) && p->ds >= p->dp &&
         p->ds % 4 == 0 && p->local_bytes == fcl_backward_local_bytes(p, which) &&
         p->local_bytes <= caps->local_mem_size && (size_t)p->wg <= caps->max_work_group_size &&
         (size_t)p->wg <= caps->max_work_item_size0 && p->wg >= 1 && p->rm >= 1 && p->rn >= 1;
}

/* The portable backward's plan of kernel `which` for head_dim d, within kernel_wg work-items (0: the device's
   limit). */
static int plan(const fcl_device_caps *caps, int which, int d, fcl_dtype dtype, size_t kernel_wg, fcl_tile_plan *out) {
  const fcl_problem p = test_problem(d, dtype, 1024, 0);
  size_t limits[2] = {0, 0};
  limits[which] = kernel_wg;
  fcl_tile_plan both[2];
  const int r = fcl_plan_backward(caps, &no_overrides, &p, 0, limits, both);
  *out = both[r == 0 ? which : 0];
  return r;
}

int main(void) {
  static const cl_ulong locals[] = {16 << 10, 32 << 10, 48 << 10, 64 << 10, 1 << 20};
  static const size_t wgs[] = {256, 1024, 4096};
  static const fcl_dtype dtypes[] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  static const char *const names[2] = {"dK/dV", "dQ"};
  for (int which = 0; which < 2; ++which)
    for (size_t li = 0; li < sizeof locals / sizeof locals[0]; ++li)
      for (size_t wi = 0; wi < sizeof wgs / sizeof wgs[0]; ++wi) {
        fcl_device_caps caps;
        memset(&caps, 0, sizeof caps);
        caps.local_mem_size = locals[li];
        caps.max_work_group_size = wgs[wi];
        caps.max_work_item_size0 = wgs[wi];
        caps.preferred_multiple = 32;
        caps.is_gpu = 1;
        int planned = 0, fits = 1, bad_d = 0, min_wg = 1 << 30;
        for (int d = 1; d <= FCL_MAX_HEAD_DIM; ++d)
          for (int t = 0; t < 3; ++t) {
            fcl_tile_plan p;
            if (plan(&caps, which, d, dtypes[t], 0, &p) != 0) {
              fits = 0;
              bad_d = d;
              continue;
            }
            ++planned;
            if (p.wg < min_wg) min_wg = p.wg;
            if (!consistent(&p, which, &caps)) {
              fits = 0;
              bad_d = d;
            }
          }
        check(fits && planned == 3 * FCL_MAX_HEAD_DIM,
              "%s: %llu B local, %zu work-items: %d plans, all fit and are consistent, smallest work-group %d%s",
              names[which], (unsigned long long)locals[li], wgs[wi], planned, min_wg,
              fits ? "" : " (first bad head_dim below)");
        if (!fits) printf("     head_dim %d\n", bad_d);
      }

  fcl_device_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.local_mem_size = 48 << 10;
  caps.max_work_group_size = caps.max_work_item_size0 = 1024;
  fcl_tile_plan p;
  for (int which = 0; which < 2; ++which) {
    /* The kernel's own work-group limit is honoured. */
    int ok = plan(&caps, which, 128, FCL_DTYPE_F16, 64, &p) == 0 && p.wg <= 64;
    check(ok, "%s: kernel work-group limit 64 gives a plan of %d work-items", names[which], p.wg);
    /* Head dims outside 1..256, an unknown kernel and a device without room get no plan, and say why. */
    check(plan(&caps, which, 0, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0, "%s: head_dim 0: %s",
          names[which], p.reason);
    check(plan(&caps, which, 257, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0,
          "%s: head_dim 257: %s", names[which], p.reason);
    fcl_device_caps tiny = caps;
    tiny.local_mem_size = 1024;
    check(plan(&tiny, which, 256, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0,
          "%s: 1 KiB of local memory: %s", names[which], p.reason);
    /* A 48 KiB GPU gets tiles of a useful size at head_dim 64 and 128. */
    plan(&caps, which, 64, FCL_DTYPE_F32, 0, &p);
    check(p.br >= 16 && p.bc >= 16 && p.wg >= 64, "%s: 48 KiB, head_dim 64: %dx%d (query x key) tiles, %d work-items, %zu B",
          names[which], p.br, p.bc, p.wg, p.local_bytes);
    plan(&caps, which, 128, FCL_DTYPE_F32, 0, &p);
    check(p.br >= 16 && p.bc >= 8 && p.wg >= 64, "%s: 48 KiB, head_dim 128: %dx%d (query x key) tiles, %d work-items, %zu B",
          names[which], p.br, p.bc, p.wg, p.local_bytes);
  }

  /* A CPU without a loop budget: two work-items of 32 owned x 16 streamed rows for both kernels (where they fit);
     with a loop budget (llvmpipe), or too little local memory, the search's tiles. */
  fcl_device_caps cpu = caps;
  cpu.is_cpu = 1;
  cpu.local_mem_size = 4 << 20;
  static const int cpu_dims[] = {1, 7, 64, 128, 256};
  for (size_t i = 0; i < sizeof cpu_dims / sizeof cpu_dims[0]; ++i)
    for (int which = 0; which < 2; ++which) {
      const int ok = plan(&cpu, which, cpu_dims[i], FCL_DTYPE_F32, 0, &p) == 0 && p.tr == 2 && p.tc == 1 && p.rm == 32 &&
                     p.rn == 16 && consistent(&p, which, &cpu) && strstr(p.reason, "CPU shape");
      check(ok, "%s: CPU, head_dim %d: %dx%d work-items of %d x %d rows, %zu B: %s", names[which], cpu_dims[i], p.tr,
            p.tc, p.rm, p.rn, p.local_bytes, p.reason);
    }
  /* A CPU that runs sub-groups as SIMD lanes: up to head_dim 192, 16 x tc work-items of 2 x 2 rows, tc the smallest power of two
     leaving at most 6 head_dim columns (tc 1 would stream rows in pairs, not fours: the CPU shape); above 192 the
     CPU shape. */
  fcl_device_caps cpu_sg = cpu;
  cpu_sg.cpu_simd_subgroups = 1;
  static const struct {
    int d, tc; /* tc 0: the CPU shape */
  } sg_dims[] = {{1, 0}, {8, 2}, {32, 8}, {64, 16}, {96, 16}, {97, 32}, {128, 32}, {192, 32}, {193, 0}, {256, 0}};
  for (size_t i = 0; i < sizeof sg_dims / sizeof sg_dims[0]; ++i)
    for (int which = 0; which < 2; ++which) {
      const int want = sg_dims[i].tc;
      const int ok = plan(&cpu_sg, which, sg_dims[i].d, FCL_DTYPE_F32, 0, &p) == 0 && consistent(&p, which, &cpu_sg) &&
                     (want ? p.tr == 16 && p.tc == want && p.rm == 2 && p.rn == 2 && p.dn <= 6 &&
                                 strstr(p.reason, "CPU with sub-groups")
                           : p.tr == 2 && p.tc == 1 && strstr(p.reason, "CPU shape"));
      check(ok, "%s: CPU with sub-groups, head_dim %d: %dx%d work-items of %d x %d rows, %d columns: %s", names[which],
            sg_dims[i].d, p.tr, p.tc, p.rm, p.rn, p.dn, p.reason);
    }
  fcl_device_caps budgeted = cpu;
  budgeted.loop_budget = 65535;
  fcl_device_caps cpu_small = cpu;
  cpu_small.local_mem_size = 16 << 10;
  for (int which = 0; which < 2; ++which) {
    int r = plan(&budgeted, which, 64, FCL_DTYPE_F32, 0, &p);
    check(r == 0 && !strstr(p.reason, "CPU shape") && p.wg > 2,
          "%s: CPU with a loop budget, head_dim 64: the search's %dx%d work-items", names[which], p.tr, p.tc);
    r = plan(&cpu_small, which, 64, FCL_DTYPE_F32, 0, &p);
    check(r == 0 && !strstr(p.reason, "CPU shape") && consistent(&p, which, &cpu_small),
          "%s: CPU with 16 KiB of local memory, head_dim 64: the search's %dx%d work-items, %zu B", names[which], p.tr,
          p.tc, p.local_bytes);
  }

  /* FLASHCL_PORTABLE_BACKWARD_SHAPE: four integers for both kernels or eight (dK/dV, then dQ), taken where they
     fit and said in the reason; a kernel whose shape does not fit gets its default plan; malformed or
     out-of-range text is refused by the parser. */
  fcl_plan_overrides ov;
  memset(&ov, 0, sizeof ov);
  check(fcl_parse_portable_backward_shape("4,8,4,2", ov.portable_backward_shape) == 0 &&
            ov.portable_backward_shape[4] == 4 && ov.portable_backward_shape[7] == 2,
        "FLASHCL_PORTABLE_BACKWARD_SHAPE=4,8,4,2 parsed for both kernels");
  const fcl_problem p128 = test_problem(128, FCL_DTYPE_F32, 1024, 0);
  fcl_tile_plan both[2];
  int r = fcl_plan_backward(&caps, &ov, &p128, 0, NULL, both);
  for (int which = 0; which < 2; ++which)
    check(r == 0 && both[which].tr == 4 && both[which].tc == 8 && both[which].rm == 4 && both[which].rn == 2 &&
              both[which].dn == 16 && consistent(&both[which], which, &caps) &&
              strstr(both[which].reason, "FLASHCL_PORTABLE_BACKWARD_SHAPE"),
          "%s, head_dim 128, FLASHCL_PORTABLE_BACKWARD_SHAPE=4,8,4,2: %zu B: %s", names[which], both[which].local_bytes,
          both[which].reason);
  /* dK/dV 64 x 64 tiles (more than 48 KiB at head_dim 128), dQ 2 x 16 work-items of 1 x 2 rows. */
  check(fcl_parse_portable_backward_shape("16,16,4,4,2,16,1,2", ov.portable_backward_shape) == 0,
        "FLASHCL_PORTABLE_BACKWARD_SHAPE=16,16,4,4,2,16,1,2 parsed");
  fcl_tile_plan defaults[2];
  r = fcl_plan_backward(&caps, &ov, &p128, 0, NULL, both) | fcl_plan_backward(&caps, &no_overrides, &p128, 0, NULL, defaults);
  check(r == 0 && both[0].tr == defaults[0].tr && both[0].tc == defaults[0].tc && both[0].rm == defaults[0].rm &&
            both[0].rn == defaults[0].rn && !strstr(both[0].reason, "FLASHCL_PORTABLE_BACKWARD_SHAPE"),
        "dK/dV, head_dim 128, a forced shape beyond 48 KiB: the default plan, %s", both[0].reason);
  check(r == 0 && both[1].tr == 2 && both[1].tc == 16 && both[1].rm == 1 && both[1].rn == 2 &&
            consistent(&both[1], 1, &caps) && strstr(both[1].reason, "FLASHCL_PORTABLE_BACKWARD_SHAPE"),
        "dQ, head_dim 128, FLASHCL_PORTABLE_BACKWARD_SHAPE's second shape 2,16,1,2: %s", both[1].reason);
  /* 3 x 1 work-items of 1 streamed row: P and dS rows are read as float4, so the streamed rows must be a multiple
     of 4; the default plan. */
  check(fcl_parse_portable_backward_shape("3,1,1,1", ov.portable_backward_shape) == 0, "FLASHCL_PORTABLE_BACKWARD_SHAPE=3,1,1,1 parsed");
  r = fcl_plan_backward(&caps, &ov, &p128, 0, NULL, both);
  check(r == 0 && both[0].tr == defaults[0].tr && both[1].tr == defaults[1].tr &&
            !strstr(both[0].reason, "FLASHCL_PORTABLE_BACKWARD_SHAPE") && !strstr(both[1].reason, "FLASHCL_PORTABLE_BACKWARD_SHAPE"),
        "head_dim 128, FLASHCL_PORTABLE_BACKWARD_SHAPE=3,1,1,1 (1 streamed row): the default plans");
  static const char *const bad[] = {"4,8,4", "4,8,4,2,1", "4,8,4,2,4,8,4", "4,8,4,2,4,8,4,2,1", "0,8,4,2", "4,8,257,2",
                                    "4,4097,4,2", "4,8,4,-2", "x", "", "4,8,4,2,"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    int shape[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    check(fcl_parse_portable_backward_shape(bad[i], shape) != 0 && shape[0] == 7 && shape[4] == 7,
          "FLASHCL_PORTABLE_BACKWARD_SHAPE=\"%s\" refused, shape untouched", bad[i]);
  }
  return test_summary("test_plan_backward");
}
