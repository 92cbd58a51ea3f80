/* fcl_attention_forward against the float64 host reference over awkward shapes, every dtype, causal
 * alignment, GQA/MQA, strided layouts, the optional lse and the score modifiers (window, softcap, ALiBi,
 * additive mask, sinks) alone and together, and NaN and +-inf in V rows that the mask hides from some rows.
 * Usage: test_forward [--small | --nonfinite] [--reference] [--list | --case NAME]
 *   --small      a few small cases (for Oclgrind, which simulates every work-item)
 *   --nonfinite  only the cases with NaN and +-inf planted in V (and, with --reference, those on an
 *                out-of-order queue): for runs under a forced loop budget
 *   --reference  the same cases through fcl_attention_reference (CLBlast) instead, the small ones again on an
 *                out-of-order queue, and a score matrix too large for one buffer, which must give
 *                FCL_ERROR_OUT_OF_RESOURCES
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "forward_check.h"
#include "internal.h" /* fcl_parse_forward_shape */
#include "test_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fcl_dtype dtypes[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};

static int add(fwd_case *list, int n, fwd_case c) {
  list[n] = c;
  return n + 1;
}

static int small_cases(fwd_case *list) {
  int n = 0;
  n = add(list, n, (fwd_case){1, 2, 0, 17, 17, 16, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1});
  n = add(list, n, (fwd_case){2, 2, 1, 5, 9, 40, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1});
  n = add(list, n, (fwd_case){1, 4, 2, 9, 3, 24, FCL_DTYPE_BF16, 1, LAYOUT_PADDED, 0, 1}); /* rows with no key */
  n = add(list, n, (fwd_case){1, 1, 0, 3, 20, 7, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0.3f, 0});
  /* Every modifier at once, and a window with a row that sees nothing. */
  const test_mods all = {0.7f, 2, MASK_GGML_F16, 1, 1, 6, 2, 1};
  n = add(list, n, (fwd_case){2, 2, 1, 13, 21, 16, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 2.0f, 1, all});
  n = add(list, n, (fwd_case){1, 2, 0, 11, 5, 8, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, {0, 0, 0, 0, 1, 0, 0, 0}});
  /* NaN and +-inf in V rows the causal mask hides from the first rows. */
  n = add(list, n, (fwd_case){1, 2, 0, 12, 12, 8, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, {0, 0, 0, 0, 0, 0, 0, 0}, 1});
  return n;
}

