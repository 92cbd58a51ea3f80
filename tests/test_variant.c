/* Which forward kernel variant runs, and that the tensor-core one is right where it runs.
 *
 * 0. The variant table (src/variants.c): each operation's entries end with its one portable variant, every
 *    file is an embedded source, and every planner's plans name their own entry; the NVIDIA kernels' mask loads
 *    by the mask's alignment (their defines).
 * 1. The pure planner over made-up devices: the tensor-core plan applies only to NVIDIA platforms of
 *    compute capability 8.0 and up, head_dim a multiple of 8 up to 256 (f16/bf16) or 128 (f32, 3xTF32),
 *    16-byte aligned rows, scale > 0, and not under FCL_FLAG_PORTABLE_ONLY; its tiles fit local memory.
 * 2. On the test device: fcl_describe_plan reports "nvidia_mma" for f16/bf16/f32 at head_dim 64 and 128
 *    exactly when the device is NVIDIA with compute capability >= 8.0 (never on other platforms, e.g. PoCL),
 *    and "portable" for unaligned rows, odd head dims, f32 above 128, FCL_FLAG_PORTABLE_ONLY and
 *    FLASHCL_PORTABLE_ONLY=1.
 *    The backward likewise (fcl_plan_nvidia_backward over made-up devices: f32, f16 and bf16 up to head_dim 128; and
 *    fcl_describe_plan(FCL_OP_BACKWARD) on the test device).
 * 3. The same cases run through each context against the float64 reference (bounds of forward_check.h), so
 *    the variant that was reported is also the one checked. */
#include "forward_check.h"
#include "internal.h"
#include "test_problem.h"

#include <stdlib.h>
#include <string.h>

static fcl_problem problem(int64_t d, fcl_dtype dtype, int64_t offset) { return test_problem(d, dtype, 100, offset); }

static int embedded(const char *file) {
  for (int i = 0; i < fcl_embedded_source_count; ++i)
    if (strcmp(fcl_embedded_sources[i].name, file) == 0) return 1;
  return 0;
}

/* A made-up NVIDIA GPU of compute capability major.minor with the 48 KiB of local memory its OpenCL reports and
   work-groups up to 1024 (no more local memory for a kernel's own arrays: nv_static_local 0). */
static fcl_device_caps nvidia_caps(int major, int minor) {
  fcl_device_caps nv;
  memset(&nv, 0, sizeof nv);
  nv.vendor = FCL_VENDOR_NVIDIA;
  nv.nv_cc_major = major, nv.nv_cc_minor = minor;
  nv.local_mem_size = 48 << 10;
  nv.max_work_group_size = nv.max_work_item_size0 = 1024;
  nv.is_gpu = 1;
  return nv;
}

static void table_cases(void) {
  fcl_device_caps nv = nvidia_caps(9, 0);
  nv.preferred_multiple = 32;
  const fcl_problem p = problem(64, FCL_DTYPE_F16, 0);
  for (int op = FCL_OP_FORWARD; op <= FCL_OP_BACKWARD; ++op) {
    const fcl_variant *last = NULL;
    int portable = 0;
    for (int i = 0; i < FCL_VARIANT_COUNT; ++i) {
      const fcl_variant *v = &fcl_variants[i];
      if ((int)v->op != op) continue;
      last = v;
      portable += v->vendor == FCL_VENDOR_OTHER;
      int files = v->num_files > 0;
      for (int f = 0; f < v->num_files; ++f) files = files && embedded(v->files[f]);
      fcl_tile_plan t[2];
      const int planned = v->plan(&nv, &no_overrides, &p, 0, NULL, t) == 0;
      int own = planned;
      for (int k = 0; k < v->num_kernels && planned; ++k) own = own && t[k].variant == i;
      check(files && v->num_kernels == (op == FCL_OP_FORWARD ? 1 : 2) && v->defines && own,
            "table: %s %s (%s): %d files, all embedded; %d kernels; plans head_dim 64 f16 on NVIDIA cc 9.0 as "
            "itself", op == FCL_OP_FORWARD ? "forward" : "backward", v->name, v->title, v->num_files, v->num_kernels);
    }
    check(last && last->vendor == FCL_VENDOR_OTHER && portable == 1 && strcmp(last->name, "portable") == 0,
          "table: the %s variants end with the one portable variant", op == FCL_OP_FORWARD ? "forward" : "backward");
  }
}

/* The NVIDIA kernels' mask loads, from the host's defines (src/variants.c): pairs of keys where the mask's offset and
   strides are even, 16-byte runs in the forward where they are multiples of 16 bytes (8 elements of 2 bytes, 4 of
   f32; broadcast strides of 0 count as any) in the forward and the backward's dQ kernel, neither in its dK/dV
   kernel. */
static void mask_define_cases(void) {
  static const struct {
    fcl_dtype dtype;
    int64_t offset, head_stride, row_stride;
    int pairs, runs;
  } m[] = {
      {FCL_DTYPE_F16, 0, 0, 4096, 1, 1},          {FCL_DTYPE_F16, 8, 409600, 4096, 1, 1},
      {FCL_DTYPE_F16, 0, 0, 4098, 1, 0},          {FCL_DTYPE_F16, 2, 0, 4096, 1, 0},
      {FCL_DTYPE_F16, 0, 4100, 4096, 1, 0},       {FCL_DTYPE_BF16, 0, 0, 4097, 0, 0},
      {FCL_DTYPE_BF16, 1, 0, 4096, 0, 0},         {FCL_DTYPE_F32, 4, 400, 100, 1, 1},
      {FCL_DTYPE_F32, 0, 0, 102, 1, 0},           {FCL_DTYPE_F32, 0, 0, 101, 0, 0},
  };
  const fcl_variant *fwd = &fcl_variants[FCL_VARIANT_NVIDIA_FORWARD], *bwd = &fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD];
  for (size_t i = 0; i < sizeof m / sizeof m[0]; ++i) {
    fcl_problem p = problem(128, FCL_DTYPE_F16, 0);
    p.mask = (cl_mem)&p; /* the defines only test it against NULL */
    p.mask_dtype = m[i].dtype;
    p.mask_offset = m[i].offset;
    p.mask_stride[0] = 0, p.mask_stride[1] = m[i].head_stride, p.mask_stride[2] = m[i].row_stride;
    fcl_tile_plan t;
    memset(&t, 0, sizeof t);
    char f[512], dq[512], dkdv[512];
    fwd->defines(&p, &t, 0, "", f, sizeof f);
    bwd->defines(&p, &t, FCL_BWD_DQ, "", dq, sizeof dq);
    bwd->defines(&p, &t, FCL_BWD_DKDV, "", dkdv, sizeof dkdv);
    const int fp = strstr(f, " -DMASK_PAIRS=1") != NULL, fr = strstr(f, " -DMASK_VEC=1") != NULL;
    const int qp = strstr(dq, " -DMASK_PAIRS=1") != NULL, qr = strstr(dq, " -DMASK_VEC=1") != NULL;
    check(fp == m[i].pairs && fr == m[i].runs && qp == m[i].pairs && qr == m[i].runs && !strstr(dkdv, "-DMASK_"),
          "mask loads: %s mask, offset %lld, head stride %lld, row stride %lld: pairs %d, runs %d in the forward "
          "(%d, %d) and in dQ (%d, %d), neither in dK/dV",
          m[i].dtype == FCL_DTYPE_F32 ? "f32" : m[i].dtype == FCL_DTYPE_F16 ? "f16" : "bf16", (long long)m[i].offset,
          (long long)m[i].head_stride, (long long)m[i].row_stride, m[i].pairs, m[i].runs, fp, fr, qp, qr);
  }
  /* Without a mask, neither. */
  fcl_problem p = problem(128, FCL_DTYPE_F16, 0);
  fcl_tile_plan t;
  memset(&t, 0, sizeof t);
  char f[512];
  fwd->defines(&p, &t, 0, "", f, sizeof f);
  check(!strstr(f, "-DMASK_"), "mask loads: no mask, no mask defines in the forward");
}

/* The tensor-core forward's plan for desc, with paged keys when `paged` (a stand-in block table, set before
   planning as the library plans; the planner only tests it against NULL); -1 where desc does not resolve. */
static int desc_plan(const fcl_device_caps *caps, const fcl_attention_desc *desc, int paged, fcl_tile_plan *t) {
  fcl_problem dp;
  if (fcl_resolve_problem(desc, &dp) != FCL_SUCCESS) return -1;
  if (paged) dp.block_table = (cl_mem)desc;
  return fcl_plan_nvidia_forward(caps, &no_overrides, &dp, 0, NULL, t);
}

/* The plan for an f16, head_dim 128 problem with paged keys. */
static int paged_decode_plan(const fcl_device_caps *caps, int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nk,
                             fcl_tile_plan *t) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = b, desc.num_heads = h, desc.num_kv_heads = hkv, desc.seqlen_q = nq, desc.seqlen_k = nk;
  desc.head_dim = 128, desc.dtype = FCL_DTYPE_F16;
  return desc_plan(caps, &desc, 1, t);
}

