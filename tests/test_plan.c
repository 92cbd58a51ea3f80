/* The planner over made-up devices: every plan it returns fits local memory and the work-group limits,
 * its shape is self-consistent, and every head_dim 1..256 gets a plan on each device. */
#include "test_problem.h"
#include "test_util.h"

#include <string.h>

static int consistent(const fcl_tile_plan *p, const fcl_device_caps *caps) {
  return p->variant == FCL_VARIANT_PORTABLE_FORWARD && p->wg == p->tr * p->tc && p->br == p->tr * p->rm &&
         p->bc == p->tc * p->rn && p->dp == p->tc * p->dn && p->dp >= p->head_dim &&
         p->dp < p->head_dim + (p->tc > 4 ? p->tc : 4) && p->dp % 4 == 0 && p->bc % 4 == 0 && p->ds % 4 == 0 &&
         p->ds >= p->dp && p->local_bytes == fcl_forward_local_bytes(p) && p->local_bytes <= caps->local_mem_size &&
         (size_t)p->wg <= caps->max_work_group_size && (size_t)p->wg <= caps->max_work_item_size0 && p->wg >= 1;
}

/* The portable forward's plan for head_dim d over many query rows (the rule's shape), within kernel_wg
   work-items (0: the device's limit), under overrides ov. */
static int plan_with(const fcl_device_caps *caps, const fcl_plan_overrides *ov, int d, fcl_dtype dtype,
                     size_t kernel_wg, fcl_tile_plan *out) {
  const fcl_problem p = test_problem(d, dtype, 4096, 0);
  return fcl_plan_forward(caps, ov, &p, 0, &kernel_wg, out);
}

/* The same without overrides. */
static int plan(const fcl_device_caps *caps, int d, fcl_dtype dtype, size_t kernel_wg, fcl_tile_plan *out) {
  return plan_with(caps, &no_overrides, d, dtype, kernel_wg, out);
}