/* The score modifiers alone and combined, against the host reference's mirror of the mask layer. */
static int modifier_cases(fwd_case *list, int n) {
  const test_mods window = {0, 0, 0, 0, 1, 5, 3, 0};
  const test_mods window_causal = {0, 0, 0, 0, 1, 16, 0, 0}; /* with causal = 1: (16, 0) */
  const test_mods diagonal_only = {0, 0, 0, 0, 1, 0, 0, 0};
  const test_mods wide = {0, 0, 0, 0, 1, 5000, 5000, 0};    /* wider than the sequence */
  const test_mods left_only = {0, 0, 0, 0, 1, 40, -1, 0};
  const test_mods softcap = {0.5f, 0, 0, 0, 0, 0, 0, 0};
  const test_mods alibi_h = {0, 1, 0, 0, 0, 0, 0, 0}, alibi_bh = {0, 2, 0, 0, 0, 0, 0, 0};
  const test_mods mask_f32 = {0, 0, MASK_FULL_F32, 0, 0, 0, 0, 0}, mask_ggml = {0, 0, MASK_GGML_F16, 0, 0, 0, 0, 0};
  const test_mods mask_head = {0, 0, MASK_HEAD_BF16, 1, 0, 0, 0, 0}; /* hides whole rows */
  const test_mods sinks = {0, 0, 0, 0, 0, 0, 0, 1};
  const test_mods alibi_mask = {0, 1, MASK_FULL_F32, 0, 0, 0, 0, 0};
  const test_mods softcap_sinks = {0.8f, 0, 0, 0, 0, 0, 0, 1};
  const test_mods all = {1.5f, 2, MASK_HEAD_BF16, 1, 1, 30, 4, 1};
  const test_mods window_sinks = {0, 0, 0, 0, 1, 3, 0, 1};
  for (int t = 0; t < 3; ++t) {
    const fcl_dtype dt = dtypes[t];
    n = add(list, n, (fwd_case){2, 3, 0, 127, 127, 64, dt, 0, LAYOUT_BHND, 0, 1, window});
    n = add(list, n, (fwd_case){1, 4, 2, 100, 157, 40, dt, 1, LAYOUT_BNHD, 0, 1, window_causal});
    n = add(list, n, (fwd_case){1, 2, 0, 33, 33, 80, dt, 0, LAYOUT_PADDED, 2.0f, 1, softcap});
    n = add(list, n, (fwd_case){2, 4, 1, 65, 70, 64, dt, 1, LAYOUT_BHND, 0, 1, alibi_bh});
    n = add(list, n, (fwd_case){2, 3, 0, 31, 45, 32, dt, 0, LAYOUT_BHND, 0, 1, mask_ggml});
    n = add(list, n, (fwd_case){1, 2, 0, 50, 90, 128, dt, 1, LAYOUT_BHND, 0, 1, sinks});
    n = add(list, n, (fwd_case){2, 4, 2, 77, 131, 96, dt, 1, LAYOUT_PADDED, 0.3f, 1, all});
  }
  n = add(list, n, (fwd_case){1, 2, 0, 40, 40, 16, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, diagonal_only});
  n = add(list, n, (fwd_case){1, 2, 0, 40, 40, 16, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, diagonal_only});
  n = add(list, n, (fwd_case){1, 2, 0, 60, 25, 24, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, wide});
  n = add(list, n, (fwd_case){1, 2, 0, 1000, 1000, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, left_only});
  n = add(list, n, (fwd_case){1, 2, 0, 300, 1000, 64, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1, window_causal});
  n = add(list, n, (fwd_case){1, 2, 0, 200, 20, 32, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, window}); /* rows see nothing */
  n = add(list, n, (fwd_case){1, 3, 0, 45, 61, 33, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, alibi_h});
  n = add(list, n, (fwd_case){2, 2, 0, 29, 47, 64, FCL_DTYPE_F32, 0, LAYOUT_BNHD, 0, 1, mask_f32});
  n = add(list, n, (fwd_case){2, 2, 0, 29, 47, 64, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1, mask_head});
  n = add(list, n, (fwd_case){2, 4, 4, 64, 64, 64, FCL_DTYPE_BF16, 0, LAYOUT_BHND, 0, 1, alibi_mask});
  /* Masks whose rows start on 16 bytes over whole key tiles: NVIDIA's forward reads them 16 bytes a load
     (MASK_VEC): f16 data at head_dim 128, bf16 at 64, f32 at 64 and causal f16 at 128 (the tile widths are the
     planner's: 32, 64 and 128 keys among them). */
  n = add(list, n, (fwd_case){1, 3, 0, 70, 203, 128, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1, mask_ggml});
  n = add(list, n, (fwd_case){2, 2, 0, 50, 141, 64, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 1, mask_ggml});
  n = add(list, n, (fwd_case){1, 2, 0, 40, 93, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1, mask_f32});
  n = add(list, n, (fwd_case){1, 2, 0, 90, 93, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1, mask_f32});
  /* The same with a sliding window whose blocks start off the mask loads' 8-key alignment and still hold whole tiles
     (32 and 64 keys): the first key is rounded down to it. */
  const test_mods window_ggml = {0, 0, MASK_GGML_F16, 0, 1, 251, 60, 0};
  n = add(list, n, (fwd_case){1, 2, 0, 400, 461, 128, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1, window_ggml});
  n = add(list, n, (fwd_case){1, 2, 0, 300, 461, 64, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 1, window_ggml});
  n = add(list, n, (fwd_case){1, 4, 1, 70, 70, 8, FCL_DTYPE_F32, 0, LAYOUT_BHND, 4.0f, 1, softcap_sinks});
  n = add(list, n, (fwd_case){1, 2, 0, 30, 10, 16, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, sinks}); /* sinks, no key */
  n = add(list, n, (fwd_case){1, 2, 0, 30, 10, 16, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1, window_sinks});
  return n;
}

/* NaN and +-inf planted in V rows that the causal mask, a sliding window or the additive mask hide from some
   rows (forward_check.h): those rows must come out exact and finite, the rows that see them NaN or +-inf. Plain
   float32 V (used in place by the reference's GEMM) and converted copies, GQA, several chunks under
   FLASHCL_REFERENCE_CHUNK=3, and every modifier together. */
