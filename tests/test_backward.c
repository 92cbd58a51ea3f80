/* fcl_attention_backward against float64 host gradients (themselves checked by central finite
 * differences) over the forward tests' shapes, every dtype, causal alignment both ways, GQA/MQA, strided
 * layouts, the scale, determinism, rows that see no key, an out-of-order queue, several threads on one
 * context, and validation.
 * Usage: test_backward [--small | --quick] [--list | --case NAME]
 *   --small   a few small cases (for Oclgrind, which simulates every work-item)
 *   --quick   a cross-section of the full cases (for the small-device plan run)
 *   --list, --case NAME  list the cases, or run one (test_cases.h)
 *
 * Bounds (backward_check.h), ||grad - ref|| / ||ref|| for each of dQ, dK, dV: f32 5e-6, f16 1e-3,
 * bf16 1.6e-2. Largest measured over six runs of the full case list with different seeds on PoCL
 * 'pthread-skylake-avx512-AMD EPYC', 2026-11-29 (`build-bwd/tests/test_backward`, FLASHCL_TEST_SEED unset,
 * 11 and 12): f32 8.0e-7, f16 2.6e-4, bf16 4.9e-3 (Nq=200 Nk=2; the other bf16 cases stay below 3.4e-3).
 * f16 and bf16 are dominated by rounding the gradients to the storage type (2^-11 and 2^-8 relative).
 */
#include "backward_check.h"
#include "test_cases.h"
#include "host_reference.h"
#include "internal.h" /* fcl_describe_backward */

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const fcl_dtype dtypes[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};

typedef struct listed {
  bwd_case c;
  int determinism;
} listed;

static int add(listed *list, int n, bwd_case c, int determinism) {
  list[n].c = c;
  list[n].determinism = determinism;
  return n + 1;
}

static int small_cases(listed *list) {
  int n = 0;
  n = add(list, n, (bwd_case){1, 2, 0, 17, 17, 16, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0}, 1);
  n = add(list, n, (bwd_case){2, 2, 1, 5, 9, 40, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 0}, 0);
  n = add(list, n, (bwd_case){1, 4, 2, 9, 3, 24, FCL_DTYPE_BF16, 1, LAYOUT_PADDED, 0, 0}, 0); /* rows with no key */
  n = add(list, n, (bwd_case){1, 1, 0, 3, 20, 7, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0.3f, 1}, 0);
  const test_mods all = {0.7f, 2, MASK_GGML_F16, 1, 1, 6, 2, 1};
  n = add(list, n, (bwd_case){2, 2, 1, 13, 21, 16, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 2.0f, 0, all}, 0);
  return n;
}

