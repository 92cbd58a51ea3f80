/* The device's loop budget (src/loop_budget.c, src/loop_bounds.c): the probe kernel, its record in the cache
 * directory, the bounds' arithmetic, refusals under a forced budget, and, on a device that has a budget
 * (llvmpipe under rusticl), that the largest key range the bounds admit is computed right, and the reference
 * path's non-finite fixup at the most keys a launch takes, so the bounds are conservative on the real driver.
 * Scratch directories under FLASHCL_BUDGET_TEST_DIR in the build tree.
 * Usage: test_loop_budget */
#include "backward_check.h"
#include "forward_check.h"
#include "internal.h"
#include "test_problem.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FLASHCL_BUDGET_TEST_DIR
#error "FLASHCL_BUDGET_TEST_DIR must name a scratch directory in the build tree"
#endif

static const char *source_name(int s) {
  return s == FCL_QUIRK_MEASURED ? "measured" : s == FCL_QUIRK_CACHED ? "cached" : s == FCL_QUIRK_FORCED ? "forced"
                                                                                                        : "unknown";
}

/* ---- the bounds, without a device ---- */

/* which: FCL_BWD_*, or -1 for the forward (paged: its keys through a block table). */
static void check_max_tiles(const char *what, const fcl_tile_plan *p, int which, int paged, int64_t group,
                            uint64_t budget) {
  const int fwd = which < 0;
  const int64_t m = fwd ? fcl_forward_max_key_tiles(p, paged, budget) : fcl_backward_max_tiles(p, which, group, budget);
#define ITER(n) (fwd ? fcl_forward_loop_iterations(p, paged, (n)) : fcl_backward_loop_iterations(p, which, group, (n)))
  if (budget == 0) {
    check(m == 0, "%s: no budget, no limit (%lld)", what, (long long)m);
  } else if (m < 0) {
    check(m == -1 && ITER(1) > budget, "%s, budget %llu: not one tile fits (one needs %llu)", what,
          (unsigned long long)budget, (unsigned long long)ITER(1));
  } else {
    check(m >= 1 && ITER(m) <= budget && ITER(m + 1) > budget,
          "%s, budget %llu: %lld tiles fit (%llu iterations), one more does not (%llu)", what,
          (unsigned long long)budget, (long long)m, (unsigned long long)ITER(m), (unsigned long long)ITER(m + 1));
  }
#undef ITER
}