static int nonfinite_cases(fwd_case *list, int n) {
  const test_mods none = {0, 0, 0, 0, 0, 0, 0, 0};
  const test_mods window = {0, 0, 0, 0, 1, 6, 2, 0};
  const test_mods all = {1.5f, 2, MASK_FULL_F32, 0, 1, 10, 0, 1}; /* with causal: window (10, 0) */
  n = add(list, n, (fwd_case){1, 2, 0, 40, 40, 16, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, none, 1});
  n = add(list, n, (fwd_case){2, 4, 2, 45, 45, 24, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1, window, 1});
  n = add(list, n, (fwd_case){1, 3, 0, 50, 50, 32, FCL_DTYPE_BF16, 1, LAYOUT_PADDED, 0, 1, all, 1});
  n = add(list, n, (fwd_case){2, 2, 0, 64, 64, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 0, window, 1});
  return n;
}

static int full_cases(fwd_case *list) {
  int n = 0;
  static const long long head_dims[] = {16, 40, 64, 80, 96, 128, 256};
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; ++i)
      n = add(list, n, (fwd_case){2, 3, 0, 127, 127, head_dims[i], dtypes[t], (int)(i % 2), LAYOUT_BHND, 0, 1});
  static const long long seqlens[] = {1, 2, 17, 127, 1000, 1023};
  for (size_t i = 0; i < sizeof seqlens / sizeof seqlens[0]; ++i)
    for (int causal = 0; causal < 2; ++causal)
      n = add(list, n, (fwd_case){1, 2, 0, seqlens[i], seqlens[i], 64, FCL_DTYPE_F32, causal, LAYOUT_BHND, 0, 1});
  /* Causal with Nq < Nk (bottom-right aligned) and Nq > Nk (leading rows see no key). */
  n = add(list, n, (fwd_case){1, 2, 0, 17, 1000, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1});
  n = add(list, n, (fwd_case){1, 2, 0, 1000, 17, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1});
  n = add(list, n, (fwd_case){1, 2, 0, 1, 1023, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1});
  n = add(list, n, (fwd_case){1, 2, 0, 1023, 2, 128, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1});
  n = add(list, n, (fwd_case){2, 2, 0, 127, 1000, 80, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1});
  /* GQA 8:1 and MQA, batch > 1. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (fwd_case){2, 16, 2, 130, 130, 64, dtypes[t], t % 2, LAYOUT_BHND, 0, 1});
    n = add(list, n, (fwd_case){3, 8, 1, 65, 200, 128, dtypes[t], 1, LAYOUT_BHND, 0, 1});
  }
  /* Strided layouts and offsets, with a caller-given scale. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (fwd_case){2, 4, 0, 100, 100, 64, dtypes[t], 1, LAYOUT_BNHD, 0, 1});
    n = add(list, n, (fwd_case){2, 4, 2, 77, 131, 96, dtypes[t], 0, LAYOUT_PADDED, 0.05f, 1});
  }
  /* Padding after an odd head_dim: a store past the row's last column lands in the gap and is caught. */
  n = add(list, n, (fwd_case){1, 3, 0, 50, 70, 33, FCL_DTYPE_F16, 1, LAYOUT_PADDED, 0, 1});
  /* Odd head dims, lse not requested. */
  static const long long odd_dims[] = {1, 3, 7, 33, 65, 129, 255};
  for (size_t i = 0; i < sizeof odd_dims / sizeof odd_dims[0]; ++i)
    n = add(list, n, (fwd_case){1, 2, 0, 45, 61, odd_dims[i], dtypes[i % 3], (int)(i % 2), LAYOUT_BHND, 0, 0});
  /* Scores large enough that a softmax without max subtraction would overflow. */
  n = add(list, n, (fwd_case){1, 2, 0, 70, 70, 8, FCL_DTYPE_F32, 0, LAYOUT_BHND, 30.0f, 1});
  /* Rising scores (forward_check.h): a row's maximum passes its running maximum by more than the tensor-core
     kernel lets its reference maximum lag; below 128 keys with V near float's range in f32 and bf16 (overflow
     against a lagging maximum), and over 700 keys, where each row's maximum passes many times, with sinks. */
  const test_mods no_mods = {0, 0, 0, 0, 0, 0, 0, 0}, softcap = {40.0f, 0, 0, 0, 0, 0, 0, 0};
  const test_mods sinks_only = {0, 0, 0, 0, 0, 0, 0, 1};
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (fwd_case){2, 2, 0, 70, 100, 64, dtypes[t], 0, LAYOUT_BHND, 1.0f, 1, no_mods, PLANT_RISING});
    n = add(list, n, (fwd_case){1, 4, 2, 127, 127, 128, dtypes[t], 1, LAYOUT_BNHD, 1.0f, 1, no_mods, PLANT_RISING});
    n = add(list, n, (fwd_case){1, 4, 1, 3, 120, 96, dtypes[t], 0, LAYOUT_BHND, 1.0f, 1, softcap, PLANT_RISING});
    n = add(list, n, (fwd_case){1, 2, 0, 150, 700, 128, dtypes[t], t == 1, LAYOUT_BHND, 1.0f, 1, sinks_only, PLANT_RISING});
  }
  return n;
}