/* The score modifiers alone and together; with sinks, d_sinks is checked as well. */
static int modifier_cases(listed *list, int n) {
  const test_mods window = {0, 0, 0, 0, 1, 5, 3, 0}, window_causal = {0, 0, 0, 0, 1, 16, 0, 0};
  const test_mods softcap = {0.5f, 0, 0, 0, 0, 0, 0, 0}, alibi = {0, 2, 0, 0, 0, 0, 0, 0};
  const test_mods mask = {0, 0, MASK_GGML_F16, 1, 0, 0, 0, 0}, sinks = {0, 0, 0, 0, 0, 0, 0, 1};
  const test_mods all = {1.5f, 1, MASK_FULL_F32, 0, 1, 30, 4, 1};
  for (int t = 0; t < 3; ++t) {
    const fcl_dtype dt = dtypes[t];
    n = add(list, n, (bwd_case){2, 2, 0, 127, 127, 64, dt, 0, LAYOUT_BHND, 0, 0, window}, t == 0);
    n = add(list, n, (bwd_case){1, 4, 2, 100, 157, 40, dt, 1, LAYOUT_BNHD, 0, t == 1, window_causal}, 0);
    n = add(list, n, (bwd_case){1, 2, 0, 33, 33, 80, dt, 0, LAYOUT_PADDED, 2.0f, 0, softcap}, 0);
    n = add(list, n, (bwd_case){2, 4, 1, 65, 70, 64, dt, 1, LAYOUT_BHND, 0, 0, alibi}, 0);
    n = add(list, n, (bwd_case){2, 3, 0, 31, 45, 32, dt, 0, LAYOUT_BHND, 0, 0, mask}, 0);
    n = add(list, n, (bwd_case){2, 2, 0, 50, 90, 128, dt, 1, LAYOUT_BHND, 0, t == 2, sinks}, t == 0);
    n = add(list, n, (bwd_case){2, 4, 2, 77, 131, 96, dt, 1, LAYOUT_PADDED, 0.3f, 0, all}, t == 1);
  }
  /* Masks whose rows start on 16 bytes over whole key tiles (f16 at head_dim 128 and 64, bf16 with an f32 mask at
     64): NVIDIA's dQ kernel reads them a pair of keys a load in 32-key f16 tiles and 16 bytes a load in 64-key ones
     (and in the f32 modifier case above, head_dim 32). */
  const test_mods mask_f32 = {0, 0, MASK_FULL_F32, 0, 0, 0, 0, 0};
  n = add(list, n, (bwd_case){1, 2, 0, 70, 203, 128, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 0, mask}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 70, 203, 64, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 0, 0, mask}, 0);
  n = add(list, n, (bwd_case){1, 2, 1, 40, 141, 64, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 0, mask_f32}, 0);
  /* A sliding window whose dQ blocks start on odd keys over a mask read by pairs: the first key is rounded down to
     an even one. */
  const test_mods window_ggml = {0, 0, MASK_GGML_F16, 0, 1, 251, 60, 0};
  n = add(list, n, (bwd_case){1, 2, 0, 400, 460, 128, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 0, window_ggml}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 200, 20, 32, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 0, window}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 300, 1000, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0, window_causal}, 1);
  return n;
}

static int full_cases(listed *list) {
  int n = 0;
  static const long long head_dims[] = {16, 40, 64, 80, 128, 256};
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; ++i)
      n = add(list, n, (bwd_case){2, 2, 0, 127, 127, head_dims[i], dtypes[t], (int)(i % 2), LAYOUT_BHND, 0, 0},
              t == 0 && i == 2);
  static const long long seqlens[] = {1, 17, 127, 1000};
  for (size_t i = 0; i < sizeof seqlens / sizeof seqlens[0]; ++i)
    for (int causal = 0; causal < 2; ++causal)
      n = add(list, n, (bwd_case){1, 2, 0, seqlens[i], seqlens[i], 64, FCL_DTYPE_F32, causal, LAYOUT_BHND, 0, 0},
              seqlens[i] == 1000 && causal);
  /* Causal with Nq < Nk (bottom-right aligned) and Nq > Nk (leading rows see no key). */
  n = add(list, n, (bwd_case){1, 2, 0, 17, 1000, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 1000, 17, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0}, 1);
  n = add(list, n, (bwd_case){1, 2, 0, 300, 40, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 0}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 200, 2, 80, FCL_DTYPE_BF16, 1, LAYOUT_PADDED, 0, 0}, 0);
  /* GQA 8:1 and MQA, batch > 1. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (bwd_case){2, 16, 2, 65, 65, 64, dtypes[t], t % 2, LAYOUT_BHND, 0, 0}, t == 0);
    n = add(list, n, (bwd_case){2, 8, 1, 33, 100, 128, dtypes[t], 1, LAYOUT_BHND, 0, 0}, t == 1);
  }
  /* Strided layouts and offsets, with a caller-given scale. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (bwd_case){2, 4, 0, 100, 100, 64, dtypes[t], 1, LAYOUT_BNHD, 0, 0}, 0);
    n = add(list, n, (bwd_case){2, 4, 2, 77, 131, 96, dtypes[t], 0, LAYOUT_PADDED, 0.05f, 0}, t == 2);
  }
  /* Odd head dims. */
  static const long long odd_dims[] = {1, 3, 7, 33, 65, 129, 255};
  for (size_t i = 0; i < sizeof odd_dims / sizeof odd_dims[0]; ++i)
    n = add(list, n, (bwd_case){1, 2, 0, 45, 61, odd_dims[i], dtypes[i % 3], (int)(i % 2), LAYOUT_BHND, 0, 0}, 0);
  /* Large scores (a softmax without the saved lse would overflow), and o, lse from the library's forward. */
  n = add(list, n, (bwd_case){1, 2, 0, 70, 70, 8, FCL_DTYPE_F32, 0, LAYOUT_BHND, 3.0f, 0}, 0);
  for (int t = 0; t < 3; ++t)
    n = add(list, n, (bwd_case){2, 4, 2, 150, 90, 64, dtypes[t], 1, LAYOUT_BNHD, 0, 1}, 0);
  return modifier_cases(list, n);
}