static void test_bounds(void) {
  fcl_device_caps gpu, cpu;
  memset(&gpu, 0, sizeof gpu);
  gpu.is_gpu = 1, gpu.local_mem_size = 32768, gpu.max_work_group_size = 1024, gpu.preferred_multiple = 32;
  cpu = gpu;
  cpu.is_gpu = 0, cpu.is_cpu = 1, cpu.local_mem_size = 4 << 20, cpu.max_work_group_size = 4096,
  cpu.preferred_multiple = 8;
  static const int dims[] = {16, 64, 128, 256};
  static const uint64_t budgets[] = {0, 2000, 65535, 1u << 20};
  for (int c = 0; c < 2; ++c)
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
      const fcl_device_caps *caps = c ? &cpu : &gpu;
      fcl_tile_plan f, b[2];
      const fcl_problem p = test_problem(dims[i], FCL_DTYPE_F32, 4096, 0);
      if (fcl_plan_forward(caps, &no_overrides, &p, 0, NULL, &f) ||
          fcl_plan_backward(caps, &no_overrides, &p, 0, NULL, b)) {
        check(0, "%s d=%d: no plan", c ? "cpu" : "gpu", dims[i]);
        continue;
      }
      for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; ++k) {
        char what[96];
        snprintf(what, sizeof what, "%s d=%d forward (%dx%d tiles)", c ? "cpu" : "gpu", dims[i], f.br, f.bc);
        check_max_tiles(what, &f, -1, 0, 1, budgets[k]);
        snprintf(what, sizeof what, "%s d=%d forward, paged keys", c ? "cpu" : "gpu", dims[i]);
        check_max_tiles(what, &f, -1, 1, 1, budgets[k]);
        snprintf(what, sizeof what, "%s d=%d dK/dV, group 4", c ? "cpu" : "gpu", dims[i]);
        check_max_tiles(what, &b[FCL_BWD_DKDV], FCL_BWD_DKDV, 0, 4, budgets[k]);
        snprintf(what, sizeof what, "%s d=%d dQ", c ? "cpu" : "gpu", dims[i]);
        check_max_tiles(what, &b[FCL_BWD_DQ], FCL_BWD_DQ, 0, 1, budgets[k]);
      }
      /* Every pass of the key loop costs at least its own loads and the P.V product. */
      check(fcl_forward_loop_iterations(&f, 0, 2) - fcl_forward_loop_iterations(&f, 0, 1) >=
                (uint64_t)(f.bc / 4) * (uint64_t)f.rm * (uint64_t)f.dn,
            "%s d=%d: a key tile counts at least its P.V loop", c ? "cpu" : "gpu", dims[i]);
    }
  /* The softmax: two passes over a row's share (run-time loops: two more each for entering and leaving) and a
     log2(wg) reduction. */
  check(fcl_softmax_loop_iterations(1000, 256) == 6 + 8 + 6, "softmax over 1000 keys, 256 work-items: 20 iterations");
  /* The reference's non-finite fixup: a pass over d per key, both loops' bounds known at run time only, so each key
     costs 1 + d + 2 and the key loop 2; the most keys a launch takes fill the budget. */
  check(fcl_nonfinite_fixup_loop_iterations(10, 64) == 672, "fixup over 10 keys of d=64: 672 iterations");
  check(fcl_nonfinite_fixup_max_keys(64, 0) == 0 && fcl_nonfinite_fixup_max_keys(64, 64) == -1,
        "fixup keys: no limit without a budget, none when one key's pass does not fit");
  const int64_t keys = fcl_nonfinite_fixup_max_keys(64, 65535);
  check(keys == 978 && fcl_nonfinite_fixup_loop_iterations(keys, 64) <= 65535 &&
            fcl_nonfinite_fixup_loop_iterations(keys + 1, 64) > 65535,
        "fixup keys under llvmpipe's 65535 at d=64: %lld, the most that fit", (long long)keys);

  /* The cu_seqlens check (common.cl's fcl_sorted_prefix): (batch + 1) / 4 + 3 iterations a packed array and 2 for
     entering its loops (llvmpipe charges those), taken off the budget of the kernels' own loops; a batch whose check
     alone does not fit is refused, saying so. */
  fcl_problem packed;
  memset(&packed, 0, sizeof packed);
  packed.batch = 1000, packed.heads = packed.kv_heads = packed.group = 1, packed.d = 64, packed.nq = 64;
  fcl_tile_plan f;
  if (fcl_plan_forward(&gpu, &no_overrides, &packed, 0, NULL, &f)) {
    check(0, "packed: no plan");
    return;
  }
  packed.nk = 2 * (int64_t)f.bc, packed.wl = packed.nk, packed.wr = packed.nq; /* two key tiles, no window */
  check(fcl_prefix_loop_iterations(&packed) == 0, "dense sequences: no check");
  packed.cu_q = (cl_mem)&packed; /* only told from NULL */
  check(fcl_prefix_loop_iterations(&packed) == 255, "cu_seqlens_q of 1000 sequences: 255 iterations");
  packed.cu_k = (cl_mem)&packed;
  const uint64_t prefix = fcl_prefix_loop_iterations(&packed);
  check(prefix == 510, "cu_seqlens_q and _k of 1000 sequences: 510 iterations (%llu)", (unsigned long long)prefix);
  fcl_device_caps budgeted = gpu;
  snprintf(budgeted.device_name, sizeof budgeted.device_name, "a budgeted device");
  budgeted.loop_budget = fcl_forward_loop_iterations(&f, 0, 2) + prefix;
  f.splits = 1;
  check(fcl_forward_within_budget(&budgeted, &packed, &f) == FCL_SUCCESS, "two key tiles and the check fit: %s",
        fcl_last_error());
  budgeted.loop_budget -= 1;
  const fcl_status st = fcl_forward_within_budget(&budgeted, &packed, &f);
  check(st == FCL_ERROR_UNSUPPORTED, "one iteration less: refused (%s)", fcl_status_string(st));
  check(fcl_forward_budget_splits(&budgeted, &packed, &f) == 2, "one iteration less: two chunks of one tile");
  budgeted.loop_budget = prefix;
  const fcl_status at = fcl_softmax_within_budget(&budgeted, &packed, 64);
  check(at == FCL_ERROR_UNSUPPORTED && strstr(fcl_last_error(), "cu_seqlens"),
        "a budget the check alone fills: refused, naming it (%s)", fcl_last_error());
  fcl_clear_error();
}