/* Under FLASHCL_FORWARD_SHAPE (the forced-shape tests), 1 when the plan the forward would use for case c is
   not that shape on this device (it does not fit, the kernel admits fewer work-items, or another kernel
   runs); the case is then reported as skipped rather than passing as a test of another shape. */
static int forced_shape_unavailable(test_env *env, const fwd_case *c, const char *label) {
  const char *shape = getenv("FLASHCL_FORWARD_SHAPE");
  int fs[5];
  /* An override the library ignores (out of bounds, malformed) forces nothing: the default runs. */
  if (!shape || fcl_parse_forward_shape(shape, fs) != 0) return 0;
  const int tr = fs[0], tc = fs[1], rm = fs[2], rn = fs[3];
  fcl_attention_desc desc;
  case_shape_desc(c, &desc);
  fcl_plan_info info;
  char what[200];
  describe_case(c, what, sizeof what);
  const fcl_status st = fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &desc, &info);
  if (st != FCL_SUCCESS) return 0; /* the run itself reports it */
  /* FLASHCL_SUBGROUPS=required (the sub-group groups): the shuffles must be planned too (src/describe.c's words). */
  const char *sg = getenv("FLASHCL_SUBGROUPS");
  const int shuffles_wanted = sg && strcmp(sg, "required") == 0 && tc > 1;
  if (strcmp(info.kernel, "portable") == 0 && info.block_q == tr * rm && info.block_k == tc * rn &&
      info.work_group_size == tr * tc) {
    if (!shuffles_wanted || strstr(info.reason, " shuffles")) return 0;
    skip("%s %s: FLASHCL_SUBGROUPS=required, and this device offers no sub-group shuffles for FLASHCL_FORWARD_SHAPE=%s",
         label, what, shape);
    return 1;
  }
  skip("%s %s: FLASHCL_FORWARD_SHAPE=%s does not run on this device for this case; the %s kernel would run "
       "%dx%d tiles on %d work-items instead (%s)",
       label, what, shape, info.kernel, info.block_q, info.block_k, info.work_group_size, info.reason);
  return 1;
}

/* Nq = Nk = 2^20 at head_dim 1: 4 MiB inputs, a 4 TiB score matrix. */
static void reference_too_large(test_env *env) {
  const long long n = 1 << 20;
  cl_mem bufs[4];
  for (int i = 0; i < 4; ++i) bufs[i] = create_float_buffer(env, (size_t)n, i == 3 ? NAN : 0.5f);
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = desc.num_heads = desc.head_dim = 1;
  desc.seqlen_q = desc.seqlen_k = n;
  desc.dtype = FCL_DTYPE_F32;
  cl_event ev = NULL;
  fcl_status st = fcl_attention_reference(env->fcl, env->queue, &desc, bufs[0], bufs[1], bufs[2], bufs[3], NULL, 0,
                                          NULL, &ev);
  if (st == FCL_ERROR_UNSUPPORTED) skip("reference N=2^20: %s", fcl_last_error());
  else
    check(st == FCL_ERROR_OUT_OF_RESOURCES && !ev, "reference N=2^20 (4 TiB score matrix): %s: %s",
          fcl_status_string(st), fcl_last_error());
  for (int i = 0; i < 4; ++i)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
}

/* B = H = 1, f32, o with strides {0, 28, 4}: the batch and head strides of extent-1 dimensions mean nothing
   and must not reach CLBlast. The result matches the host reference, and o's and lse's every element is
   written by the one successful call. */
