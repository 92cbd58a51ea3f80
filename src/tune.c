/* Opt-in autotune of the portable forward kernel's shape (fcl_tune_forward), on top of the planner: its
 * records (tune_record.c) are what the planner then uses.
 *
 * fcl_tune_forward times a short list of candidate shapes (those measured fastest on GPUs and on CPUs in
 * docs/notes-portable.md) that fit the device for the problem's (head_dim, dtype), and the rule's default,
 * on scratch buffers of the problem's size: the median device time (profiling events) of TUNE_RUNS calls
 * after one warm-up, or the host's wall clock where the profiling clock is unusable (zero, not advancing, or
 * far behind the host's clock). A candidate that does not build, admits too few work-items or fails to run is left
 * out. The winner is recorded only when it is at least TUNE_MARGIN faster than the default; otherwise the
 * default stays and an earlier record is removed.
 *
 * Locking: ctx->lock is held while a candidate kernel is looked up (not while it builds) and while each run
 * is set up and enqueued, never while waiting for a run, so other threads' calls proceed between runs (their
 * device work competes with the timed runs and makes the timings noisier).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TUNE_RUNS 5      /* timed calls per shape, after one warm-up; the median counts */
#define TUNE_MARGIN 0.02 /* a candidate must be this much faster than the default to be recorded */

/* Candidates (tr, tc, rm, rn, kt; kt -1: by device type), from docs/notes-portable.md. */
static const int gpu_candidates[][5] = {
    {8, 16, 4, 2, -1},  {16, 8, 4, 4, -1}, {16, 8, 2, 4, -1}, {8, 8, 4, 4, -1},  {8, 16, 4, 4, -1},
    {16, 16, 4, 2, -1}, {8, 16, 8, 2, -1}, {16, 16, 2, 2, -1}, {8, 16, 2, 2, -1}, {8, 8, 2, 4, -1},
    {8, 8, 2, 2, -1}};
static const int cpu_candidates[][5] = {{4, 4, 16, 16, 1}, {4, 2, 16, 32, 1}, {8, 4, 8, 16, 1}, {4, 8, 16, 8, 1},
                                        {8, 8, 8, 8, 1},   {4, 4, 8, 8, 1},   {16, 4, 4, 16, 1}};

/* ---- timing ---- */

/* The scratch problem's buffers: q, k, v (random), o. */
typedef struct tune_buffers {
  cl_mem m[4];
} tune_buffers;

static void release_buffers(tune_buffers *b) {
  for (int i = 0; i < 4; ++i)
    if (b->m[i]) clReleaseMemObject(b->m[i]);
}