/* ---- the probe and its record ---- */

static fcl_context *context_in(test_env *env, const char *dir, unsigned flags) {
  fcl_context_options o = {dir, NULL, flags};
  fcl_context *ctx = NULL;
  if (fcl_context_create(env->context, env->device, &o, &ctx) != FCL_SUCCESS) {
    check(0, "fcl_context_create: %s", fcl_last_error());
    return NULL;
  }
  return ctx;
}

static int spit(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  const int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

static void test_record(test_env *env, const char *base) {
  unsetenv("FLASHCL_LOOP_BUDGET");
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/record", base);
  mkdir(dir, 0755);
  fcl_context *a = context_in(env, dir, 0);
  if (!a) return;
  char *path = fcl_loop_budget_file_path(&a->caps, dir);
  struct stat st;
  check(a->caps.loop_budget_source == FCL_QUIRK_MEASURED && path && stat(path, &st) == 0,
        "a fresh cache directory: %s (%s), recorded in %s", source_name(a->caps.loop_budget_source),
        a->caps.quirk_detail, path ? path : "(no path)");
  printf("     loop budget %llu (0: none below 2^20), profiling clock %s\n", a->caps.loop_budget,
         a->caps.profiling_clock_unusable ? "reads zero" : "works");
  fcl_context *b = context_in(env, dir, 0);
  if (b) {
    check(b->caps.loop_budget_source == FCL_QUIRK_CACHED && b->caps.loop_budget == a->caps.loop_budget &&
              b->caps.profiling_clock_unusable == a->caps.profiling_clock_unusable,
          "a second context reads the record (%s, budget %llu)", source_name(b->caps.loop_budget_source),
          b->caps.loop_budget);
    fcl_device_quirks q;
    check(fcl_context_device_quirks(b, &q) == FCL_SUCCESS && q.loop_budget == b->caps.loop_budget &&
              q.source == FCL_QUIRK_CACHED && q.profiling_clock_unusable == b->caps.profiling_clock_unusable && q.detail[0],
          "fcl_context_device_quirks reports it: %s", q.detail);
    fcl_context_release(b);
  }
  /* A damaged record is a miss: measured again and rewritten. */
  if (path && spit(path, "not a record") == 0) {
    fcl_context *c = context_in(env, dir, 0);
    fcl_context *d = c ? context_in(env, dir, 0) : NULL;
    check(c && d && c->caps.loop_budget_source == FCL_QUIRK_MEASURED && c->caps.loop_budget == a->caps.loop_budget &&
              d->caps.loop_budget_source == FCL_QUIRK_CACHED,
          "a damaged record: measured again (%s), rewritten (then %s)", c ? source_name(c->caps.loop_budget_source) : "-",
          d ? source_name(d->caps.loop_budget_source) : "-");
    fcl_context_release(c);
    fcl_context_release(d);
  }
  fcl_context *none = context_in(env, "", 0);
  if (none) {
    check(none->caps.loop_budget_source == FCL_QUIRK_MEASURED && none->caps.loop_budget == a->caps.loop_budget,
          "without a disk cache: measured per context, the same budget (%llu)", none->caps.loop_budget);
    fcl_context_release(none);
  }
  /* The probe itself: exact below any budget; at most the budget above it. */
  int count = -1, clock = -1;
  fcl_status s = fcl_run_loop_probe(env->context, env->device, 1000, &count, &clock);
  check(s == FCL_SUCCESS && count == 1000, "the probe counts a loop of 1000 exactly (%d)", count);
  if (a->caps.loop_budget) {
    const int n = (int)a->caps.loop_budget + 5000;
    s = fcl_run_loop_probe(env->context, env->device, n, &count, &clock);
    check(s == FCL_SUCCESS && count <= (int)a->caps.loop_budget,
          "a loop of %d stops within the budget of %llu (%d): the quirk is still there", n, a->caps.loop_budget, count);
  }
  check(fcl_context_device_quirks(NULL, NULL) == FCL_ERROR_INVALID_ARGUMENT &&
            fcl_context_device_quirks(a, NULL) == FCL_ERROR_INVALID_ARGUMENT,
        "fcl_context_device_quirks: NULL arguments are invalid");
  free(path);
  fcl_context_release(a);
}

/* ---- refusals under a forced budget, and the largest admitted range on the device ---- */

static fcl_status forward_status(test_env *env, fcl_context *ctx, long long nq, long long nk, long long d) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = 1, desc.num_heads = 1, desc.seqlen_q = nq, desc.seqlen_k = nk, desc.head_dim = d;
  desc.dtype = FCL_DTYPE_F32;
  cl_mem q = create_float_buffer(env, (size_t)(nq * d), 0.5f), k = create_float_buffer(env, (size_t)(nk * d), 0.5f);
  cl_mem v = create_float_buffer(env, (size_t)(nk * d), 0.5f), o = create_float_buffer(env, (size_t)(nq * d), NAN);
  cl_event ev = NULL;
  fcl_status st = q && k && v && o ? fcl_attention_forward(ctx, env->queue, &desc, q, k, v, o, NULL, 0, NULL, &ev)
                                   : FCL_ERROR_OUT_OF_RESOURCES;
  if (ev) {
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
  }
  cl_mem all[4] = {q, k, v, o};
  for (int i = 0; i < 4; ++i)
    if (all[i]) clReleaseMemObject(all[i]);
  return st;
}