static int quick_cases(listed *list) {
  int n = 0;
  static const long long head_dims[] = {16, 64, 128, 256};
  for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; ++i)
    n = add(list, n, (bwd_case){1, 2, 0, 100, 90, head_dims[i], dtypes[i % 3], (int)(i % 2), LAYOUT_BHND, 0, 0},
            i == 3);
  n = add(list, n, (bwd_case){1, 2, 0, 130, 17, 64, FCL_DTYPE_F32, 1, LAYOUT_PADDED, 0, 0}, 1);
  n = add(list, n, (bwd_case){2, 8, 1, 33, 70, 96, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 0, 0}, 0);
  n = add(list, n, (bwd_case){1, 2, 0, 45, 61, 255, FCL_DTYPE_BF16, 0, LAYOUT_BHND, 0, 0}, 0);
  const test_mods all = {1.5f, 1, MASK_FULL_F32, 0, 1, 30, 4, 1};
  n = add(list, n, (bwd_case){2, 4, 2, 77, 131, 96, FCL_DTYPE_F32, 1, LAYOUT_PADDED, 0.3f, 0, all}, 1);
  return n;
}

/* ---- finite differences of the host gradient code ---- */

static void finite_difference_checks(void) {
  static const long long shapes[][7] = {
      /* B, H, Hkv, Nq, Nk, D, causal */
      {1, 2, 1, 4, 3, 3, 0}, {2, 2, 2, 3, 5, 4, 1}, {1, 2, 1, 5, 3, 3, 1}, {1, 3, 1, 2, 6, 2, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = shapes[i][0], desc.num_heads = shapes[i][1], desc.num_kv_heads = shapes[i][2];
    desc.seqlen_q = shapes[i][3], desc.seqlen_k = shapes[i][4], desc.head_dim = shapes[i][5];
    desc.causal = (int)shapes[i][6];
    desc.scale = i == 1 ? 0.7f : 0.0f;
    const double e = finite_difference_error(&desc, NULL, 0);
    check(e < 1e-8, "host gradients vs central differences (h = 1e-5): B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld d=%lld%s: "
          "max error %.1e relative to the largest gradient (bound 1e-8)",
          shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], shapes[i][5],
          shapes[i][6] ? " causal" : "", e);
  }
  /* Every score modifier alone and all together, on B=2 H=2 Hkv=1 Nq=4 Nk=6 d=3. */
  enum { B = 2, H = 2, NQ = 4, NK = 6 };
  double slopes[B * H], mask[B * H * NQ * NK];
  for (int i = 0; i < B * H; ++i) slopes[i] = 0.1 + 0.4 * (test_uniform() + 1.0);
  for (int i = 0; i < B * H * NQ * NK; ++i) mask[i] = i % 7 == 3 ? -INFINITY : test_uniform();
  static const char *const names[] = {"window (2, 1)", "softcap 0.9", "ALiBi", "additive mask", "sinks", "all together"};
  for (int c = 0; c < 6; ++c) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = B, desc.num_heads = H, desc.num_kv_heads = 1, desc.seqlen_q = NQ, desc.seqlen_k = NK;
    desc.head_dim = 3, desc.scale = 1.5f;
    host_mods m = {NULL, NULL, NULL};
    if (c == 0 || c == 5) desc.window = 1, desc.window_left = 2, desc.window_right = 1;
    if (c == 1 || c == 5) desc.softcap = 0.9f;
    if (c == 2 || c == 5) m.slopes = slopes;
    if (c == 3 || c == 5) m.mask = mask;
    const double e = finite_difference_error(&desc, &m, c == 4 || c == 5);
    check(e < 1e-8, "host gradients vs central differences (h = 1e-5), %s%s: max error %.1e relative to the largest "
          "gradient (bound 1e-8)", names[c], c >= 4 ? " (d_sinks too)" : "", e);
  }
}