/* Random values in about [-1, 1] for the dtype's storage, written in chunks (no full-size host copy). */
static fcl_status fill_random(cl_command_queue queue, cl_mem buf, size_t elems, fcl_dtype dtype, uint64_t seed) {
  enum { CHUNK = 1 << 18 };
  const size_t es = dtype == FCL_DTYPE_F32 ? 4 : 2;
  unsigned char *host = malloc(CHUNK * es);
  if (!host) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory filling the tuning buffers");
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  fcl_status st = FCL_SUCCESS;
  for (size_t at = 0; at < elems && !st; at += CHUNK) {
    const size_t n = elems - at < CHUNK ? elems - at : CHUNK;
    for (size_t i = 0; i < n; ++i) {
      x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
      const uint64_t r = x * 0x2545F4914F6CDD1Dull;
      const unsigned sign = (unsigned)(r >> 63), mant = (unsigned)(r >> 40);
      if (dtype == FCL_DTYPE_F32) {
        float f = (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        memcpy(host + 4 * i, &f, 4);
      } else {
        /* Magnitude in [1/16, 1): exponent 11..14 (f16) or 123..126 (bf16), random mantissa. */
        const unsigned e = (unsigned)(r >> 32) & 3;
        const uint16_t h = dtype == FCL_DTYPE_F16 ? (uint16_t)(sign << 15 | (11 + e) << 10 | (mant & 0x3ff))
                                                  : (uint16_t)(sign << 15 | (123 + e) << 7 | (mant & 0x7f));
        memcpy(host + 2 * i, &h, 2);
      }
    }
    cl_int err = clEnqueueWriteBuffer(queue, buf, CL_TRUE, at * es, n * es, host, 0, NULL, NULL);
    if (err != CL_SUCCESS) st = fcl_cl_failure("clEnqueueWriteBuffer", err);
  }
  free(host);
  return st;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* Median time in ms of TUNE_RUNS forward calls with plan t after one warm-up: device time from profiling
   events, or, once *wall is set, host wall time from an idle queue to clFinish. A profiling clock that
   cannot time the run (fcl_profiling_time_unusable: rusticl on llvmpipe counts 1 ns per command) sets
   *wall and the runs are timed again by the wall clock, so no figure comes from that clock. */
static fcl_status time_plan(fcl_context *ctx, cl_command_queue queue, const fcl_problem *p, const fcl_tile_plan *t,
                            cl_kernel kernel, const tune_buffers *b, int *wall, double *median_ms) {
  double ms[TUNE_RUNS];
  for (int i = -1; i < TUNE_RUNS; ++i) {
    cl_event ev = NULL;
    FCL_CL_CHECK(clFinish(queue));
    const double t0 = wall_ms();
    pthread_mutex_lock(&ctx->lock);
    fcl_status st = fcl_enqueue_forward(queue, p, t, kernel, b->m[0], b->m[1], b->m[2], b->m[3], NULL, 0, NULL, &ev);
    pthread_mutex_unlock(&ctx->lock);
    if (st) return st;
    cl_ulong start = 0, end = 0;
    cl_int err = clWaitForEvents(1, &ev);
    if (err == CL_SUCCESS) err = clFinish(queue);
    const double t1 = wall_ms();
    if (err == CL_SUCCESS && !*wall)
      err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
    if (err == CL_SUCCESS && !*wall) err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
    clReleaseEvent(ev);
    if (err != CL_SUCCESS) return fcl_cl_failure("clWaitForEvents/clFinish/clGetEventProfilingInfo", err);
    if (!*wall && fcl_profiling_time_unusable(start, end, 1e6 * (t1 - t0))) {
      *wall = 1;
      i = -1; /* start over: the warm-up is done, every run is now timed by the wall clock */
      continue;
    }
    if (i >= 0) ms[i] = *wall ? t1 - t0 : 1e-6 * (double)(end - start);
  }
  qsort(ms, TUNE_RUNS, sizeof ms[0], cmp_double);
  *median_ms = ms[TUNE_RUNS / 2];
  return FCL_SUCCESS;
}

static int same_shape(const fcl_tile_plan *a, const fcl_tile_plan *b) {
  return a->tr == b->tr && a->tc == b->tc && a->rm == b->rm && a->rn == b->rn && a->kt == b->kt && a->ds == b->ds;
}

fcl_status fcl_tune_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                            fcl_tune_result *out) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  if (!out) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  fcl_problem p;
  fcl_status st;
  if ((st = fcl_resolve_problem(desc, &p)) || (st = fcl_check_queue(ctx, queue))) return st;
  /* The scratch buffers are contiguous: the same problem with default strides and no offsets. */
  fcl_attention_desc scratch = *desc;
  memset(scratch.q_stride, 0, sizeof scratch.q_stride), memset(scratch.k_stride, 0, sizeof scratch.k_stride);
  memset(scratch.v_stride, 0, sizeof scratch.v_stride), memset(scratch.o_stride, 0, sizeof scratch.o_stride);
  scratch.q_offset = scratch.k_offset = scratch.v_offset = scratch.o_offset = 0;
  /* Shapes are tuned on the kernel without score modifiers; a record serves every modifier. And on dense
     sequences of seqlen_q and seqlen_k (the longest, with cu_seqlens or seqlens_k): the kernel built here reads
     the scratch buffers densely, and a record keeps to dense and packed keys. */
  scratch.softcap = 0.0f, scratch.window = 0;
  scratch.alibi_slopes = scratch.mask = scratch.sinks = scratch.d_sinks = NULL;
  scratch.cu_seqlens_q = scratch.cu_seqlens_k = scratch.seqlens_k = scratch.block_table = NULL;
  scratch.total_q = scratch.total_k = scratch.block_table_stride = scratch.block_size = scratch.num_blocks = 0;
  if ((st = fcl_resolve_problem(&scratch, &p))) return st;
  cl_command_queue_properties props = 0;
  FCL_CL_CHECK(clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL));
  if (!(props & CL_QUEUE_PROFILING_ENABLE))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "queue was created without CL_QUEUE_PROFILING_ENABLE; fcl_tune_forward times each shape with "
                    "profiling events");
  /* Scratch sizes, checked in floating point first (the product of the sizes may exceed 64 bits). */
  const double q_bytes = (double)p.batch * (double)p.heads * (double)p.nq * (double)p.d * (double)p.elem_size;
  const double k_bytes = (double)p.batch * (double)p.kv_heads * (double)p.nk * (double)p.d * (double)p.elem_size;
  const fcl_device_caps *caps = &ctx->caps;
  if (q_bytes > (double)caps->max_alloc_size || k_bytes > (double)caps->max_alloc_size)
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES,
                    "the tuning buffers for desc (q/o %.0f B, k/v %.0f B) exceed CL_DEVICE_MAX_MEM_ALLOC_SIZE (%llu B)",
                    q_bytes, k_bytes, (unsigned long long)caps->max_alloc_size);
  if (2 * (q_bytes + k_bytes) > (double)caps->global_mem_size)
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES,
                    "the tuning buffers for desc (%.0f B in all) exceed the device's global memory (%llu B)",
                    2 * (q_bytes + k_bytes), (unsigned long long)caps->global_mem_size);
  const size_t q_elems = (size_t)(p.batch * p.q_stride[0]), k_elems = (size_t)(p.batch * p.k_stride[0]);

  /* The default is the rule's (FCL_PLAN_RULE), whatever FLASHCL_FORWARD_SHAPE or an earlier record says. */
  const fcl_variant *portable = &fcl_variants[FCL_VARIANT_PORTABLE_FORWARD];
  fcl_tile_plan def, best;
  cl_kernel def_kernel;
  char why[sizeof def.reason];
  pthread_mutex_lock(&ctx->lock);
  st = fcl_variant_build(ctx, portable, &p, ctx->flags | FCL_PLAN_RULE, "", &def, &def_kernel, why, sizeof why);
  pthread_mutex_unlock(&ctx->lock);
  /* A launch past the device's loop budget ends early: its time says nothing. */
  if (!st) st = fcl_forward_within_budget(caps, &p, &def);
  if (st) return st;

  tune_buffers b = {{NULL, NULL, NULL, NULL}};
  const size_t bytes[4] = {q_elems * p.elem_size, k_elems * p.elem_size, k_elems * p.elem_size, q_elems * p.elem_size};
  for (int i = 0; i < 4 && !st; ++i) {
    cl_int err;
    b.m[i] = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes[i], NULL, &err);
    if (err != CL_SUCCESS) {
      b.m[i] = NULL;
      st = fcl_cl_failure("clCreateBuffer", err);
    } else if (i < 3) {
      st = fill_random(queue, b.m[i], i == 0 ? q_elems : k_elems, p.dtype, (uint64_t)i + 1);
    }
  }
  double default_ms = 0, best_ms = 0;
  int wall = caps->profiling_clock_unusable == 1; /* measured at context creation; checked again per run */
  if (!st) st = time_plan(ctx, queue, &p, &def, def_kernel, &b, &wall, &default_ms);
  if (st) {
    release_buffers(&b);
    return st;
  }
  best = def, best_ms = default_ms;
  int timed = 1, compared_wall = wall; /* compared_wall: default_ms and best_ms are wall-clock times */
  const int(*cands)[5] = caps->is_cpu ? cpu_candidates : gpu_candidates;
  const size_t count = caps->is_cpu ? sizeof cpu_candidates / sizeof cpu_candidates[0]
                                    : sizeof gpu_candidates / sizeof gpu_candidates[0];
  for (size_t i = 0; i < count; ++i) {
    const int *c = cands[i];
    fcl_tile_plan t;
    if (fcl_plan_forward_shape(caps, (int)p.d, 0, c[0], c[1], c[2], c[3], 1, c[4], &t) != 0 || same_shape(&t, &def))
      continue;
    cl_kernel kernel;
    size_t wg = 0;
    double ms = 0;
    pthread_mutex_lock(&ctx->lock);
    st = fcl_variant_kernel(ctx, portable, &p, &t, 0, "", &kernel, &wg);
    pthread_mutex_unlock(&ctx->lock);
    if (!st && wg >= (size_t)t.wg && fcl_forward_within_budget(caps, &p, &t) == FCL_SUCCESS)
      st = time_plan(ctx, queue, &p, &t, kernel, &b, &wall, &ms);
    else if (!st) st = FCL_ERROR_UNSUPPORTED;
    const int ran = st == FCL_SUCCESS;
    if (!ran) { /* this candidate cannot run here: leave it out */
      st = FCL_SUCCESS;
      fcl_clear_error();
    }
    /* The clock failed only now: time the default (and the best so far) again by the same wall clock. */
    if (wall && !compared_wall) {
      compared_wall = 1;
      const fcl_tile_plan redo[2] = {def, best};
      double *redo_ms[2] = {&default_ms, &best_ms};
      for (int r = 0; r < (same_shape(&def, &best) ? 1 : 2) && !st; ++r) {
        cl_kernel rk;
        size_t rwg = 0;
        pthread_mutex_lock(&ctx->lock);
        st = fcl_variant_kernel(ctx, portable, &p, &redo[r], 0, "", &rk, &rwg);
        pthread_mutex_unlock(&ctx->lock);
        if (!st) st = time_plan(ctx, queue, &p, &redo[r], rk, &b, &wall, redo_ms[r]);
      }
      if (same_shape(&def, &best)) best_ms = default_ms;
      if (st) {
        release_buffers(&b);
        return st;
      }
    }
    if (!ran) continue;
    ++timed;
    if (ms < best_ms) best = t, best_ms = ms;
  }
  release_buffers(&b);

  memset(out, 0, sizeof *out);
  fcl_forward_shape_string(&best, out->shape, sizeof out->shape);
  fcl_forward_shape_string(&def, out->default_shape, sizeof out->default_shape);
  out->best_ms = best_ms;
  out->default_ms = default_ms;
  out->candidates = timed;
  out->wall_clock = wall;
  out->recorded = !same_shape(&best, &def) && best_ms < default_ms * (1.0 - TUNE_MARGIN);
  fcl_forward_shape shape;
  fcl_forward_shape_of_plan(&best, &shape);
  return fcl_tune_record(ctx, (int)p.d, p.dtype, out->recorded ? &shape : NULL, best_ms, default_ms, &out->saved);
}