/* Forced budgets, on contexts of the portable kernels only: the budget bounds their loops (vendor kernels run on
   drivers without one, so on an NVIDIA GPU the forward and backward would otherwise take tensor cores whatever it
   says). */
static void test_forced(test_env *env) {
  setenv("FLASHCL_LOOP_BUDGET", "65535", 1);
  fcl_context *ctx = context_in(env, "", FCL_FLAG_PORTABLE_ONLY);
  if (!ctx) return;
  check(ctx->caps.loop_budget_source == FCL_QUIRK_FORCED && ctx->caps.loop_budget == 65535,
        "FLASHCL_LOOP_BUDGET=65535 forces the budget (%s, %llu)", source_name(ctx->caps.loop_budget_source),
        ctx->caps.loop_budget);
  fcl_context *saved = env->fcl;
  env->fcl = ctx;
  /* Past one launch's reach: split-KV chunks keep each launch inside the budget where up to FCL_MAX_SPLITS
     chunks suffice, else the forward refuses; either way never a wrong answer. */
  const fwd_case long_fwd = {1, 1, 0, 64, 10000, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1};
  check(run_forward_case(env, env->queue, &long_fwd, fcl_attention_forward, "forward Nk=10000 under the budget") != 1,
        "forward Nk=10000 under a budget of 65535: right (in chunks) or refused");
  const bwd_case long_bwd = {1, 1, 0, 16, 10000, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 0};
  /* run_backward_case reports the refusal as a skip; count it here as the expected outcome. */
  const int skipped = test_skipped;
  const int r = run_backward_case(env, env->queue, &long_bwd, 0, "backward Nk=10000 past the budget");
  check(r == 2 && test_skipped == skipped + 1, "the backward past the budget is refused (result %d)", r);
  const fwd_case fits = {1, 2, 0, 100, 30, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1}; /* one key tile */
  check(run_forward_case(env, env->queue, &fits, fcl_attention_forward, "forward within the budget") == 0,
        "a problem within the budget runs and is right");
  env->fcl = saved;
  fcl_context_release(ctx);

  /* fcl_attention_merge of 800 parts past a budget of 300 (at head_dim 4 each of the combine's 16 part lanes
     takes 50: 496 loop iterations a work-item); 40 parts stay within it (120). */
  setenv("FLASHCL_LOOP_BUDGET", "300", 1);
  ctx = context_in(env, "", FCL_FLAG_PORTABLE_ONLY);
  if (ctx) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = desc.num_heads = desc.seqlen_q = desc.seqlen_k = 1, desc.head_dim = 4, desc.dtype = FCL_DTYPE_F32;
    cl_mem parts = create_float_buffer(env, 800 * 4, 0.5f), lses = create_float_buffer(env, 800, 0.0f);
    cl_mem out = create_float_buffer(env, 4, NAN);
    cl_event ev = NULL;
    fcl_status st = parts && lses && out
                        ? fcl_attention_merge(ctx, env->queue, &desc, 800, parts, 4, lses, out, NULL, 0, NULL, &ev)
                        : FCL_ERROR_OUT_OF_RESOURCES;
    check(st == FCL_ERROR_UNSUPPORTED && !ev && strstr(fcl_last_error(), "loop iterations per work-item"),
          "merge of 800 parts past a budget of 300: %s: %s", fcl_status_string(st), fcl_last_error());
    st = parts && lses && out ? fcl_attention_merge(ctx, env->queue, &desc, 40, parts, 4, lses, out, NULL, 0, NULL, &ev)
                              : FCL_ERROR_OUT_OF_RESOURCES;
    if (ev) clWaitForEvents(1, &ev), clReleaseEvent(ev);
    float got[4] = {0, 0, 0, 0};
    const int read = st == FCL_SUCCESS && read_floats(env, out, got, 4) == 0;
    check(read && fabsf(got[0] - 0.5f) < 1e-6f && fabsf(got[3] - 0.5f) < 1e-6f,
          "merge of 40 equal parts within it: %s, O = %g (0.5 expected)", fcl_status_string(st), (double)got[0]);
    cl_mem all[3] = {parts, lses, out};
    for (int i = 0; i < 3; ++i)
      if (all[i]) clReleaseMemObject(all[i]);
    fcl_context_release(ctx);
  }

  /* A budget below one key tile: no split helps, the forward refuses and says why. */
  setenv("FLASHCL_LOOP_BUDGET", "100", 1);
  ctx = context_in(env, "", FCL_FLAG_PORTABLE_ONLY);
  if (ctx) {
    fcl_status st = forward_status(env, ctx, 64, 100, 64);
    check(st == FCL_ERROR_UNSUPPORTED && strstr(fcl_last_error(), "loop iterations per work-item"),
          "forward under a budget of 100: %s: %s", fcl_status_string(st), fcl_last_error());
    fcl_context_release(ctx);
  }

  setenv("FLASHCL_LOOP_BUDGET", "0", 1);
  ctx = context_in(env, "", 0);
  if (ctx) {
    check(ctx->caps.loop_budget_source == FCL_QUIRK_FORCED && ctx->caps.loop_budget == 0,
          "FLASHCL_LOOP_BUDGET=0 forces no limit");
    fcl_context_release(ctx);
  }
  setenv("FLASHCL_LOOP_BUDGET", "lots", 1);
  ctx = context_in(env, "", 0);
  if (ctx) {
    check(ctx->caps.loop_budget_source != FCL_QUIRK_FORCED, "FLASHCL_LOOP_BUDGET=lots is ignored (%s)",
          source_name(ctx->caps.loop_budget_source));
    fcl_context_release(ctx);
  }
  unsetenv("FLASHCL_LOOP_BUDGET");
}