/* ---- validation ---- */

typedef struct vbufs {
  cl_mem q, k, v, o, lse, d_o, d_q, d_k, d_v, ws;
} vbufs;

/* d_q holds NaN everywhere; 1 if that is still so. */
static int dq_untouched(test_env *env, cl_mem d_q, size_t count) {
  clFinish(env->queue);
  float *x = malloc(count * sizeof(float));
  int ok = read_floats(env, d_q, x, count) == 0;
  for (size_t i = 0; ok && i < count; ++i) ok = isnan(x[i]);
  free(x);
  return ok;
}

static void expect(test_env *env, const char *what, fcl_status got, fcl_status want, cl_mem d_q, size_t dq_count) {
  const char *msg = fcl_last_error();
  const int untouched = dq_untouched(env, d_q, dq_count);
  check(got == want && msg && *msg && untouched, "validation: %s -> %s (want %s), message \"%s\"%s", what,
        fcl_status_string(got), fcl_status_string(want), msg ? msg : "(null)",
        untouched ? "" : ", BUT d_q WAS WRITTEN");
}

static void validation_checks(test_env *env) {
  const long long B = 1, H = 2, HKV = 1, NQ = 5, NK = 7, D = 8;
  const size_t nq_elems = (size_t)(B * H * NQ * D), nk_elems = (size_t)(B * HKV * NK * D), rows = (size_t)(B * H * NQ);
  vbufs b;
  b.q = create_float_buffer(env, nq_elems, 0.25f), b.k = create_float_buffer(env, nk_elems, -0.5f);
  b.v = create_float_buffer(env, nk_elems, 0.75f), b.o = create_float_buffer(env, nq_elems, 0.75f);
  b.lse = create_float_buffer(env, rows, 1.0f), b.d_o = create_float_buffer(env, nq_elems, 0.5f);
  b.d_q = create_float_buffer(env, nq_elems, NAN), b.d_k = create_float_buffer(env, nk_elems, NAN);
  b.d_v = create_float_buffer(env, nk_elems, NAN), b.ws = create_float_buffer(env, rows, NAN);
  cl_mem small = create_float_buffer(env, 4, 0.0f);
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = B, desc.num_heads = H, desc.num_kv_heads = HKV, desc.seqlen_q = NQ, desc.seqlen_k = NK;
  desc.head_dim = D, desc.dtype = FCL_DTYPE_F32, desc.causal = 1;

  const size_t ws = fcl_attention_backward_workspace_size(env->fcl, &desc);
  check(ws == rows * sizeof(float), "workspace size for B=1 H=2 Nq=5: %zu bytes (want %zu)", ws, rows * sizeof(float));
  check(fcl_attention_backward_workspace_size(env->fcl, NULL) == 0 && *fcl_last_error(),
        "workspace size for desc NULL: 0, message \"%s\"", fcl_last_error());
  check(fcl_attention_backward_workspace_size(NULL, &desc) == 0 && *fcl_last_error(),
        "workspace size for ctx NULL: 0, message \"%s\"", fcl_last_error());

  fcl_status st = fcl_attention_backward(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k,
                                         b.d_v, b.ws, 0, NULL, NULL);
  clFinish(env->queue);
  float x[80];
  int written = read_floats(env, b.d_q, x, nq_elems) == 0;
  for (size_t i = 0; written && i < nq_elems; ++i) written = isfinite(x[i]);
  check(st == FCL_SUCCESS && written, "validation: the valid call succeeds and writes d_q (%s)",
        st ? fcl_last_error() : "ok");

#define CALL(ctx_, queue_, desc_, q_, k_, v_, o_, lse_, do_, dq_, dk_, dv_, ws_, nw_, w_) \
  fcl_attention_backward(ctx_, queue_, desc_, q_, k_, v_, o_, lse_, do_, dq_, dk_, dv_, ws_, nw_, w_, NULL)
  cl_mem poisoned = create_float_buffer(env, nq_elems, NAN);
  b.d_q = (clReleaseMemObject(b.d_q), poisoned);
  const fcl_status INV = FCL_ERROR_INVALID_ARGUMENT;
  expect(env, "ctx NULL", CALL(NULL, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "lse NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, NULL, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "lse too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, small, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_o NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, NULL, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_o too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, small, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_q NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, NULL, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_q too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, small, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_k NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, NULL, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_k too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, small, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_v NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, NULL, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_v too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, small, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "workspace NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, NULL, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "workspace too small", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, small, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_q aliases q", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_q aliases d_o", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_o, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_k aliases v", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.v, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "d_v aliases d_k", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_k, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "workspace aliases lse", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.lse, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "num_wait 1 with wait NULL", CALL(env->fcl, env->queue, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 1, NULL), INV, b.d_q, nq_elems);
  expect(env, "queue NULL", CALL(env->fcl, NULL, &desc, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  expect(env, "desc NULL", CALL(env->fcl, env->queue, NULL, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  fcl_attention_desc bad = desc;
  bad.head_dim = 300;
  expect(env, "head_dim 300", CALL(env->fcl, env->queue, &bad, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), FCL_ERROR_UNSUPPORTED, b.d_q, nq_elems);
  /* q rows that overlap (stride 4 < head_dim 8) are a valid input layout, but d_q would be written twice. */
  bad = desc;
  bad.q_stride[0] = 40, bad.q_stride[1] = 20, bad.q_stride[2] = 4;
  expect(env, "q (and so d_q) rows overlapping", CALL(env->fcl, env->queue, &bad, b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, 0, NULL), INV, b.d_q, nq_elems);
  /* k heads broadcast (head stride 0) are a valid input, but d_k heads would collide: needs 2 kv heads. */
  bad = desc;
  bad.num_kv_heads = 2;
  bad.k_stride[0] = 56, bad.k_stride[1] = 0, bad.k_stride[2] = 8;
  cl_mem k2 = create_float_buffer(env, 2 * nk_elems, 0.5f), v2 = create_float_buffer(env, 2 * nk_elems, 0.5f);
  cl_mem dk2 = create_float_buffer(env, 2 * nk_elems, NAN), dv2 = create_float_buffer(env, 2 * nk_elems, NAN);
  expect(env, "k (and so d_k) heads with stride 0", CALL(env->fcl, env->queue, &bad, b.q, k2, v2, b.o, b.lse, b.d_o, b.d_q, dk2, dv2, b.ws, 0, NULL), INV, b.d_q, nq_elems);
#undef CALL
  cl_mem all[] = {b.q, b.k, b.v, b.o, b.lse, b.d_o, b.d_q, b.d_k, b.d_v, b.ws, small, k2, v2, dk2, dv2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i]) clReleaseMemObject(all[i]);
}

/* ---- several threads on one context, each with its own queue; first builds happen concurrently ---- */

typedef struct worker {
  test_env *env;
  int index;
  cl_command_queue queue;
} worker;

static void *thread_run(void *arg) {
  worker *w = arg;
  for (int r = 0; r < 2; ++r) {
    const bwd_case c = {1 + w->index % 2, 4, 2, 40 + 9 * w->index, 50 + 7 * r, w->index % 2 ? 48 : 72,
                        dtypes[(w->index + r) % 3], (w->index + r) % 2, LAYOUT_BHND, 0, 0};
    run_backward_case(w->env, w->queue, &c, r == 1, "backward (thread)");
  }
  return NULL;
}

static void thread_checks(test_env *env) {
  enum { THREADS = 3 };
  worker workers[THREADS];
  pthread_t threads[THREADS];
  int started = 0;
  for (int i = 0; i < THREADS; ++i) {
    cl_int err;
    workers[i] = (worker){env, i, clCreateCommandQueue(env->context, env->device, 0, &err)};
    if (err != CL_SUCCESS) {
      check(0, "creating queue %d for the thread cases failed: %d", i, err);
      workers[i].queue = NULL;
    }
  }
  for (int i = 0; i < THREADS; ++i)
    if (workers[i].queue && pthread_create(&threads[i], NULL, thread_run, &workers[i]) == 0) started |= 1 << i;
  for (int i = 0; i < THREADS; ++i)
    if (started & (1 << i)) pthread_join(threads[i], NULL);
  for (int i = 0; i < THREADS; ++i)
    if (workers[i].queue) clReleaseCommandQueue(workers[i].queue);
}

/* What fcl_describe_plan reports for the backward pass: the plans that run, within the device's limits. */
static void describe_checks(test_env *env) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = 2, desc.num_heads = 4, desc.num_kv_heads = 2, desc.seqlen_q = 300, desc.seqlen_k = 200;
  desc.head_dim = 64, desc.dtype = FCL_DTYPE_F16, desc.causal = 1;
  fcl_problem p;
  fcl_plan_info info;
  cl_ulong local = 0;
  size_t max_wg = 0;
  clGetDeviceInfo(env->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
  clGetDeviceInfo(env->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
  fcl_status st = fcl_resolve_problem(&desc, &p);
  if (!st) st = fcl_describe_backward(env->fcl, &p, &info);
  /* NVIDIA's tensor-core kernels declare their tiles in the kernel, which may take more than the device reports
     (docs/api.md, fcl_describe_plan). */
  if (!st && strcmp(info.kernel, "nvidia_mma") == 0 && env->fcl->caps.nv_static_local > local)
    local = env->fcl->caps.nv_static_local;
  const size_t groups = (size_t)((200 + info.block_k - 1) / (info.block_k ? info.block_k : 1)) * 2 * 2 +
                        (size_t)((300 + info.block_q - 1) / (info.block_q ? info.block_q : 1)) * 4 * 2;
  check(st == FCL_SUCCESS && info.block_q >= 1 && info.block_k >= 1 && info.local_mem_bytes <= local &&
            (size_t)info.work_group_size <= max_wg && info.work_groups == groups && *info.reason,
        "backward plan: %s, block_q %d, block_k %d, %d work-items, %zu B local, %zu work-groups: %s",
        st ? fcl_last_error() : info.kernel, info.block_q, info.block_k, info.work_group_size, info.local_mem_bytes,
        info.work_groups, info.reason);
}

/* Under FLASHCL_PORTABLE_BACKWARD_SHAPE (the forced-shape group), 1 when the backward of case c would not run
   those shapes on this device (one does not fit, or the tensor-core kernels run); the case is then reported
   as skipped rather than passing as a test of other shapes. */
static int forced_shape_unavailable(test_env *env, const bwd_case *c) {
  const char *shape = getenv("FLASHCL_PORTABLE_BACKWARD_SHAPE");
  int s[8];
  /* An override the library ignores (out of bounds, malformed) forces nothing: the default runs. */
  if (!shape || fcl_parse_portable_backward_shape(shape, s) != 0) return 0;
  fcl_attention_desc desc;
  backward_shape_desc(c, &desc);
  fcl_plan_info info;
  if (fcl_describe_plan(env->fcl, FCL_OP_BACKWARD, &desc, &info) != FCL_SUCCESS) return 0; /* the run reports it */
  /* fcl_describe_plan's words for the two portable kernels' shapes (src/describe.c). */
  char dkdv[96], dq[96];
  snprintf(dkdv, sizeof dkdv, "dK/dV %d keys x %d query rows a step, %dx%d work-items", s[0] * s[2], s[1] * s[3], s[0],
           s[1]);
  snprintf(dq, sizeof dq, "dQ %d query rows x %d keys a step, %dx%d work-items", s[4] * s[6], s[5] * s[7], s[4], s[5]);
  if (strcmp(info.kernel, "portable") == 0 && strstr(info.reason, dkdv) && strstr(info.reason, dq)) return 0;
  char what[240];
  backward_case_name(c, 0, what, sizeof what);
  skip("backward %s: FLASHCL_PORTABLE_BACKWARD_SHAPE=%s does not run on this device for this case (%s: %s)", what,
       shape, info.kernel, info.reason);
  return 1;
}

static void run_listed(test_env *env, const void *arg) {
  const listed *l = arg;
  if (forced_shape_unavailable(env, &l->c)) return;
  run_backward_case(env, env->queue, &l->c, l->determinism, "backward");
}

static void run_finite_differences(test_env *env, const void *unused) {
  (void)env, (void)unused;
  finite_difference_checks();
}

static void run_validation(test_env *env, const void *unused) {
  (void)unused;
  validation_checks(env);
}

/* An out-of-order queue: the three kernels must still run in order (explicit events). */
static void run_out_of_order(test_env *env, const void *unused) {
  (void)unused;
  cl_command_queue_properties props = 0;
  clGetDeviceInfo(env->device, CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  if (!(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    skip("out-of-order queue: the device does not support one");
    return;
  }
  cl_int err;
  cl_command_queue ooo = clCreateCommandQueue(env->context, env->device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  if (err != CL_SUCCESS) {
    check(0, "creating an out-of-order queue failed: %d", err);
    return;
  }
  run_backward_case(env, ooo, &(bwd_case){2, 4, 2, 200, 150, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0}, 1,
                    "backward (out-of-order queue)");
  clReleaseCommandQueue(ooo);
}

static void run_threads(test_env *env, const void *unused) {
  (void)unused;
  thread_checks(env);
}

static void run_describe(test_env *env, const void *unused) {
  (void)unused;
  describe_checks(env);
}

int main(int argc, char **argv) {
  int quick = 0;
  test_cli cli = {0, NULL, 0};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!test_cli_option(&cli, argc, argv, &i)) {
      fprintf(stderr, "usage: %s [--small | --quick] [--list | --case NAME]\n", argv[0]);
      return 2;
    }
  }
  enum { MAX = 140 };
  static listed cases[128];
  static test_case list[MAX];
  int n = 0;
  if (!cli.small && !quick)
    n = test_case_add(list, n, MAX, "", "host_gradients_finite_differences", run_finite_differences, NULL);
  const int count = cli.small ? small_cases(cases) : quick ? quick_cases(cases) : full_cases(cases);
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    backward_case_name(&cases[i].c, cases[i].determinism, name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, run_listed, &cases[i]);
  }
  n = test_case_add(list, n, MAX, "", "validation", run_validation, NULL);
  /* Host behaviour, the same at every tile shape: the full list alone (the --quick groups rerun its tiles). */
  if (!cli.small && !quick) {
    n = test_case_add(list, n, MAX, "", "out_of_order_queue", run_out_of_order, NULL);
    n = test_case_add(list, n, MAX, "", "threads", run_threads, NULL);
  }
  n = test_case_add(list, n, MAX, "", "describe_plan", run_describe, NULL);
  return test_cases_main("test_backward", &cli, list, n);
}