int main(void) {
  static const cl_ulong locals[] = {16 << 10, 32 << 10, 48 << 10, 64 << 10, 512 << 10};
  static const size_t wgs[] = {256, 1024, 4096};
  static const fcl_dtype dtypes[] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  for (size_t li = 0; li < sizeof locals / sizeof locals[0]; ++li)
    for (size_t wi = 0; wi < sizeof wgs / sizeof wgs[0]; ++wi) {
      fcl_device_caps caps;
      memset(&caps, 0, sizeof caps);
      caps.local_mem_size = locals[li];
      caps.max_work_group_size = wgs[wi];
      caps.max_work_item_size0 = wgs[wi];
      caps.preferred_multiple = 32;
      int whole_warps = 1;
      int planned = 0, fits = 1, bad_d = 0;
      for (int d = 1; d <= FCL_MAX_HEAD_DIM; ++d)
        for (int t = 0; t < 4; ++t) {
          /* GPUs and CPUs get different K tile layouts, and CPUs with sub-groups other shapes: check all. */
          caps.is_gpu = t == 0 || t == 2;
          caps.is_cpu = t == 1 || t == 3;
          caps.cpu_simd_subgroups = t == 3;
          fcl_tile_plan p;
          if (plan(&caps, d, dtypes[t % 3], 0, &p) != 0) {
            fits = 0;
            bad_d = d;
            continue;
          }
          ++planned;
          /* With 256+ work-items allowed, every plan is made of whole warps. */
          if (p.wg % 32 != 0 && !caps.is_cpu) whole_warps = 0;
          if (!consistent(&p, &caps)) {
            fits = 0;
            bad_d = d;
          }
        }
      check(fits && planned == 4 * FCL_MAX_HEAD_DIM,
            "%llu B local, %zu work-items: %d plans (GPU and CPU layouts), all fit and are consistent%s", (unsigned long long)locals[li],
            wgs[wi], planned, fits ? "" : " (first bad head_dim below)");
      if (!fits) printf("     head_dim %d\n", bad_d);
      check(whole_warps, "%llu B local, %zu work-items: GPU work-groups are whole warps of 32",
            (unsigned long long)locals[li], wgs[wi]);
    }

  /* CPUs: two work-items of 64 x 64; with sub-groups, 16 rows of the fewest work-items (a power of two) that leave
     each at most 8 output columns, each 3 rows x 4 keys, K transposed. */
  {
    fcl_device_caps cpu;
    memset(&cpu, 0, sizeof cpu);
    cpu.is_cpu = 1;
    cpu.local_mem_size = 256 << 10;
    cpu.max_work_group_size = cpu.max_work_item_size0 = 8192;
    cpu.preferred_multiple = 8;
    static const struct {
      int subgroups, d, tr, tc, rm, rn;
    } cpus[] = {{0, 64, 2, 1, 64, 64},  {1, 5, 16, 1, 3, 4},   {1, 32, 16, 4, 3, 4},
                {1, 64, 16, 8, 3, 4},   {1, 80, 16, 16, 3, 4}, {1, 128, 16, 16, 3, 4},
                {1, 129, 16, 32, 3, 4}, {1, 256, 16, 32, 3, 4}};
    for (size_t i = 0; i < sizeof cpus / sizeof cpus[0]; ++i) {
      cpu.cpu_simd_subgroups = cpus[i].subgroups;
      fcl_tile_plan c;
      const int ok_cpu = plan(&cpu, cpus[i].d, FCL_DTYPE_F32, 0, &c) == 0 && consistent(&c, &cpu) &&
                         c.tr == cpus[i].tr && c.tc == cpus[i].tc && c.rm == cpus[i].rm && c.rn == cpus[i].rn && c.kt;
      check(ok_cpu, "CPU%s, head_dim %d: %dx%d work-items of %d x %d, want %dx%d of %d x %d (%s)",
            cpus[i].subgroups ? " with sub-groups" : "", cpus[i].d, c.tr, c.tc, c.rm, c.rn, cpus[i].tr, cpus[i].tc,
            cpus[i].rm, cpus[i].rn, c.reason);
    }
  }

  /* The kernel's own work-group limit is honoured. */
  fcl_device_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.local_mem_size = 48 << 10;
  caps.max_work_group_size = caps.max_work_item_size0 = 1024;
  fcl_tile_plan p;
  int ok = plan(&caps, 128, FCL_DTYPE_F16, 64, &p) == 0 && p.wg <= 64;
  check(ok, "kernel work-group limit 64 gives a plan of %d work-items", p.wg);

  /* Head dims outside 1..256 and a device without room get no plan, and say why. */
  check(plan(&caps, 0, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0, "head_dim 0: %s", p.reason);
  check(plan(&caps, 257, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0, "head_dim 257: %s", p.reason);
  caps.local_mem_size = 512;
  check(plan(&caps, 256, FCL_DTYPE_F32, 0, &p) != 0 && strlen(p.reason) > 0, "512 B of local memory: %s",
        p.reason);

  /* FLASHCL_FORWARD_SHAPE (development): a shape that fits is used; one whose products overflow an int, or
     that does not fit, falls back to the rule's plan. */
  caps.local_mem_size = 48 << 10;
  caps.is_gpu = 1, caps.is_cpu = 0;
  const fcl_plan_overrides good_shape = {{8, 16, 4, 2, 0}, 0}, huge_shape = {{65536, 65536, 65536, 65536, -1}, 0};
  ok = plan_with(&caps, &good_shape, 64, FCL_DTYPE_F32, 0, &p) == 0 && consistent(&p, &caps) && p.tr == 8 &&
       p.tc == 16;
  check(ok, "FLASHCL_FORWARD_SHAPE=8,16,4,2,0 is planned as given: %s", p.reason);
  ok = plan_with(&caps, &huge_shape, 64, FCL_DTYPE_F32, 0, &p) == 0 && consistent(&p, &caps) &&
       !strstr(p.reason, "FLASHCL_FORWARD_SHAPE");
  check(ok, "FLASHCL_FORWARD_SHAPE=65536,65536,65536,65536 falls back to the default plan: %dx%d work-items, %s",
        p.tr, p.tc, p.reason);
  /* Sub-group shuffles for the row reductions: rows of a power of two above 1 work-items, where the device has
     shuffles; NVIDIA's warp shuffles only for work-groups of whole warps; rows of one work-item reduce nothing. */
  {
    fcl_device_caps sg = caps;
    static const struct {
      int shuffle, tr, tc, want;
    } sgs[] = {{FCL_SG_OPENCL, 8, 16, FCL_SG_OPENCL},       {FCL_SG_OPENCL, 2, 1, FCL_SG_NONE},
               {FCL_SG_OPENCL, 8, 12, FCL_SG_NONE},         {FCL_SG_OPENCL, 4, 4, FCL_SG_OPENCL},
               {FCL_SG_NVIDIA_WARP, 8, 16, FCL_SG_NVIDIA_WARP}, {FCL_SG_NVIDIA_WARP, 4, 4, FCL_SG_NONE},
               {FCL_SG_NONE, 8, 16, FCL_SG_NONE}};
    for (size_t i = 0; i < sizeof sgs / sizeof sgs[0]; ++i) {
      sg.sg_shuffle = sgs[i].shuffle;
      ok = fcl_plan_forward_shape(&sg, 64, 0, sgs[i].tr, sgs[i].tc, 2, 4, 1, 0, &p) == 0 && p.subgroup == sgs[i].want;
      check(ok, "shuffles %d, %dx%d work-items: planned %d, want %d", sgs[i].shuffle, sgs[i].tr, sgs[i].tc, p.subgroup,
            sgs[i].want);
    }
  }
  check(fcl_plan_forward_shape(&caps, 64, 0, 65536, 65536, 65536, 65536, 1, 0, &p) != 0 &&
            fcl_plan_forward_shape(&caps, 64, 0, 1, 1, 1 << 30, 8, 1, 0, &p) != 0,
        "shapes whose products overflow an int do not fit");
  /* The variable's parser: four or five integers in range, nothing else. */
  static const struct {
    const char *text;
    int ok;
  } texts[] = {{"8,16,4,2", 1},           {"8,16,4,2,1", 1},          {"8,16,4,2,-1", 1},
               {"65536,65536,65536,65536", 0}, {"8,16,4", 0},         {"8,16,4,2,7", 0},
               {"-1,2,3,4", 0},           {"0,16,4,2", 0},            {"8,16,4,2junk", 0},
               {"99999999999999999999,1,1,1", 0}, {"", 0},            {"8, 16, 4, 2", 1}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; ++i) {
    int shape[5] = {0, 0, 0, 0, 0};
    const int parsed = fcl_parse_forward_shape(texts[i].text, shape) == 0;
    check(parsed == texts[i].ok && (!parsed || (shape[0] > 0 && shape[4] >= -1 && shape[4] <= 1)),
          "FLASHCL_FORWARD_SHAPE=\"%s\" is %s", texts[i].text, texts[i].ok ? "accepted" : "ignored");
  }

  /* A 48 KiB GPU at head_dim 64 and 128 gets the large tiles the kernel is fast with. */
  caps.local_mem_size = 48 << 10;
  plan(&caps, 128, FCL_DTYPE_F32, 0, &p);
  check(p.br >= 32 && p.bc >= 32, "48 KiB, head_dim 128: %dx%d tiles, %d work-items, %zu B", p.br, p.bc, p.wg,
        p.local_bytes);
  plan(&caps, 64, FCL_DTYPE_F32, 0, &p);
  check(p.br >= 32 && p.bc >= 32, "48 KiB, head_dim 64: %dx%d tiles, %d work-items, %zu B", p.br, p.bc, p.wg,
        p.local_bytes);
  return test_summary("test_plan");
}