/* On a device with a budget: the longest key range the bounds admit is right, one tile more is refused. */
static void test_edge(test_env *env) {
  const unsigned long long budget = env->fcl->caps.loop_budget;
  if (!budget) {
    skip("largest admitted key range: %s has no loop budget (%s)", env->device_name, env->fcl->caps.quirk_detail);
    return;
  }
  static const long long dims[] = {64, 128};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1, desc.num_heads = 2, desc.seqlen_q = 40, desc.seqlen_k = 40, desc.head_dim = dims[i];
    fcl_plan_info info;
    if (fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &desc, &info) != FCL_SUCCESS) {
      check(0, "d=%lld: no plan: %s", dims[i], fcl_last_error());
      continue;
    }
    fcl_problem p;
    fcl_tile_plan plan;
    cl_kernel kernel;
    pthread_mutex_lock(&env->fcl->lock);
    fcl_status st = fcl_resolve_problem(&desc, &p);
    if (!st) st = fcl_select_forward(env->fcl, &p, &plan, &kernel);
    pthread_mutex_unlock(&env->fcl->lock);
    const int64_t tiles = st ? -1 : fcl_forward_max_key_tiles(&plan, 0, budget);
    if (tiles < 1) {
      skip("d=%lld: not one key tile fits the budget of %llu", dims[i], budget);
      continue;
    }
    /* In a context that splits no key range for occupancy, so that the edge runs as one launch. */
    fcl_context *one = test_context_unsplit(env), *own = env->fcl;
    desc.seqlen_k = tiles * plan.bc;
    fcl_plan_info edge_plan;
    if (!one || fcl_describe_plan(one, FCL_OP_FORWARD, &desc, &edge_plan) != FCL_SUCCESS) {
      check(0, "d=%lld: the unsplit context's plan: %s", dims[i], fcl_last_error());
      if (one) fcl_context_release(one);
      continue;
    }
    check(edge_plan.splits == 1, "d=%lld: %lld keys in one launch (splits %d)", dims[i], (long long)desc.seqlen_k,
          edge_plan.splits);
    const fwd_case edge = {1, 2, 0, 40, tiles * plan.bc, dims[i], FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1};
    env->fcl = one;
    check(run_forward_case(env, env->queue, &edge, fcl_attention_forward, "forward at the budget's edge") == 0,
          "d=%lld: %lld key tiles of %d, the most the budget of %llu admits, are computed right", dims[i],
          (long long)tiles, plan.bc, budget);
    env->fcl = own;
    fcl_context_release(one);
    /* One tile more is past what a single launch may stream: refused unsplit, and split-KV (which gives a
       long range enough chunks) computes it right. */
    fcl_problem more;
    desc.seqlen_k = (tiles + 1) * plan.bc;
    if (fcl_resolve_problem(&desc, &more) != FCL_SUCCESS) {
      check(0, "d=%lld: resolve: %s", dims[i], fcl_last_error());
      continue;
    }
    fcl_tile_plan unsplit = plan;
    unsplit.splits = 1;
    st = fcl_forward_within_budget(&env->fcl->caps, &more, &unsplit);
    check(st == FCL_ERROR_UNSUPPORTED, "d=%lld: one key tile more in one launch is refused: %s", dims[i],
          fcl_status_string(st));
    fcl_clear_error();
    const fwd_case past = {1, 2, 0, 40, (tiles + 1) * plan.bc, dims[i], FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1};
    check(run_forward_case(env, env->queue, &past, fcl_attention_forward, "forward one tile past the edge") != 1,
          "d=%lld: %lld key tiles are right, or refused, never wrong", dims[i], (long long)tiles + 1);
  }
}