static void reference_extent_one_strides(test_env *env) {
  enum { NQ = 7, NK = 9, D = 4 };
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = desc.num_heads = 1, desc.seqlen_q = NQ, desc.seqlen_k = NK, desc.head_dim = D;
  desc.dtype = FCL_DTYPE_F32;
  desc.o_stride[0] = 0, desc.o_stride[1] = 28, desc.o_stride[2] = 4;
  float q[NQ * D], k[NK * D], v[NK * D], o[NQ * D], lse[NQ];
  for (int i = 0; i < NQ * D; ++i) q[i] = (float)test_uniform();
  for (int i = 0; i < NK * D; ++i) k[i] = (float)test_uniform(), v[i] = (float)test_uniform();
  cl_int err;
  cl_mem bq = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof q, q, &err);
  cl_mem bk = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof k, k, &err);
  cl_mem bv = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof v, v, &err);
  cl_mem bo = create_float_buffer(env, NQ * D, NAN), blse = create_float_buffer(env, NQ, NAN);
  cl_event ev = NULL;
  fcl_status st = fcl_attention_reference(env->fcl, env->queue, &desc, bq, bk, bv, bo, blse, 0, NULL, &ev);
  if (ev) {
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
  }
  double dq[NQ * D], dk[NK * D], dv[NK * D], ref_o[NQ * D], ref_lse[NQ], max_abs = 0, lse_err = 0;
  for (int i = 0; i < NQ * D; ++i) dq[i] = q[i];
  for (int i = 0; i < NK * D; ++i) dk[i] = k[i], dv[i] = v[i];
  reference_forward(&desc, NULL, dq, dk, dv, ref_o, ref_lse);
  read_floats(env, bo, o, NQ * D);
  read_floats(env, blse, lse, NQ);
  const double rel = rel_error(o, ref_o, NQ * D, &max_abs);
  for (int i = 0; i < NQ; ++i) lse_err = fmax(lse_err, isnan(lse[i]) ? INFINITY : fabs(lse[i] - ref_lse[i]));
  check(st == FCL_SUCCESS && rel < FWD_TOL_F32 && lse_err < FWD_TOL_LSE,
        "reference, B=H=1 f32 with o_stride {0, 28, 4}: %s %s (rel %.1e, lse max abs %.1e)", fcl_status_string(st),
        st ? fcl_last_error() : "", rel, lse_err);
  clReleaseMemObject(bq);
  clReleaseMemObject(bk);
  clReleaseMemObject(bv);
  clReleaseMemObject(bo);
  clReleaseMemObject(blse);
}

static void run_forward(test_env *env, const void *c) {
  if (!forced_shape_unavailable(env, c, "forward"))
    run_forward_case(env, env->queue, c, fcl_attention_forward, "forward");
}

static void run_reference(test_env *env, const void *c) {
  run_forward_case(env, env->queue, c, fcl_attention_reference, "reference");
}

/* An out-of-order queue: the steps of the reference path must still run in order. */
static void run_reference_out_of_order(test_env *env, const void *c) {
  cl_int err;
  cl_command_queue ooo = clCreateCommandQueue(env->context, env->device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  if (err != CL_SUCCESS) {
    skip("reference on an out-of-order queue: the device has none (%d)", (int)err);
    return;
  }
  run_forward_case(env, ooo, c, fcl_attention_reference, "reference out-of-order");
  clReleaseCommandQueue(ooo);
}

static void run_reference_too_large(test_env *env, const void *unused) {
  (void)unused;
  reference_too_large(env);
}

static void run_reference_extent_one_strides(test_env *env, const void *unused) {
  (void)unused;
  reference_extent_one_strides(env);
}

int main(int argc, char **argv) {
  int reference = 0, nonfinite = 0;
  test_cli cli = {0, NULL, 0};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--nonfinite")) nonfinite = 1;
    else if (!strcmp(argv[i], "--reference")) reference = 1;
    else if (!test_cli_option(&cli, argc, argv, &i)) {
      fprintf(stderr, "usage: %s [--small | --nonfinite] [--reference] [--list | --case NAME]\n", argv[0]);
      return 2;
    }
  }
  enum { MAX = 200 };
  static fwd_case cases[MAX], few[8];
  static test_case list[MAX];
  const int count = cli.small ? small_cases(cases)
                    : nonfinite ? nonfinite_cases(cases, 0)
                                : nonfinite_cases(cases, modifier_cases(cases, full_cases(cases)));
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    forward_case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, reference ? run_reference : run_forward, &cases[i]);
  }
  if (reference && nonfinite) {
    for (int i = 0; i < count; ++i) {
      forward_case_name(&cases[i], name, sizeof name);
      n = test_case_add(list, n, MAX, "out_of_order/", name, run_reference_out_of_order, &cases[i]);
    }
  } else if (reference) {
    const int nfew = small_cases(few);
    for (int i = 0; i < nfew; ++i) {
      forward_case_name(&few[i], name, sizeof name);
      n = test_case_add(list, n, MAX, "out_of_order/", name, run_reference_out_of_order, &few[i]);
    }
    n = test_case_add(list, n, MAX, "", "score_matrix_too_large", run_reference_too_large, NULL);
    n = test_case_add(list, n, MAX, "", "extent_one_strides", run_reference_extent_one_strides, NULL);
  }
  return test_cases_main("test_forward", &cli, list, n);
}