static void planner_cases(void) {
  const fcl_device_caps nv = nvidia_caps(9, 0);
  fcl_tile_plan t;
  /* f16 and bf16 up to head_dim 256, f32 (3xTF32: k steps of 8, float tiles) up to 128. */
  for (int d = 8; d <= 256; d += 8)
    for (int dt = 0; dt <= 2; ++dt) {
      if (dt == FCL_DTYPE_F32 && d > 128) continue;
      fcl_problem p = problem(d, (fcl_dtype)dt, 0);
      const int step = dt == FCL_DTYPE_F32 ? 8 : 16, per16 = dt == FCL_DTYPE_F32 ? 4 : 8;
      const int ok = fcl_plan_nvidia_forward(&nv, &no_overrides, &p, 0, NULL, &t) == 0 &&
                     t.variant == FCL_VARIANT_NVIDIA_FORWARD && t.dp >= d && t.dp % step == 0 && t.ds % per16 == 0 &&
                     t.bc % 16 == 0 &&
                     t.br == t.tr * t.rm * 16 && t.wg == t.tr * 32 &&
                     t.local_bytes == fcl_nvidia_forward_local_bytes(&t, 16 / per16, 0) &&
                     t.local_bytes <= nv.local_mem_size;
      if (!ok || d == 64 || d == 128 || d == 256)
        check(ok, "planner: NVIDIA cc 9.0, %s head_dim %d: tensor cores, %d rows x %d keys, %zu B", dtype_name((fcl_dtype)dt),
              d, t.br, t.bc, t.local_bytes);
    }
  struct {
    const char *what;
    int vendor, cc;
    unsigned flags;
    int64_t d, offset;
    fcl_dtype dtype;
    float scale;
  } no[] = {
      {"compute capability 7.x", FCL_VENDOR_NVIDIA, 7, 0, 64, 0, FCL_DTYPE_F16, 0},
      {"AMD platform", FCL_VENDOR_AMD, 0, 0, 64, 0, FCL_DTYPE_F16, 0},
      {"other platform (PoCL)", FCL_VENDOR_OTHER, 0, 0, 128, 0, FCL_DTYPE_BF16, 0},
      {"FCL_FLAG_PORTABLE_ONLY", FCL_VENDOR_NVIDIA, 9, FCL_FLAG_PORTABLE_ONLY, 64, 0, FCL_DTYPE_F16, 0},
      {"f32 head_dim 144", FCL_VENDOR_NVIDIA, 9, 0, 144, 0, FCL_DTYPE_F32, 0},
      {"f32 offset 2 elements", FCL_VENDOR_NVIDIA, 9, 0, 64, 2, FCL_DTYPE_F32, 0},
      {"head_dim 65", FCL_VENDOR_NVIDIA, 9, 0, 65, 0, FCL_DTYPE_F16, 0},
      {"head_dim 136 -> 264", FCL_VENDOR_NVIDIA, 9, 0, 136, 0, FCL_DTYPE_F16, 0},
      {"offset 4 elements", FCL_VENDOR_NVIDIA, 9, 0, 64, 4, FCL_DTYPE_BF16, 0},
      {"negative scale", FCL_VENDOR_NVIDIA, 9, 0, 64, 0, FCL_DTYPE_F16, -0.1f},
  };
  for (size_t i = 0; i < sizeof no / sizeof no[0]; ++i) {
    fcl_device_caps caps = nv;
    caps.vendor = no[i].vendor;
    caps.nv_cc_major = no[i].cc;
    fcl_problem p = problem(no[i].d, no[i].dtype, no[i].offset);
    if (no[i].scale != 0) p.scale = no[i].scale;
    if (no[i].d == 136) p.d = 264; /* beyond what the descriptor admits: the planner must still decline */
    const int r = fcl_plan_nvidia_forward(&caps, &no_overrides, &p, no[i].flags, NULL, &t);
    check(r != 0 && t.variant != FCL_VARIANT_NVIDIA_FORWARD && strlen(t.reason) > 0, "planner: %s declines: %s", no[i].what,
          t.reason);
  }
  /* The first shapes at head_dim 64 (Q in registers), from 128 query rows on: causal with at most 4096 query
     rows and keys 4 warps x 1 tile with 128-key tiles; otherwise 4 warps x 2 tiles, with 128-key tiles in f16
     without modifiers or paged keys, 64-key tiles else. Below 128 rows, and where a shape does not fit the
     device's local memory, 4 x 2 x 64 as before those rules (so GQA packing sees the same 128-row rule). */
  static const struct {
    int causal;
    int64_t nq, nk;
    fcl_dtype dtype;
    int group, modified, local_kib; /* modified: 1 softcap, 2 paged keys; local_kib 0: 48 */
    int rm, bc, pack;
  } d64[] = {
      {1, 128, 128, FCL_DTYPE_F16, 1, 0, 0, 1, 128, 0},       {1, 4096, 4096, FCL_DTYPE_BF16, 1, 0, 0, 1, 128, 0},
      {1, 4097, 4097, FCL_DTYPE_F16, 1, 0, 0, 2, 128, 0},     {1, 16384, 16384, FCL_DTYPE_BF16, 1, 0, 0, 2, 64, 0},
      {1, 1024, 32768, FCL_DTYPE_BF16, 1, 0, 0, 2, 64, 0},    {0, 128, 128, FCL_DTYPE_F16, 1, 0, 0, 2, 128, 0},
      {0, 4096, 4096, FCL_DTYPE_BF16, 1, 0, 0, 2, 64, 0},     {0, 1000, 1000, FCL_DTYPE_F16, 1, 1, 0, 2, 64, 0},
      {1, 1000, 1000, FCL_DTYPE_F16, 1, 1, 0, 1, 128, 0},     {0, 1000, 1000, FCL_DTYPE_F16, 1, 2, 0, 2, 64, 0},
      {1, 1000, 1000, FCL_DTYPE_F16, 1, 2, 0, 1, 128, 0},     {1, 127, 127, FCL_DTYPE_F16, 1, 0, 0, 2, 64, 0},
      {0, 100, 100, FCL_DTYPE_F16, 1, 0, 0, 2, 64, 0},        {1, 64, 4096, FCL_DTYPE_F16, 4, 0, 0, 2, 64, 1},
      {0, 16, 4096, FCL_DTYPE_F16, 8, 0, 0, 2, 64, 1},        {0, 1000, 1000, FCL_DTYPE_F16, 1, 0, 32, 2, 64, 0},
      {1, 1000, 1000, FCL_DTYPE_BF16, 1, 0, 32, 2, 64, 0},
  };
  for (size_t i = 0; i < sizeof d64 / sizeof d64[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 2, desc.num_heads = 8, desc.num_kv_heads = 8 / d64[i].group;
    desc.seqlen_q = d64[i].nq, desc.seqlen_k = d64[i].nk, desc.head_dim = 64, desc.dtype = d64[i].dtype;
    desc.causal = d64[i].causal;
    desc.softcap = d64[i].modified == 1 ? 30.0f : 0.0f;
    fcl_device_caps dc = nv;
    if (d64[i].local_kib) dc.local_mem_size = (cl_ulong)d64[i].local_kib << 10;
    const int rc = desc_plan(&dc, &desc, d64[i].modified == 2, &t);
    check(rc == 0 && t.tr == 4 && t.rm == d64[i].rm && t.bc == d64[i].bc && !t.qsmem && t.pack == d64[i].pack,
          "planner: head_dim 64, %s, %s%s, %lld query rows, %lld keys, group %d, %d KiB: 4 warps x %d tiles (want %d), "
          "%d-key tiles (want %d), packed %d (want %d)",
          dtype_name(d64[i].dtype), d64[i].causal ? "causal" : "not causal",
          d64[i].modified == 1 ? ", softcap" : d64[i].modified == 2 ? ", paged" : "", (long long)d64[i].nq,
          (long long)d64[i].nk, d64[i].group, d64[i].local_kib ? d64[i].local_kib : 48, t.rm, d64[i].rm, t.bc,
          d64[i].bc, t.pack, d64[i].pack);
  }
  /* 24 KiB of local memory: smaller key tiles, within it; 8 KiB: declined with a reason. */
  fcl_device_caps small = nv;
  small.local_mem_size = 24 << 10;
  fcl_problem p = problem(128, FCL_DTYPE_F16, 0);
  int r = fcl_plan_nvidia_forward(&small, &no_overrides, &p, 0, NULL, &t);
  check(r == 0 && t.bc < 64 && t.local_bytes <= small.local_mem_size,
        "planner: 24 KiB local memory, head_dim 128: %d-key tiles, %zu B", t.bc, t.local_bytes);
  small.local_mem_size = 8 << 10;
  r = fcl_plan_nvidia_forward(&small, &no_overrides, &p, 0, NULL, &t);
  check(r != 0 && strlen(t.reason) > 0, "planner: 8 KiB local memory, head_dim 128 declines: %s", t.reason);

  /* FLASHCL_FORWARD_MMA_SHAPE: its shape first, said in the reason; one that does not fit gives way to the
     default plan; malformed or out-of-range text is refused by the parser. */
  fcl_plan_overrides ov;
  memset(&ov, 0, sizeof ov);
  check(fcl_parse_forward_mma_shape("4,1,32,0", ov.forward_mma_shape) == 0 && ov.forward_mma_shape[2] == 32,
        "FLASHCL_FORWARD_MMA_SHAPE=4,1,32,0 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && t.tr == 4 && t.rm == 1 && t.bc == 32 && t.qsmem == 0 && t.br == 64 &&
            strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE"),
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=4,1,32,0: %d warps x %d tiles, %d keys: %s", t.tr, t.rm, t.bc,
        t.reason);
  check(fcl_parse_forward_mma_shape("8,4,128,1", ov.forward_mma_shape) == 0, "FLASHCL_FORWARD_MMA_SHAPE=8,4,128,1 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && t.tr == 4 && t.rm == 2 && t.bc == 32 && t.qsmem == 1 && t.qregs == 2 && t.local_bytes == 44064 && t.mbar_ring &&
            !strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE"),
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=8,4,128,1 (does not fit): the default plan, %s", t.reason);
  /* The mbarrier ring only from compute capability 9.0 on. */
  fcl_device_caps a100 = nv;
  a100.nv_cc_major = 8;
  r = fcl_plan_nvidia_forward(&a100, &no_overrides, &p, 0, NULL, &t);
  check(r == 0 && !t.mbar_ring && !strstr(t.reason, "mbarriers") && t.local_bytes == fcl_nvidia_forward_local_bytes(&t, 2, 0),
        "planner, compute capability 8.0: the ring on barriers, no mbarriers: %s", t.reason);
  check(fcl_parse_forward_mma_shape("4,2,64,0,3", ov.forward_mma_shape) == 0, "FLASHCL_FORWARD_MMA_SHAPE=4,2,64,0,3 parsed");
  fcl_problem p64 = problem(64, FCL_DTYPE_F16, 0);
  r = fcl_plan_nvidia_forward(&nv, &ov, &p64, 0, NULL, &t);
  /* A ring of three 64-key tiles of 72-element rows in 2-byte elements: 27 648 B, against 18 432 B with two; on
     compute capability 9.0 with two 8-byte mbarriers a buffer for its ring. */
  check(r == 0 && t.tr == 4 && t.rm == 2 && t.bc == 64 && t.qsmem == 0 && t.stages == 3 && t.local_bytes == 27696 &&
            strstr(t.reason, "64-key tiles in 3 buffers"),
        "planner, head_dim 64, FLASHCL_FORWARD_MMA_SHAPE=4,2,64,0,3: three tile buffers, %zu B: %s", t.local_bytes, t.reason);
  /* Paged K/V never takes a deeper ring: the kernel would load tiles before their rows are resolved. */
  p64.block_table = (cl_mem)&nv; /* only tested against NULL by the planner */
  r = fcl_plan_nvidia_forward(&nv, &ov, &p64, 0, NULL, &t);
  check(r == 0 && t.tr == 4 && t.rm == 2 && t.bc == 64 && t.stages == 2 && strstr(t.reason, "in 2 buffers") && !t.mbar_ring,
        "planner, head_dim 64, paged K/V, FLASHCL_FORWARD_MMA_SHAPE=4,2,64,0,3: two tile buffers: %s", t.reason);
  /* Rings at head_dim 128 (p: 136-element rows): five 32-key buffers fit 48 KiB (43 600 B), eight 64-key ones
     (139 264 B) do not, and give way to the default plan. */
  check(fcl_parse_forward_mma_shape("2,1,32,0,5", ov.forward_mma_shape) == 0, "FLASHCL_FORWARD_MMA_SHAPE=2,1,32,0,5 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && t.tr == 2 && t.bc == 32 && t.stages == 5 && t.local_bytes == 43600 &&
            strstr(t.reason, "32-key tiles in 5 buffers") && strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE"),
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=2,1,32,0,5: five tile buffers, %zu B: %s", t.local_bytes,
        t.reason);
  check(fcl_parse_forward_mma_shape("1,1,64,0,8", ov.forward_mma_shape) == 0, "FLASHCL_FORWARD_MMA_SHAPE=1,1,64,0,8 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && t.stages == 2 && t.local_bytes <= nv.local_mem_size && !strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE"),
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=1,1,64,0,8 (does not fit): the default plan, %s", t.reason);
  /* Q in local memory past registers for its first k steps: 4 warps x 2 tiles (128 rows) at head_dim 128 take
     the local Q tile's 112 columns (120-element rows) and two 32-key buffers: 48 160 B, where the whole Q tile
     (52 224 B) does not fit. */
  check(fcl_parse_forward_mma_shape("4,2,32,1,2,1", ov.forward_mma_shape) == 0 && ov.forward_mma_shape[5] == 1,
        "FLASHCL_FORWARD_MMA_SHAPE=4,2,32,1,2,1 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && t.tr == 4 && t.rm == 2 && t.bc == 32 && t.qsmem == 1 && t.qregs == 1 && t.local_bytes == 48160 &&
            strstr(t.reason, "past its first 16 columns") && strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE"),
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=4,2,32,1,2,1: %zu B: %s", t.local_bytes, t.reason);
  check(fcl_parse_forward_mma_shape("4,2,32,1,2,0", ov.forward_mma_shape) == 0, "FLASHCL_FORWARD_MMA_SHAPE=4,2,32,1,2,0 parsed");
  r = fcl_plan_nvidia_forward(&nv, &ov, &p, 0, NULL, &t);
  check(r == 0 && !strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE") && t.qregs == 2 && t.local_bytes == 44064,
        "planner, head_dim 128, FLASHCL_FORWARD_MMA_SHAPE=4,2,32,1,2,0 (does not fit): the default plan, %s", t.reason);
  /* qregs is dropped where it cannot apply: Q in registers already, f32, or as many k steps as head_dim has. */
  static const struct { const char *shape; int dtype; } no_qregs[] = {
      {"4,1,32,0,2,2", FCL_DTYPE_F16}, {"2,1,16,1,2,1", FCL_DTYPE_F32}, {"2,2,32,1,2,8", FCL_DTYPE_F16}};
  for (size_t i = 0; i < sizeof no_qregs / sizeof no_qregs[0]; ++i) {
    fcl_problem pq = problem(128, no_qregs[i].dtype, 0);
    check(fcl_parse_forward_mma_shape(no_qregs[i].shape, ov.forward_mma_shape) == 0, "%s parsed", no_qregs[i].shape);
    r = fcl_plan_nvidia_forward(&nv, &ov, &pq, 0, NULL, &t);
    check(r == 0 && t.qregs == 0 && strstr(t.reason, "FLASHCL_FORWARD_MMA_SHAPE") && !strstr(t.reason, "past its first"),
          "planner, head_dim 128, dtype %d, FLASHCL_FORWARD_MMA_SHAPE=%s: no Q k steps in registers: %s",
          no_qregs[i].dtype, no_qregs[i].shape, t.reason);
  }
  static const char *const bad_mma[] = {"0,1,32,0", "9,1,32,0", "4,5,32,0", "4,1,24,0", "4,1,32,2", "4,1,32", "4,1,32,0,1",
                                        "4,1,32,0,9", "4,1,32,0,2,16", "4,1,32,0,2,0,0", "x", ""};
  for (size_t i = 0; i < sizeof bad_mma / sizeof bad_mma[0]; ++i) {
    int shape[7] = {7, 7, 7, 7, 7, 7, 7};
    check(fcl_parse_forward_mma_shape(bad_mma[i], shape) != 0 && shape[0] == 7,
          "FLASHCL_FORWARD_MMA_SHAPE=\"%s\" refused, shape untouched", bad_mma[i]);
  }

  /* Decode on a 132-unit device: the query heads of a GQA group packed into one work-group's tile (one warp
     for up to 16 rows, two where the grid has at most one block per sixteen units: the second warp's rows are
     padding, there for its share of the tile copies), the keys split to fill the device with about four row-owning warps a unit in
     chunks of at least four tiles, two with a padding warp (the counts the H200's sweeps found best or near
     it); no packing without GQA or with a block's worth of query rows (128 at head_dim 128). */
  fcl_device_caps h200 = nv;
  h200.compute_units = 132;
  static const struct {
    int64_t b, h, hkv, nq, nk, d;
    int pack, br, copying, splits;
  } dec[] = {{1, 32, 8, 1, 32768, 128, 1, 32, 1, 64},   {1, 32, 8, 4, 16384, 128, 1, 32, 1, 64},
             {1, 32, 8, 1, 4096, 128, 1, 32, 1, 32},    {1, 32, 8, 16, 4096, 64, 1, 64, 0, 16},
             {2, 32, 8, 1, 4096, 128, 1, 16, 0, 16},    {1, 8, 8, 1, 4096, 128, 0, 32, 1, 32},
             {1, 32, 32, 1, 131072, 128, 0, 16, 0, 16}, {8, 32, 8, 1, 8192, 128, 1, 16, 0, 8},
             {4, 32, 8, 100, 4096, 128, 1, 128, 0, 1},  {32, 32, 8, 1, 4096, 256, 1, 16, 0, 2},
             /* 240 and 256 blocks (1.7 to 2 a unit): a padding warp, 32-key tiles in four buffers, no split; 128,
                132, 136, 368 and 512 keep the rule's shape and count */
             {32, 32, 8, 1, 4096, 128, 1, 32, 1, 1},    {30, 32, 8, 1, 4096, 128, 1, 32, 1, 1},
             {8, 32, 32, 1, 8192, 128, 0, 32, 1, 1},    {16, 32, 8, 1, 4096, 128, 1, 16, 0, 4},
             {17, 32, 8, 1, 8192, 128, 1, 16, 0, 4},    {46, 32, 8, 1, 4096, 128, 1, 16, 0, 2},
             {64, 32, 8, 1, 2048, 128, 1, 16, 0, 1},    {33, 32, 4, 1, 4096, 128, 1, 16, 0, 4},
             {4, 32, 8, 200, 4096, 128, 0, 128, 0, 1},
             {1, 16, 16, 40, 4096, 64, 0, 64, 0, 8}}; /* 40 rows, 4 warps: counted as 4, none added to copy */
  for (size_t i = 0; i < sizeof dec / sizeof dec[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = dec[i].b, desc.num_heads = dec[i].h, desc.num_kv_heads = dec[i].hkv;
    desc.seqlen_q = dec[i].nq, desc.seqlen_k = dec[i].nk, desc.head_dim = dec[i].d, desc.dtype = FCL_DTYPE_F16;
    fcl_problem dp;
    r = fcl_resolve_problem(&desc, &dp) == FCL_SUCCESS
            ? fcl_plan_nvidia_forward(&h200, &no_overrides, &dp, 0, NULL, &t)
            : -1;
    const int splits = r == 0 ? fcl_plan_splits(&h200, &no_overrides, &dp, &t) : 0;
    const int64_t groups = r == 0 ? fcl_forward_row_blocks(&dp, &t) * fcl_forward_grid_heads(&dp, &t) * dp.batch : 0;
    const int64_t want_blocks = (dec[i].nq * (dec[i].pack ? dec[i].h / dec[i].hkv : 1) + dec[i].br - 1) / dec[i].br;
    /* QREG only beside a local Q tile (the kernel refuses anything else at build time, and the forward would
       then fall back to the portable kernel: correct, but many times slower); the mbarrier ring only for
       blocks of more than one warp of real rows. */
    check(r == 0 && t.pack == dec[i].pack && t.br == dec[i].br && t.copy_warps == dec[i].copying &&
              (t.qregs == 0 || t.qsmem) && t.mbar_ring == (dec[i].br / 16 - dec[i].copying > 1) &&
              (strstr(t.reason, "one of padding rows") != NULL) == dec[i].copying && t.local_bytes <= h200.local_mem_size &&
              fcl_forward_row_blocks(&dp, &t) == want_blocks &&
              fcl_forward_grid_heads(&dp, &t) == (dec[i].pack ? dec[i].hkv : dec[i].h) &&
              splits == dec[i].splits,
          "planner: decode B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld d=%lld on 132 units: %s, %d rows a block, %d "
          "chunks (want %d) over %lld work-groups: %s",
          (long long)dec[i].b, (long long)dec[i].h, (long long)dec[i].hkv, (long long)dec[i].nq, (long long)dec[i].nk,
          (long long)dec[i].d, t.pack ? "packed" : "not packed", t.br, splits, dec[i].splits, (long long)groups,
          t.reason);
  }

  /* Grids of few 128-row blocks: 4 warps x 1 tile (64 rows), 128-key tiles up to head_dim 64 and 64-key tiles up
     to 128, where the 64-row blocks fit one wave of three work-groups a unit (two on compute capability 8.6, whose
     units' shared memory holds two, and on a capability the planner does not know), with the keys in as many
     chunks as give each unit two of them; also short causal problems, whose own 64-row shape then splits so. Not
     taken: grids beyond that wave, fewer than 128 query rows, score modifiers, sinks, windows other than causal,
     per-sequence or paged keys, f32, head_dims above 128, devices of unknown size or too little local memory for
     the shape. */
  enum { PLAIN, SOFTCAP, SINKS, WINDOW, PER_SEQ, PAGED, CC86, CC_UNKNOWN, LOCAL24 };
  static const struct {
    int64_t b, h, hkv, nq, nk, d;
    fcl_dtype dtype;
    int causal, units, what, br, bc, splits, wave;
  } grid[] = {{1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {1, 16, 4, 1024, 4096, 128, FCL_DTYPE_BF16, 0, 132, PLAIN, 64, 64, 1, 2},
              {1, 16, 16, 1024, 4096, 64, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 128, 1, 2},
              {1, 16, 16, 1024, 4096, 64, FCL_DTYPE_BF16, 0, 132, PLAIN, 64, 128, 1, 2},
              {1, 33, 33, 512, 512, 96, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {1, 4, 4, 4096, 4096, 128, FCL_DTYPE_F16, 1, 132, PLAIN, 64, 64, 1, 2},
              {1, 49, 49, 512, 512, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {1, 50, 50, 512, 512, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 128, 32, 1, 0},
              {5, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {7, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 128, 32, 1, 0},
              {9, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {10, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 128, 32, 1, 0},
              {1, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 2, 2},
              {1, 8, 8, 1024, 4096, 128, FCL_DTYPE_F16, 1, 132, PLAIN, 64, 64, 2, 2},
              {1, 8, 8, 1024, 1024, 128, FCL_DTYPE_F16, 1, 132, PLAIN, 64, 64, 2, 2},
              {1, 4, 4, 1024, 4096, 64, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 128, 4, 2},
              {1, 8, 8, 1024, 128, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 1, 2},
              {1, 1, 1, 128, 1 << 20, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 64, 128, 2},
              {2, 16, 16, 1024, 4096, 128, FCL_DTYPE_F16, 0, 132, PLAIN, 128, 32, 1, 0},
              {2, 16, 16, 1024, 4096, 64, FCL_DTYPE_F16, 0, 132, PLAIN, 128, 128, 1, 0},
              {1, 32, 32, 64, 32768, 128, FCL_DTYPE_F16, 1, 132, PLAIN, 64, 64, 4, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, SOFTCAP, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, SINKS, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, WINDOW, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, PER_SEQ, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, PAGED, 128, 32, 1, 0},
              {1, 33, 33, 512, 512, 128, FCL_DTYPE_F16, 0, 132, CC86, 64, 64, 1, 2},
              {1, 34, 34, 512, 512, 128, FCL_DTYPE_F16, 0, 132, CC86, 128, 32, 1, 0},
              {1, 34, 34, 512, 512, 128, FCL_DTYPE_F16, 0, 132, CC_UNKNOWN, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 132, LOCAL24, 64, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F16, 0, 0, PLAIN, 128, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 256, FCL_DTYPE_F16, 0, 132, PLAIN, 64, 32, 1, 0},
              {1, 16, 16, 1024, 1024, 128, FCL_DTYPE_F32, 0, 132, PLAIN, 32, 16, 1, 0}};
  static const char *const what_name[] = {"",           ", softcap", ", sinks",         ", window 256",
                                          ", seqlens_k", ", paged",   ", cc 8.6",         ", cc 11.0",
                                          ", 24 KiB"};
  for (size_t i = 0; i < sizeof grid / sizeof grid[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = grid[i].b, desc.num_heads = grid[i].h, desc.num_kv_heads = grid[i].hkv;
    desc.seqlen_q = grid[i].nq, desc.seqlen_k = grid[i].nk, desc.head_dim = grid[i].d, desc.dtype = grid[i].dtype;
    desc.causal = grid[i].causal;
    if (grid[i].what == SOFTCAP) desc.softcap = 30.0f;
    if (grid[i].what == WINDOW) desc.window = 1, desc.window_left = 256, desc.window_right = -1;
    fcl_device_caps dc = h200;
    dc.compute_units = grid[i].units;
    if (grid[i].what == CC86) dc.nv_cc_major = 8, dc.nv_cc_minor = 6;
    if (grid[i].what == CC_UNKNOWN) dc.nv_cc_major = 11, dc.nv_cc_minor = 0;
    if (grid[i].what == LOCAL24) dc.local_mem_size = 24 << 10;
    fcl_problem sp;
    r = fcl_resolve_problem(&desc, &sp) == FCL_SUCCESS ? 0 : -1;
    if (grid[i].what == SINKS) sp.sinks = (cl_mem)&desc; /* stand-ins: only tested against NULL by the planner */
    if (grid[i].what == PER_SEQ) sp.seqlens_k = (cl_mem)&desc;
    if (grid[i].what == PAGED) sp.block_table = (cl_mem)&desc;
    if (r == 0) r = fcl_plan_nvidia_forward(&dc, &no_overrides, &sp, 0, NULL, &t);
    const int splits = r == 0 ? fcl_plan_splits(&dc, &no_overrides, &sp, &t) : 0;
    check(r == 0 && !t.pack && t.br == grid[i].br && t.bc == grid[i].bc && t.local_bytes <= dc.local_mem_size &&
              t.wave == grid[i].wave && (strstr(t.reason, "small grid") != NULL) == (grid[i].wave != 0) &&
              (grid[i].what == PER_SEQ || grid[i].what == PAGED || splits == grid[i].splits),
          "planner: B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld d=%lld %s%s%s on %d units: %d rows (want %d), %d-key tiles "
          "(want %d), wave %d (want %d), %d chunks (want %d): %s",
          (long long)grid[i].b, (long long)grid[i].h, (long long)grid[i].hkv, (long long)grid[i].nq,
          (long long)grid[i].nk, (long long)grid[i].d, dtype_name(grid[i].dtype), grid[i].causal ? " causal" : "",
          what_name[grid[i].what], grid[i].units, t.br, grid[i].br, t.bc, grid[i].bc, t.wave, grid[i].wave, splits,
          grid[i].splits, t.reason);
  }

  /* f32 decode (3xTF32): the same packing and warps, 64-key tiles up to head_dim 64 and 32-key tiles above (a
     float tile is twice an f16 one), and never the four-buffer ring of the 1.7-2 blocks a unit rule, which was
     measured in f16 only. */
  static const struct {
    int64_t b, h, hkv, d;
    int br, bc;
  } dec32[] = {{1, 32, 8, 128, 32, 32}, {1, 32, 8, 64, 32, 64}, {32, 32, 8, 128, 16, 32}, {30, 32, 8, 64, 16, 64}};
  for (size_t i = 0; i < sizeof dec32 / sizeof dec32[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = dec32[i].b, desc.num_heads = dec32[i].h, desc.num_kv_heads = dec32[i].hkv;
    desc.seqlen_q = 1, desc.seqlen_k = 4096, desc.head_dim = dec32[i].d, desc.dtype = FCL_DTYPE_F32;
    fcl_problem dp;
    r = fcl_resolve_problem(&desc, &dp) == FCL_SUCCESS ? fcl_plan_nvidia_forward(&h200, &no_overrides, &dp, 0, NULL, &t)
                                                        : -1;
    check(r == 0 && t.pack && t.br == dec32[i].br && t.bc == dec32[i].bc && t.stages == 2 && !t.qsmem &&
              t.local_bytes == fcl_nvidia_forward_local_bytes(&t, 4, 0) && t.local_bytes <= h200.local_mem_size &&
              strstr(t.reason, "3xTF32"),
          "planner: f32 decode B=%lld H=%lld Hkv=%lld d=%lld: %d rows a block (want %d), %d-key tiles (want %d) in %d "
          "buffers: %s",
          (long long)dec32[i].b, (long long)dec32[i].h, (long long)dec32[i].hkv, (long long)dec32[i].d, t.br,
          dec32[i].br, t.bc, dec32[i].bc, t.stages, t.reason);
  }

  /* Key counts per sequence in a batch (seqlens_k or cu_seqlens_k): on a small grid the longest sequence's keys
     in chunks of at most 16 tiles, as the rule's count may leave the longest sequences running alone; not for
     one sequence, nor for a grid with 8 warps a unit or more. The index buffers are only looked at for being
     set here (a stand-in handle, never read). */
  static const struct {
    int64_t b, nk;
    int per_seq, splits;
  } seq[] = {{64, 7996, 1, 8}, {64, 7996, 0, 1}, {16, 8000, 1, 8}, {32, 4096, 1, 4}, {8, 8192, 1, 8},
             {1, 32768, 1, 64}, {300, 8000, 1, 1}};
  for (size_t i = 0; i < sizeof seq / sizeof seq[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = seq[i].b, desc.num_heads = 32, desc.num_kv_heads = 8, desc.seqlen_q = 1, desc.seqlen_k = seq[i].nk;
    desc.head_dim = 128, desc.dtype = FCL_DTYPE_F16;
    fcl_problem dp;
    r = fcl_resolve_problem(&desc, &dp) == FCL_SUCCESS ? 0 : -1;
    if (seq[i].per_seq) dp.seqlens_k = (cl_mem)&desc;
    if (r == 0) r = fcl_plan_nvidia_forward(&h200, &no_overrides, &dp, 0, NULL, &t);
    const int splits = r == 0 ? fcl_plan_splits(&h200, &no_overrides, &dp, &t) : 0;
    check(r == 0 && splits == seq[i].splits,
          "planner: decode of %lld sequences of up to %lld keys, %s on 132 units: %d chunks (want %d)",
          (long long)seq[i].b, (long long)seq[i].nk, seq[i].per_seq ? "key counts per sequence" : "dense", splits,
          seq[i].splits);
  }

  /* Paged keys: 1.5x the dense rule's count, within the six one-warp work-groups a unit of compute
     capability 9.0 holds, beyond the dense count only in chunks of at least
     eight tiles, and no more chunks than that chunk size needs. */
  static const struct {
    int64_t b, h, hkv, nq, nk;
    int splits;
  } paged[] = {{1, 32, 8, 1, 32768, 64}, {1, 32, 8, 1, 4096, 32}, {1, 32, 32, 1, 131072, 24},
              {8, 32, 8, 1, 8192, 12},  {32, 32, 8, 1, 4096, 3}, {4, 32, 8, 4, 16384, 24},
              {1, 32, 8, 1, 256, 2},    {1, 32, 8, 1, 128, 1},      /* a padding warp: chunks of two tiles */
              {1, 32, 32, 1, 12000, 21},                            /* 188 tiles: 23 wanted, 21 chunks of 9 */
              {1, 8, 1, 1, 131072, 128}};                                /* 1.5 x 128 capped at FCL_MAX_SPLITS */
  for (size_t i = 0; i < sizeof paged / sizeof paged[0]; ++i) {
    r = paged_decode_plan(&h200, paged[i].b, paged[i].h, paged[i].hkv, paged[i].nq, paged[i].nk, &t);
    const int splits = r == 0 ? t.splits : 0;
    check(r == 0 && splits == paged[i].splits,
          "planner: paged decode B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld on 132 units: %d chunks (want %d)",
          (long long)paged[i].b, (long long)paged[i].h, (long long)paged[i].hkv, (long long)paged[i].nq,
          (long long)paged[i].nk, splits, paged[i].splits);
  }

  /* The paged count is bounded by the work-groups the units hold at once, from the compute capability's
     shared memory: 6 of the one-warp paged decode work-groups on 9.0 (228 KB), 4 on 8.0 (164 KB), 2 on 8.6
     (100 KB); an unknown capability keeps the dense count. B=1 H=32 Hkv=32 Nk=131072 (32 work-groups, dense
     count 16) on 132 units. */
  static const struct {
    int major, minor, per_unit, splits;
  } cc[] = {{9, 0, 6, 24}, {8, 0, 4, 16}, {8, 6, 2, 16}, {11, 0, 0, 16}};
  for (size_t i = 0; i < sizeof cc / sizeof cc[0]; ++i) {
    fcl_device_caps dev = h200;
    dev.nv_cc_major = cc[i].major, dev.nv_cc_minor = cc[i].minor;
    r = paged_decode_plan(&dev, 1, 32, 32, 1, 131072, &t);
    const int per_unit = r == 0 ? fcl_nvidia_groups_per_unit(&dev, t.local_bytes) : -1;
    check(r == 0 && per_unit == cc[i].per_unit && t.splits == cc[i].splits,
          "planner: paged decode on compute capability %d.%d: %d work-groups of %zu B a unit (want %d), %d chunks "
          "(want %d)",
          cc[i].major, cc[i].minor, per_unit, t.local_bytes, cc[i].per_unit, r == 0 ? t.splits : 0, cc[i].splits);
  }
}

/* NVIDIA's OpenCL reports 48 KiB of local memory, but a kernel's own __local arrays may take the multiprocessor's
   per-block maximum (fcl_nvidia_block_local). head_dim 128's default takes FlashAttention-2's tile (128 rows,
   64-key tiles, Q in local memory: 70 KiB) where two such work-groups fit a multiprocessor (compute capability
   9.0 and 8.0), and keeps 32-key tiles within 48 KiB elsewhere (8.6: one a multiprocessor; a capability out of
   the table; FLASHCL_LOCAL_MEM_LIMIT's 48 KiB). Causal rows of at most 2048 keep their 64-row blocks. The
   backward's larger tiles likewise. */
static void large_local_cases(void) {
  static const struct {
    int major, minor;
    cl_ulong block_local;
    int limited, causal, nq, bc, over_48k;
  } c[] = {{9, 0, 227 << 10, 0, 0, 4096, 64, 1}, {9, 0, 227 << 10, 0, 1, 4096, 64, 1},
           {8, 0, 163 << 10, 0, 0, 4096, 64, 1}, {8, 6, 99 << 10, 0, 0, 4096, 32, 0},
           {8, 9, 99 << 10, 0, 0, 4096, 32, 0},  {11, 0, 0, 0, 0, 4096, 32, 0},
           {9, 0, 227 << 10, 1, 0, 4096, 32, 0}, {9, 0, 227 << 10, 0, 1, 2048, 64, 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; ++i) {
    fcl_device_caps nv = nvidia_caps(c[i].major, c[i].minor);
    nv.nv_static_local = c[i].limited ? 48 << 10 : fcl_nvidia_block_local(c[i].major, c[i].minor);
    nv.compute_units = 132;
    fcl_problem p = test_problem(128, FCL_DTYPE_F16, c[i].nq, 0);
    p.causal = c[i].causal;
    fcl_tile_plan t;
    const int r = fcl_plan_nvidia_forward(&nv, &no_overrides, &p, 0, NULL, &t);
    check(nv.nv_static_local == (c[i].limited ? 48 << 10 : c[i].block_local) && r == 0 && t.bc == c[i].bc &&
              (t.local_bytes > (48 << 10)) == c[i].over_48k &&
              t.local_bytes + 16 <= (nv.nv_static_local > nv.local_mem_size ? nv.nv_static_local : nv.local_mem_size),
          "planner: compute capability %d.%d%s, f16 head_dim 128, %d rows%s: %d-key tiles, %zu B local (want %d-key "
          "tiles, %s 48 KiB)",
          c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", c[i].nq, c[i].causal ? " causal" : "",
          r == 0 ? t.bc : 0, r == 0 ? t.local_bytes : 0, c[i].bc, c[i].over_48k ? "over" : "within");
    /* With an additive mask the 32-key tiles stay (the 64-key ones ran slower causal). */
    p.mask = (cl_mem)&p; /* the planner only tests it against NULL */
    p.mask_dtype = FCL_DTYPE_F16;
    const int rm = fcl_plan_nvidia_forward(&nv, &no_overrides, &p, 0, NULL, &t);
    check(rm == 0 && t.bc == (c[i].causal && c[i].nq <= 2048 ? 64 : 32) && t.local_bytes <= (48 << 10),
          "planner: compute capability %d.%d%s, f16 head_dim 128, %d rows%s, a mask: %d-key tiles within 48 KiB",
          c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", c[i].nq, c[i].causal ? " causal" : "",
          rm == 0 ? t.bc : 0);
    /* f16 and bf16 at head_dim 64 from 1024 query rows: FlashAttention-2's tile (128 rows, 128-key tiles, Q in
       local memory, 54 KiB) where two fit a unit (8.0 and 9.0 here), else the 48 KiB rows; not with a mask. The
       8 heads of test_problem at 2048 rows fit one wave of 64-row blocks, which the small-grid rule takes, so
       at 2048 rows this check runs 4 x 16 heads (the benchmarks' grid). */
    const int fa2_tile = !c[i].limited && c[i].block_local >= (163 << 10) && c[i].nq >= 1024;
    for (int dt = FCL_DTYPE_F16; dt <= FCL_DTYPE_BF16; ++dt) {
      for (int masked = 0; masked < 2; ++masked) {
        fcl_problem p64 = test_problem(64, (fcl_dtype)dt, c[i].nq, 0);
        p64.causal = c[i].causal;
        if (c[i].nq < 4096) p64.batch = 4, p64.heads = p64.kv_heads = 16, p64.group = 1;
        if (masked) {
          p64.mask = (cl_mem)&p64;
          p64.mask_dtype = FCL_DTYPE_F16;
        }
        const int r64 = fcl_plan_nvidia_forward(&nv, &no_overrides, &p64, 0, NULL, &t);
        const int want = fa2_tile && !masked;
        const int got = r64 == 0 && t.qsmem && t.br == 128 && t.bc == 128;
        check(r64 == 0 && got == want && (t.local_bytes > (48 << 10)) == want,
              "planner: compute capability %d.%d%s, %s head_dim 64, %d rows%s%s: %d rows x %d keys, Q in %s, %zu B "
              "local (want %s)",
              c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", dtype_name((fcl_dtype)dt), c[i].nq,
              c[i].causal ? " causal" : "", masked ? ", a mask" : "", r64 == 0 ? t.br : 0, r64 == 0 ? t.bc : 0,
              r64 == 0 && t.qsmem ? "local memory" : "registers", r64 == 0 ? t.local_bytes : 0,
              want ? "FlashAttention-2's tile" : "a tile within 48 KiB");
      }
    }
    /* At 1024 query rows (4 x 16 heads) FlashAttention-2's tile not causal; causal, 64-row blocks of 128 keys. */
    for (int causal = 0; causal < 2 && c[i].major == 9 && !c[i].limited; ++causal) {
      fcl_problem p1k = test_problem(64, FCL_DTYPE_F16, 1024, 0);
      p1k.batch = 4, p1k.heads = p1k.kv_heads = 16, p1k.group = 1;
      p1k.causal = causal;
      const int r1k = fcl_plan_nvidia_forward(&nv, &no_overrides, &p1k, 0, NULL, &t);
      const int want_br = causal ? 64 : 128;
      check(r1k == 0 && t.br == want_br && t.bc == 128 && t.qsmem == !causal,
            "planner: compute capability 9.0, f16 head_dim 64, 1024 rows%s: %d rows x %d keys, Q in %s (want %d rows "
            "x 128 keys)",
            causal ? " causal" : "", r1k == 0 ? t.br : 0, r1k == 0 ? t.bc : 0,
            r1k == 0 && t.qsmem ? "local memory" : "registers", want_br);
    }
    /* The f32 backward at head_dim 128: 32-row steps and 32-key tiles where both kernels fit two a unit. */
    const fcl_problem pb = test_problem(128, FCL_DTYPE_F32, c[i].nq, 0);
    fcl_tile_plan tb[2];
    const int rb = fcl_plan_nvidia_backward(&nv, &no_overrides, &pb, 0, NULL, tb);
    const int rows = !c[i].limited && c[i].block_local >= (163 << 10) ? 32 : 16;
    check(rb == 0 && tb[FCL_BWD_DKDV].br == rows && tb[FCL_BWD_DQ].bc == rows,
          "planner: compute capability %d.%d%s, f32 backward head_dim 128: %d-row steps, %d-key tiles (want %d)",
          c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", rb == 0 ? tb[FCL_BWD_DKDV].br : 0,
          rb == 0 ? tb[FCL_BWD_DQ].bc : 0, rows);
    /* f16 and bf16 at head_dim 64 and 32 without a mask (a softcap or ALiBi included): two m16 tiles of keys a warp,
       K and V resident, 128-row steps (110 KiB at head_dim 64, 62 KiB at 32) where both kernels fit two a unit (9.0
       here; at head_dim 32 8.0 too); else, and with a mask everywhere, 64-row steps within 48 KiB. */
    for (int dt = FCL_DTYPE_F16; dt <= FCL_DTYPE_BF16; ++dt) {
      static const char *const what[] = {"", "", ", a mask", ", a softcap", ", ALiBi"};
      for (int variant = 0; variant < 5; ++variant) {
        const int d32 = variant == 1 || variant == 4;
        fcl_problem ph = test_problem(d32 ? 32 : 64, (fcl_dtype)dt, c[i].nq, 0);
        if (variant == 2) {
          ph.mask = (cl_mem)&ph;
          ph.mask_dtype = FCL_DTYPE_F16;
        }
        if (variant == 3) ph.softcap = 30.0f;
        if (variant == 4) ph.alibi = (cl_mem)&ph;
        const int r64 = fcl_plan_nvidia_backward(&nv, &no_overrides, &ph, 0, NULL, tb);
        const int two = !c[i].limited && variant != 2 && c[i].block_local >= (d32 ? (163 << 10) : (227 << 10));
        check(r64 == 0 && tb[FCL_BWD_DKDV].kv_resident == two && tb[FCL_BWD_DKDV].rm == (two ? 2 : 1) &&
                  tb[FCL_BWD_DKDV].bc == (two ? 128 : 64) && tb[FCL_BWD_DKDV].br == (two ? 128 : 64) &&
                  tb[FCL_BWD_DQ].bc == 64 && (tb[FCL_BWD_DKDV].local_bytes > (48 << 10)) == two,
              "planner: compute capability %d.%d%s, %s backward head_dim %d%s: %d keys, %d-row steps%s (want %d, "
              "%d%s)",
              c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", dtype_name((fcl_dtype)dt),
              (int)ph.d, what[variant], r64 == 0 ? tb[FCL_BWD_DKDV].bc : 0, r64 == 0 ? tb[FCL_BWD_DKDV].br : 0,
              r64 == 0 && tb[FCL_BWD_DKDV].kv_resident ? ", K and V resident" : "", two ? 128 : 64, two ? 128 : 64,
              two ? ", K and V resident" : "");
      }
    }
    /* f16 and bf16 at head_dim 128: K and V resident (with FlashAttention-2's warp tiles, kv_resident 2: below), 64-row
       steps and two dQ tiles a warp with 32-key tiles (112 and 102 KiB) where both fit two a unit (9.0 here; 8.0's
       164 KiB holds one), else 32-row steps and 32-key tiles within 48 KiB. */
    const int resident = !c[i].limited && c[i].block_local >= (227 << 10);
    for (int dt = FCL_DTYPE_F16; dt <= FCL_DTYPE_BF16; ++dt) {
      /* The warp tiles only without a score modifier (a sliding window and sinks are none) and at a padded head_dim
         of 96 or 128 (head_dim 112 keeps K and V resident without them). */
      static const char *const what[] = {"", ", a softcap", ", ALiBi", ", an f16 mask", ", a window and sinks", ""};
      for (int m = 0; m < 6; ++m) {
        fcl_problem ph = test_problem(m == 5 ? 112 : 128, (fcl_dtype)dt, c[i].nq, 0);
        if (m == 1) ph.softcap = 30.0f;
        if (m == 2) ph.alibi = (cl_mem)&ph;
        if (m == 3) ph.mask = (cl_mem)&ph, ph.mask_dtype = FCL_DTYPE_F16;
        if (m == 4) ph.wl = 16, ph.wr = 0, ph.sinks = (cl_mem)&ph;
        const int rh = fcl_plan_nvidia_backward(&nv, &no_overrides, &ph, 0, NULL, tb);
        const int want = resident ? 64 : 32, want_resident = !resident ? 0 : m == 0 || m == 4 ? 2 : 1;
        /* dQ where both fit two a unit: two m16 tiles a warp, Q and dO in local memory, 32-key tiles; one tile and
           64-key tiles under a window with at most 1024 query rows. */
        const int dq_one = m == 4 && c[i].nq <= 1024, want_dq_rm = resident && !dq_one ? 2 : 1;
        const int want_dq_bc = !resident ? 32 : dq_one ? 64 : 32;
        check(rh == 0 && tb[FCL_BWD_DKDV].kv_resident == want_resident && tb[FCL_BWD_DKDV].br == want &&
                  tb[FCL_BWD_DQ].bc == want_dq_bc && tb[FCL_BWD_DQ].rm == want_dq_rm &&
                  (tb[FCL_BWD_DKDV].local_bytes > (48 << 10)) == resident &&
                  (resident || tb[FCL_BWD_DQ].local_bytes <= (48 << 10)),
              "planner: compute capability %d.%d%s, %s backward head_dim %d%s: %d-row steps, kv_resident %d, dQ %d-key "
              "tiles x %d m16 tiles a warp (want %d, %d, %d x %d)",
              c[i].major, c[i].minor, c[i].limited ? " limited to 48 KiB" : "", dtype_name((fcl_dtype)dt), (int)ph.d,
              what[m], rh == 0 ? tb[FCL_BWD_DKDV].br : 0, rh == 0 ? tb[FCL_BWD_DKDV].kv_resident : -1,
              rh == 0 ? tb[FCL_BWD_DQ].bc : 0, rh == 0 ? tb[FCL_BWD_DQ].rm : 0, want, want_resident, want_dq_bc,
              want_dq_rm);
      }
    }
  }
}

/* The tensor-core backward's planner over the same made-up devices: f32 (3xTF32), f16 and bf16 at head_dim 64
   and 128 (and every multiple of 8 up to 128) with both kernels' tiles within local memory (48 KiB), dQ with two m16
   tiles of query rows a warp in f16 and bf16 up to head_dim 64; declined, with a
   reason, for head_dim 256 or not a multiple of 8, unaligned rows, FCL_FLAG_PORTABLE_ONLY, other platforms, compute
   capability 7.x, paged K/V, and too little local memory. */
static void backward_planner_cases(void) {
  const fcl_device_caps nv = nvidia_caps(9, 0);
  fcl_tile_plan t[2];
  for (int d = 8; d <= 128; d += 8)
    for (int dt = 0; dt <= 2; ++dt) {
      fcl_problem p = problem(d, (fcl_dtype)dt, 0);
      /* f32: k steps of 8 and rows 4 words apart modulo 8; f16/bf16: k steps of 16, rows 16 bytes modulo 128. */
      const int kstep = dt == FCL_DTYPE_F32 ? 8 : 16, pad = dt == FCL_DTYPE_F32 ? 4 : 8;
      const int eb = dt == FCL_DTYPE_F32 ? 4 : 2;
      int ok = fcl_plan_nvidia_backward(&nv, &no_overrides, &p, 0, NULL, t) == 0;
      for (int w = 0; w < 2 && ok; ++w)
        ok = t[w].variant == FCL_VARIANT_NVIDIA_BACKWARD && t[w].dp >= d && t[w].dp % kstep == 0 &&
             t[w].ds == t[w].dp + pad && t[w].wg == t[w].tr * 32 &&
             (w == FCL_BWD_DKDV ? t[w].bc : t[w].br) == t[w].tr * 16 * t[w].rm &&
             (w == FCL_BWD_DKDV ? t[w].br : t[w].bc) % 16 == 0 &&
             t[w].local_bytes == fcl_nvidia_backward_local_bytes(&t[w], w, eb) &&
             t[w].local_bytes + 16 <= nv.local_mem_size && strlen(t[w].reason) > 0 &&
             (dt != FCL_DTYPE_F32 || strstr(t[w].reason, "3xTF32") || w == FCL_BWD_DQ) &&
             /* dQ: two m16 tiles of query rows a warp in f16 and bf16 up to head_dim 64, one elsewhere */
             t[w].rm == (w == FCL_BWD_DQ && dt != FCL_DTYPE_F32 && d <= 64 ? 2 : 1);
      if (!ok || d == 64 || d == 128)
        check(ok, "backward planner: NVIDIA cc 9.0, %s head_dim %d: tensor cores, dK/dV %d keys x %d query rows (%zu B), "
              "dQ %d rows x %d keys (%zu B)", dtype_name((fcl_dtype)dt), d, t[0].bc, t[0].br, t[0].local_bytes, t[1].br,
              t[1].bc, t[1].local_bytes);
    }
  struct {
    const char *what;
    int vendor, cc;
    unsigned flags;
    int64_t d, offset;
    fcl_dtype dtype;
    int paged;
  } no[] = {
      {"f32, offset 2 elements (rows not on 16 bytes)", FCL_VENDOR_NVIDIA, 9, 0, 64, 2, FCL_DTYPE_F32, 0},
      {"head_dim 256", FCL_VENDOR_NVIDIA, 9, 0, 256, 0, FCL_DTYPE_F16, 0},
      {"head_dim 136", FCL_VENDOR_NVIDIA, 9, 0, 136, 0, FCL_DTYPE_BF16, 0},
      {"head_dim 60", FCL_VENDOR_NVIDIA, 9, 0, 60, 0, FCL_DTYPE_F16, 0},
      {"offset 4 elements (rows not on 16 bytes)", FCL_VENDOR_NVIDIA, 9, 0, 64, 4, FCL_DTYPE_BF16, 0},
      {"FCL_FLAG_PORTABLE_ONLY", FCL_VENDOR_NVIDIA, 9, FCL_FLAG_PORTABLE_ONLY, 128, 0, FCL_DTYPE_F16, 0},
      {"other platform (PoCL)", FCL_VENDOR_OTHER, 0, 0, 64, 0, FCL_DTYPE_F16, 0},
      {"compute capability 7.x", FCL_VENDOR_NVIDIA, 7, 0, 64, 0, FCL_DTYPE_F16, 0},
      {"paged K/V", FCL_VENDOR_NVIDIA, 9, 0, 64, 0, FCL_DTYPE_F16, 1},
  };
  for (size_t i = 0; i < sizeof no / sizeof no[0]; ++i) {
    fcl_device_caps caps = nv;
    caps.vendor = no[i].vendor;
    caps.nv_cc_major = no[i].cc;
    fcl_problem p = problem(no[i].d, no[i].dtype, no[i].offset);
    if (no[i].d == 256) p.d = 256; /* resolve takes it; the planner must decline */
    if (no[i].paged) p.block_table = (cl_mem)&caps; /* only tested against NULL by the planner */
    const int r = fcl_plan_nvidia_backward(&caps, &no_overrides, &p, no[i].flags, NULL, t);
    check(r != 0 && t[0].variant != FCL_VARIANT_NVIDIA_BACKWARD && strlen(t[0].reason) > 0, "backward planner: %s declines: %s",
          no[i].what, t[0].reason);
  }
  /* Rows 16 bytes apart but with a row stride that is not a multiple of 8 elements. */
  fcl_problem odd = problem(64, FCL_DTYPE_F16, 0);
  odd.k_stride[2] = 68;
  check(fcl_plan_nvidia_backward(&nv, &no_overrides, &odd, 0, NULL, t) != 0 && strlen(t[0].reason) > 0,
        "backward planner: k row stride 68 elements declines: %s", t[0].reason);
  /* 24 KiB of local memory: smaller shapes within it at head_dim 64 and 128 (dK/dV 1 warp, 17 664 B; dQ 4 warps
     of 16-key tiles, 17 408 B); 16 KiB at head_dim 128 and 4 KiB declined with a reason. */
  fcl_device_caps small = nv;
  small.local_mem_size = 24 << 10;
  static const int small_dims[] = {64, 128};
  fcl_problem p;
  int r;
  for (int i = 0; i < 2; ++i) {
    p = problem(small_dims[i], FCL_DTYPE_BF16, 0);
    r = fcl_plan_nvidia_backward(&small, &no_overrides, &p, 0, NULL, t);
    check(r == 0 && t[0].local_bytes + 16 <= small.local_mem_size && t[1].local_bytes + 16 <= small.local_mem_size &&
              t[0].local_bytes == fcl_nvidia_backward_local_bytes(&t[0], FCL_BWD_DKDV, 2) &&
              t[1].local_bytes == fcl_nvidia_backward_local_bytes(&t[1], FCL_BWD_DQ, 2),
          "backward planner: 24 KiB local memory, head_dim %d: dK/dV %d warps, %zu B; dQ %d warps, %zu B", small_dims[i],
          t[0].tr, t[0].local_bytes, t[1].tr, t[1].local_bytes);
  }
  small.local_mem_size = 16 << 10;
  r = fcl_plan_nvidia_backward(&small, &no_overrides, &p, 0, NULL, t);
  check(r != 0 && strlen(t[0].reason) > 0, "backward planner: 16 KiB local memory, head_dim 128 declines: %s", t[0].reason);
  small.local_mem_size = 4 << 10;
  r = fcl_plan_nvidia_backward(&small, &no_overrides, &p, 0, NULL, t);
  check(r != 0 && strlen(t[0].reason) > 0, "backward planner: 4 KiB local memory, head_dim 128 declines: %s", t[0].reason);

  /* FLASHCL_BACKWARD_SHAPE: its shapes first, said in the reason; one that does not fit gives way to the
     default shapes; malformed or out-of-range text is refused by the parser. */
  fcl_plan_overrides ov;
  memset(&ov, 0, sizeof ov);
  check(fcl_parse_backward_shape("3,16,2,32", ov.backward_shape) == 0 && ov.backward_shape[0] == 3 &&
            ov.backward_shape[3] == 32,
        "FLASHCL_BACKWARD_SHAPE=3,16,2,32 parsed");
  r = fcl_plan_nvidia_backward(&nv, &ov, &p, 0, NULL, t);
  check(r == 0 && t[0].tr == 3 && t[0].bc == 48 && t[0].br == 16 && t[1].tr == 2 && t[1].br == 32 && t[1].bc == 32 &&
            strstr(t[0].reason, "FLASHCL_BACKWARD_SHAPE") && strstr(t[1].reason, "FLASHCL_BACKWARD_SHAPE"),
        "backward planner, head_dim 128, FLASHCL_BACKWARD_SHAPE=3,16,2,32: dK/dV %d warps, %d rows a step; dQ %d warps, "
        "%d-key tiles: %s",
        t[0].tr, t[0].br, t[1].tr, t[1].bc, t[0].reason);
  int big[7];
  check(fcl_parse_backward_shape("8,128,8,128", big) == 0 && big[4] == 0, "FLASHCL_BACKWARD_SHAPE=8,128,8,128 parsed");
  memcpy(ov.backward_shape, big, sizeof big);
  r = fcl_plan_nvidia_backward(&nv, &ov, &p, 0, NULL, t);
  /* The default shapes at head_dim 128: dK/dV 4 warps, 32 rows a step (K over the second step buffer, V over
     the first: 4 x 32 rows of 136 elements and lse, Dvec, 35 328 B); dQ 4 warps, 32-key tiles. */
  check(r == 0 && t[0].tr == 4 && t[0].br == 32 && t[0].local_bytes == 35328 && t[1].tr == 4 && t[1].bc == 32 &&
            t[0].local_bytes + 16 <= nv.local_mem_size && t[1].local_bytes + 16 <= nv.local_mem_size &&
            !strstr(t[0].reason, "FLASHCL_BACKWARD_SHAPE") && !strstr(t[1].reason, "FLASHCL_BACKWARD_SHAPE"),
        "backward planner, head_dim 128, FLASHCL_BACKWARD_SHAPE=8,128,8,128 (does not fit): the default shapes, %s",
        t[0].reason);
  static const char *const bad[] = {"3,15,2,32", "0,16,2,32", "9,16,2,32", "3,16,2", "3,16,2,32,3", "3,144,2,32",
                                    "x", "", "3,16,2,32,", "3,16,2,32,1,0", "3,16,2,32,1,3", "3,16,2,32,1,1,0",
                                    "3,16,2,32,1,1,3", "3,16,2,32,1,1,1,1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    int shape[7] = {7, 7, 7, 7, 7, 7, 7};
    check(fcl_parse_backward_shape(bad[i], shape) != 0 && shape[0] == 7,
          "FLASHCL_BACKWARD_SHAPE=\"%s\" refused, shape untouched", bad[i]);
  }

  /* kv_resident (the fifth value): the dK/dV kernel keeps K and V after its two step buffers (KV_RESIDENT), in local
     memory beyond the 48 KiB NVIDIA's OpenCL reports, so only where the device's kernel arrays may take it; f32 reads
     K and V from global memory and ignores it. */
  check(fcl_parse_backward_shape("4,64,4,32,1", ov.backward_shape) == 0 && ov.backward_shape[4] == 1,
        "FLASHCL_BACKWARD_SHAPE=4,64,4,32,1 parsed");
  fcl_device_caps h100 = nv;
  h100.nv_static_local = fcl_nvidia_block_local(9, 0);
  r = fcl_plan_nvidia_backward(&h100, &ov, &p, 0, NULL, t);
  char defs[512] = "";
  if (r == 0) fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD].defines(&p, &t[0], FCL_BWD_DKDV, "", defs, sizeof defs);
  check(r == 0 && t[0].kv_resident && t[0].br == 64 && t[0].local_bytes == (4 * 64 + 2 * 64) * 136 * 2 + 4 * 64 * 4 &&
            strstr(defs, "-DKV_RESIDENT=1") && strstr(t[0].reason, "K and V in local memory") && !t[1].kv_resident,
        "backward planner, head_dim 128, FLASHCL_BACKWARD_SHAPE=4,64,4,32,1 on compute capability 9.0: K and V "
        "resident, %zu B local: %s", t[0].local_bytes, t[0].reason);
  r = fcl_plan_nvidia_backward(&nv, &ov, &p, 0, NULL, t);
  check(r == 0 && !t[0].kv_resident && t[0].br == 32 && !strstr(t[0].reason, "FLASHCL_BACKWARD_SHAPE"),
        "backward planner, head_dim 128, FLASHCL_BACKWARD_SHAPE=4,64,4,32,1 within 48 KiB: the default shapes");
  const fcl_problem p32 = problem(128, FCL_DTYPE_F32, 0);
  r = fcl_plan_nvidia_backward(&h100, &ov, &p32, 0, NULL, t);
  check(r == 0 && !t[0].kv_resident, "backward planner, f32 head_dim 128, FLASHCL_BACKWARD_SHAPE=4,64,4,32,1: K and V "
        "read from global memory as ever");

  /* kv_resident 2: FlashAttention-2's warp tiles besides (WARP2D, with its P^T / dS^T exchange tile of 64 x 72), only
     with 4 warps, steps of a multiple of 32 rows and a padded head_dim of a multiple of 32; otherwise K and V stay
     resident without them. */
  check(fcl_parse_backward_shape("4,64,4,64,2", ov.backward_shape) == 0 && ov.backward_shape[4] == 2,
        "FLASHCL_BACKWARD_SHAPE=4,64,4,64,2 parsed");
  r = fcl_plan_nvidia_backward(&h100, &ov, &p, 0, NULL, t);
  defs[0] = 0;
  if (r == 0) fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD].defines(&p, &t[0], FCL_BWD_DKDV, "", defs, sizeof defs);
  check(r == 0 && t[0].kv_resident == 2 && t[0].local_bytes == ((4 * 64 + 2 * 64) * 136 + 64 * 72) * 2 + 4 * 64 * 4 &&
            strstr(defs, "-DKV_RESIDENT=1 -DWARP2D=1") && strstr(t[0].reason, "warp tiles") && !t[1].kv_resident,
        "backward planner, head_dim 128, FLASHCL_BACKWARD_SHAPE=4,64,4,64,2 on compute capability 9.0: warp tiles, "
        "%zu B local: %s", t[0].local_bytes, t[0].reason);
  check(fcl_parse_backward_shape("2,64,4,64,2", ov.backward_shape) == 0, "FLASHCL_BACKWARD_SHAPE=2,64,4,64,2 parsed");
  r = fcl_plan_nvidia_backward(&h100, &ov, &p, 0, NULL, t);
  defs[0] = 0;
  if (r == 0) fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD].defines(&p, &t[0], FCL_BWD_DKDV, "", defs, sizeof defs);
  check(r == 0 && t[0].kv_resident == 1 && !strstr(defs, "WARP2D"),
        "backward planner, FLASHCL_BACKWARD_SHAPE=2,64,4,64,2: 2 warps keep K and V resident without warp tiles");

  /* dq_tiles (the sixth value) 2: each dQ warp owns two m16 tiles of query rows (QT), 128 rows a work-group of 4
     warps, only in f16 and bf16; above a padded head_dim of 64 with Q and dO in local memory (two [128][136] tiles
     after K and V). */
  check(fcl_parse_backward_shape("4,128,4,64,1,2", ov.backward_shape) == 0 && ov.backward_shape[5] == 2,
        "FLASHCL_BACKWARD_SHAPE=4,128,4,64,1,2 parsed");
  check(fcl_parse_backward_shape("4,128,4,64", ov.backward_shape) == 0 && ov.backward_shape[5] == 1,
        "FLASHCL_BACKWARD_SHAPE=4,128,4,64: dq_tiles 1");
  (void)fcl_parse_backward_shape("4,128,4,64,1,2", ov.backward_shape);
  for (int dt = FCL_DTYPE_F32; dt <= FCL_DTYPE_BF16; ++dt)
    for (int hd = 64; hd <= 128; hd += 64) {
      const fcl_problem pq = test_problem(hd, (fcl_dtype)dt, 1000, 0);
      r = fcl_plan_nvidia_backward(&h100, &ov, &pq, 0, NULL, t);
      const int two = dt != FCL_DTYPE_F32;
      const size_t want_bytes = (size_t)(4 * 64 + (hd > 64 ? 2 * 128 : 0)) * (hd + 8) * 2;
      defs[0] = 0;
      if (r == 0) fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD].defines(&pq, &t[1], FCL_BWD_DQ, "", defs, sizeof defs);
      check(r == 0 && t[1].rm == (two ? 2 : 1) && t[1].br == (two ? 128 : 64) && t[1].bc == 64 &&
                !strstr(defs, "-DQT=2") == !two && (!two || strstr(t[1].reason, "x 32 query rows")) &&
                (!two || t[1].local_bytes == want_bytes),
            "backward planner, %s head_dim %d, FLASHCL_BACKWARD_SHAPE=4,128,4,64,1,2: dQ %d rows a work-group, %d m16 "
            "tiles a warp (want %d): %s",
            dtype_name((fcl_dtype)dt), hd, r == 0 ? t[1].br : 0, r == 0 ? t[1].rm : 0, two ? 2 : 1,
            r == 0 ? t[1].reason : "declined");
    }

  /* Above a padded head_dim of 64 two tiles take key tiles of a multiple of 32 (the chunks their local Q and dO
     fragments serve): 48-key tiles keep one tile at head_dim 128, not at 64. */
  static const struct {
    const char *shape;
    int d, two;
  } chunked[] = {{"4,64,4,32,2,2", 128, 1}, {"4,64,4,48,2,2", 128, 0}, {"4,64,4,48,1,2", 64, 1}};
  for (size_t i = 0; i < sizeof chunked / sizeof chunked[0]; ++i) {
    (void)fcl_parse_backward_shape(chunked[i].shape, ov.backward_shape);
    const fcl_problem pq = test_problem(chunked[i].d, FCL_DTYPE_F16, 1000, 0);
    r = fcl_plan_nvidia_backward(&h100, &ov, &pq, 0, NULL, t);
    /* Rows of [ds] elements: K and V [2][bc], reused for dQ [br]; two local tiles add Q and dO [br] each. */
    const int kv = 4 * t[1].bc, local_q = chunked[i].two && chunked[i].d > 64;
    const size_t want = (size_t)(local_q ? kv + 2 * t[1].br : kv > t[1].br ? kv : t[1].br) * (chunked[i].d + 8) * 2;
    check(r == 0 && t[1].rm == (chunked[i].two ? 2 : 1) && t[1].local_bytes == want,
          "backward planner, f16 head_dim %d, FLASHCL_BACKWARD_SHAPE=%s: %d dQ tiles a warp (want %d): %s",
          chunked[i].d, chunked[i].shape, r == 0 ? t[1].rm : 0, chunked[i].two ? 2 : 1,
          r == 0 ? t[1].reason : "declined");
  }

  /* dkdv_tiles (the seventh value) 2: each dK/dV warp owns two m16 tiles of keys (QT), 128 keys a work-group of 4
     warps, only with K and V resident without the warp tiles, f16 or bf16, a padded head_dim up to 64 and steps of a
     multiple of 32 rows (the chunks S^T and dP^T are taken in). */
  static const struct {
    const char *shape;
    int d, dtype, two;
  } key_tiles[] = {{"4,32,4,64,1,2,2", 64, FCL_DTYPE_F16, 1}, {"4,32,4,64,1,2,2", 40, FCL_DTYPE_BF16, 1},
                   {"4,32,4,64,1,2,2", 128, FCL_DTYPE_F16, 0}, {"4,32,4,64,2,2,2", 64, FCL_DTYPE_F16, 0},
                   {"4,32,4,64,0,2,2", 64, FCL_DTYPE_F16, 0}, {"4,32,4,64,1,2,2", 64, FCL_DTYPE_F32, 0},
                   {"4,48,4,64,1,2,2", 64, FCL_DTYPE_F16, 0}};
  for (size_t i = 0; i < sizeof key_tiles / sizeof key_tiles[0]; ++i) {
    check(fcl_parse_backward_shape(key_tiles[i].shape, ov.backward_shape) == 0 && ov.backward_shape[6] == 2,
          "FLASHCL_BACKWARD_SHAPE=%s parsed", key_tiles[i].shape);
    const fcl_problem pk = test_problem(key_tiles[i].d, (fcl_dtype)key_tiles[i].dtype, 1000, 0);
    r = fcl_plan_nvidia_backward(&h100, &ov, &pk, 0, NULL, t);
    defs[0] = 0;
    if (r == 0) fcl_variants[FCL_VARIANT_NVIDIA_BACKWARD].defines(&pk, &t[0], FCL_BWD_DKDV, "", defs, sizeof defs);
    const int two = key_tiles[i].two;
    /* Two step buffers of Q and dO [32][ds] and K, V [128][ds] resident, lse and Dvec [2][32]. */
    const size_t want = (size_t)(4 * 32 + 2 * 128) * (size_t)(r == 0 ? t[0].ds : 0) * 2 + 4 * 32 * 4;
    check(r == 0 && t[0].rm == (two ? 2 : 1) && t[0].bc == 64 * (two ? 2 : 1) && !strstr(defs, "-DQT=2") == !two &&
              (!two || (strstr(t[0].reason, "4 warps x 32 keys") && t[0].local_bytes == want)),
          "backward planner, %s head_dim %d, FLASHCL_BACKWARD_SHAPE=%s: %d key tiles a warp (want %d), %zu B: %s",
          dtype_name((fcl_dtype)key_tiles[i].dtype), key_tiles[i].d, key_tiles[i].shape, r == 0 ? t[0].rm : 0,
          two ? 2 : 1, r == 0 ? t[0].local_bytes : 0, r == 0 ? t[0].reason : "declined");
  }
  check(fcl_parse_backward_shape("4,32,4,64,1,2,3", ov.backward_shape) != 0, "FLASHCL_BACKWARD_SHAPE with dkdv_tiles 3 "
        "refused");

  /* The default: two dQ tiles at head_dim 64 and 128 but where a window (causal included) hides keys and there are at
     most 1024 query rows, where one tile's smaller work-groups even out their unequal work; at head_dim 128 two
     tiles take 32-key tiles and one 64-key tiles. */
  static const struct {
    int64_t n;
    int causal, two;
  } dq_rows[] = {{1024, 0, 1}, {1024, 1, 0}, {1025, 1, 1}, {4096, 1, 1}, {100, 1, 0}};
  for (int hd = 64; hd <= 128; hd += 64)
    for (size_t i = 0; i < sizeof dq_rows / sizeof dq_rows[0]; ++i) {
      fcl_problem pq = test_problem(hd, FCL_DTYPE_F16, dq_rows[i].n, 0);
      if (dq_rows[i].causal) pq.causal = 1, pq.wl = pq.nk, pq.wr = 0;
      r = fcl_plan_nvidia_backward(&h100, &no_overrides, &pq, 0, NULL, t);
      const int want_bc = hd == 128 && dq_rows[i].two ? 32 : 64;
      check(r == 0 && t[1].rm == (dq_rows[i].two ? 2 : 1) && t[1].bc == want_bc,
            "backward planner, f16 head_dim %d, N = %lld%s: %d dQ tiles a warp, %d-key tiles (want %d, %d): %s", hd,
            (long long)dq_rows[i].n, dq_rows[i].causal ? ", causal" : "", r == 0 ? t[1].rm : 0, r == 0 ? t[1].bc : 0,
            dq_rows[i].two ? 2 : 1, want_bc, r == 0 ? t[1].reason : "declined");
    }
}

/* The variant fcl_describe_plan names for a contiguous (or offset) problem on ctx. */
static int describe_op(fcl_context *ctx, fcl_operation op, int64_t d, fcl_dtype dtype, int64_t offset, fcl_plan_info *info) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = 1;
  desc.num_heads = 2;
  desc.seqlen_q = desc.seqlen_k = 300;
  desc.head_dim = d;
  desc.dtype = dtype;
  desc.q_offset = desc.k_offset = desc.v_offset = desc.o_offset = offset;
  memset(info, 0, sizeof *info);
  fcl_status st = fcl_describe_plan(ctx, op, &desc, info);
  if (st != FCL_SUCCESS) printf("     fcl_describe_plan: %s: %s\n", fcl_status_string(st), fcl_last_error());
  return st == FCL_SUCCESS;
}

static int describe(fcl_context *ctx, int64_t d, fcl_dtype dtype, int64_t offset, fcl_plan_info *info) {
  return describe_op(ctx, FCL_OP_FORWARD, d, dtype, offset, info);
}

/* The backward's variant, as expect() checks the forward's: "nvidia_mma" where the tensor-core backward applies
   (NVIDIA cc >= 8.0, f16/bf16, head_dim a multiple of 8 up to 128, aligned rows), else "portable". */
static void expect_backward(fcl_context *ctx, const char *ctx_name, int64_t d, fcl_dtype dtype, int64_t offset,
                            int want_mma) {
  fcl_plan_info info;
  const int ok = describe_op(ctx, FCL_OP_BACKWARD, d, dtype, offset, &info);
  const char *want = want_mma ? "nvidia_mma" : "portable";
  check(ok && strcmp(info.kernel, want) == 0, "%s: backward %s head_dim %lld%s runs %s (reported %s: %s)", ctx_name,
        dtype_name(dtype), (long long)d, offset ? ", rows offset" : "", want, info.kernel, info.reason);
}

static void expect(fcl_context *ctx, const char *ctx_name, int64_t d, fcl_dtype dtype, int64_t offset, int want_mma) {
  fcl_plan_info info;
  const int ok = describe(ctx, d, dtype, offset, &info);
  const char *want = want_mma ? "nvidia_mma" : "portable";
  check(ok && strcmp(info.kernel, want) == 0, "%s: %s head_dim %lld%s runs %s (reported %s: %s)", ctx_name,
        dtype_name(dtype), (long long)d, offset ? ", rows offset" : "", want, info.kernel, info.reason);
}

int main(void) {
  test_seed();
  table_cases();
  mask_define_cases();
  planner_cases();
  large_local_cases();
  backward_planner_cases();

  const char *env_off = getenv("FLASHCL_PORTABLE_ONLY");
  const int forced_off = env_off && env_off[0] && strcmp(env_off, "0") != 0;
  test_env env;
  if (test_open(&env, NULL)) return 1;
  fcl_device_caps caps;
  if (fcl_probe_device(env.device, &caps) != FCL_SUCCESS) {
    printf("FAIL probe: %s\n", fcl_last_error());
    return 1;
  }
  const int has_mma = caps.vendor == FCL_VENDOR_NVIDIA && caps.nv_cc_major >= 8;
  printf("device: vendor %d, compute capability %d.%d: tensor-core forward %s%s\n", caps.vendor, caps.nv_cc_major,
         caps.nv_cc_minor, has_mma ? "expected" : "not expected", forced_off ? " (but FLASHCL_PORTABLE_ONLY is set)" : "");
  const int mma = has_mma && !forced_off;

  static const int64_t dims[] = {64, 128};
  for (int i = 0; i < 2; ++i) {
    expect(env.fcl, "default", dims[i], FCL_DTYPE_F16, 0, mma);
    expect(env.fcl, "default", dims[i], FCL_DTYPE_BF16, 0, mma);
  }
  for (int i = 0; i < 2; ++i) {
    expect_backward(env.fcl, "default", dims[i], FCL_DTYPE_F16, 0, mma);
    expect_backward(env.fcl, "default", dims[i], FCL_DTYPE_BF16, 0, mma);
  }
  /* f32 as 3xTF32 up to head_dim 128, with rows on 16 bytes (4 floats). */
  expect_backward(env.fcl, "default", 64, FCL_DTYPE_F32, 0, mma);
  expect_backward(env.fcl, "default", 128, FCL_DTYPE_F32, 0, mma);
  expect_backward(env.fcl, "default", 64, FCL_DTYPE_F32, 4, mma);
  expect_backward(env.fcl, "default", 64, FCL_DTYPE_F32, 2, 0);
  expect_backward(env.fcl, "default", 64, FCL_DTYPE_F16, 3, 0);
  expect_backward(env.fcl, "default", 256, FCL_DTYPE_F16, 0, 0);
  /* f32 as 3xTF32 up to head_dim 128, with rows on 16 bytes (4 floats). */
  expect(env.fcl, "default", 64, FCL_DTYPE_F32, 0, mma);
  expect(env.fcl, "default", 128, FCL_DTYPE_F32, 0, mma);
  expect(env.fcl, "default", 64, FCL_DTYPE_F32, 4, mma);
  expect(env.fcl, "default", 64, FCL_DTYPE_F32, 2, 0);
  expect(env.fcl, "default", 256, FCL_DTYPE_F32, 0, 0);
  expect(env.fcl, "default", 64, FCL_DTYPE_F16, 3, 0);
  expect(env.fcl, "default", 63, FCL_DTYPE_F16, 0, 0);

  /* FCL_FLAG_PORTABLE_ONLY and FLASHCL_PORTABLE_ONLY=1 force the portable kernel. */
  fcl_context_options opts;
  memset(&opts, 0, sizeof opts);
  opts.flags = FCL_FLAG_PORTABLE_ONLY;
  fcl_context *portable = NULL;
  fcl_status st = fcl_context_create(env.context, env.device, &opts, &portable);
  check(st == FCL_SUCCESS, "context with FCL_FLAG_PORTABLE_ONLY");
  if (portable)
    for (int i = 0; i < 2; ++i) {
      expect(portable, "FCL_FLAG_PORTABLE_ONLY", dims[i], FCL_DTYPE_F16, 0, 0);
      expect(portable, "FCL_FLAG_PORTABLE_ONLY", dims[i], FCL_DTYPE_BF16, 0, 0);
      expect_backward(portable, "FCL_FLAG_PORTABLE_ONLY", dims[i], FCL_DTYPE_F16, 0, 0);
    }
  setenv("FLASHCL_PORTABLE_ONLY", "1", 1);
  fcl_context *env_portable = NULL;
  st = fcl_context_create(env.context, env.device, NULL, &env_portable);
  if (env_off) setenv("FLASHCL_PORTABLE_ONLY", env_off, 1);
  else unsetenv("FLASHCL_PORTABLE_ONLY");
  check(st == FCL_SUCCESS, "context with FLASHCL_PORTABLE_ONLY=1");
  if (env_portable) {
    expect(env_portable, "FLASHCL_PORTABLE_ONLY=1", 128, FCL_DTYPE_F16, 0, 0);
    expect_backward(env_portable, "FLASHCL_PORTABLE_ONLY=1", 128, FCL_DTYPE_BF16, 0, 0);
  }

  /* The same shapes computed by each context, against the float64 reference. */
  const fwd_case cases[] = {
      {2, 4, 0, 300, 300, 64, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1},
      {2, 4, 2, 300, 257, 128, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1},
      {1, 4, 1, 129, 300, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1},
      {1, 2, 0, 200, 200, 64, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1},
  };
  fcl_context *own = env.fcl;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    run_forward_case(&env, env.queue, &cases[i], fcl_attention_forward, mma ? "nvidia_mma" : "default");
    if (portable) {
      env.fcl = portable;
      run_forward_case(&env, env.queue, &cases[i], fcl_attention_forward, "portable");
      env.fcl = own;
    }
  }
  fcl_context_release(env_portable);
  fcl_context_release(portable);
  test_close(&env);
  return test_summary("test_variant");
}