/* On a device with a budget: the reference path's non-finite fixup (cl/softmax.cl) at the most keys one launch
   takes, and over two launches. One query row sees every key, and every key of V has a non-finite value, so that
   the fixup's inner loop runs for each: +inf in column 0, except that each column's one NaN lies among the last
   keys of a launch's range (column c in launch c % launches, the c / launches-th key from its end). Every column of
   O is NaN only if each launch reached its last keys: a driver that ends the loops early leaves a column finite,
   or column 0 at +inf. */
static void test_fixup_edge(test_env *env) {
  const unsigned long long budget = env->fcl->caps.loop_budget;
  if (!budget) {
    skip("the non-finite fixup at its edge: %s has no loop budget", env->device_name);
    return;
  }
  const int d = 64;
  const int64_t keys = fcl_nonfinite_fixup_max_keys(d, budget);
  if (keys < d) {
    skip("the non-finite fixup at its edge: %lld keys a launch", (long long)keys);
    return;
  }
  for (int launches = 1; launches <= 2; ++launches) {
    const int64_t nk = launches * keys;
    float *q = malloc(sizeof(float) * d), *kv = malloc(sizeof(float) * (size_t)nk * d * 2), o[64];
    float *v = kv + (size_t)nk * d;
    for (int c = 0; c < d; ++c) q[c] = (float)test_uniform();
    for (int64_t i = 0; i < nk * d; ++i) kv[i] = (float)test_uniform(), v[i] = (float)test_uniform();
    for (int64_t j = 0; j < nk; ++j) v[j * d] = INFINITY;
    for (int c = 0; c < d; ++c) {
      const int64_t j = (c % launches + 1) * keys - 1 - c / launches;
      v[j * d] = (float)test_uniform(), v[j * d + c] = NAN;
    }
    cl_int err;
    cl_mem qb = clCreateBuffer(env->context, CL_MEM_COPY_HOST_PTR, sizeof(float) * d, q, &err);
    cl_mem kb = clCreateBuffer(env->context, CL_MEM_COPY_HOST_PTR, sizeof(float) * (size_t)nk * d, kv, &err);
    cl_mem vb = clCreateBuffer(env->context, CL_MEM_COPY_HOST_PTR, sizeof(float) * (size_t)nk * d, v, &err);
    cl_mem ob = clCreateBuffer(env->context, CL_MEM_READ_WRITE, sizeof o, NULL, &err);
    cl_mem lb = clCreateBuffer(env->context, CL_MEM_READ_WRITE, sizeof(float), NULL, &err);
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1, desc.num_heads = 1, desc.seqlen_q = 1, desc.seqlen_k = nk, desc.head_dim = d;
    const fcl_status st = fcl_attention_reference(env->fcl, env->queue, &desc, qb, kb, vb, ob, lb, 0, NULL, NULL);
    int finite = -1;
    if (!st && clEnqueueReadBuffer(env->queue, ob, CL_TRUE, 0, sizeof o, o, 0, NULL, NULL) == CL_SUCCESS) {
      finite = 0;
      for (int c = 0; c < d; ++c) finite += !isnan(o[c]);
    }
    check(finite == 0, "reference, %lld keys of d=%d (%d launch%s of the fixup at most %lld keys): %d of %d columns of "
          "O not NaN (%s)", (long long)nk, d, launches, launches > 1 ? "es" : "", (long long)keys, finite, d,
          st ? fcl_last_error() : "expected 0");
    cl_mem all[5] = {qb, kb, vb, ob, lb};
    for (int i = 0; i < 5; ++i) clReleaseMemObject(all[i]);
    free(q);
    free(kv);
  }
}

int main(void) {
  test_seed();
  test_bounds();
  test_env env;
  if (test_open(&env, NULL)) return 1;
  char base[4096];
  mkdir(FLASHCL_BUDGET_TEST_DIR, 0755);
  snprintf(base, sizeof base, "%s/run.%ld", FLASHCL_BUDGET_TEST_DIR, (long)getpid());
  if (mkdir(base, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "cannot create %s\n", base);
    return 1;
  }
  const char *forced = getenv("FLASHCL_LOOP_BUDGET");
  if (forced) {
    skip("the probe and its record: FLASHCL_LOOP_BUDGET=%s is set for the whole run", forced);
  } else {
    test_record(&env, base);
  }
  test_edge(&env);
  test_fixup_edge(&env);
  test_forced(&env);
  test_close(&env);
  return test_summary("test_loop_budget");
}
