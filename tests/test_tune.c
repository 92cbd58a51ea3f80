/* The opt-in autotune of the portable forward (fcl_tune_forward) and the planner's use of its record:
 * argument checks (each bad argument's status and message, a queue without profiling); a real tuning run
 * on a tiny problem; a recorded shape (forced through fcl_tune_record, so the check does not depend on which
 * shape wins) planned by the same and by a new context, with correct results; corrupt, truncated,
 * mismatching and no-longer-fitting records ignored (the rule's plan, correct results); FLASHCL_FORWARD_SHAPE
 * winning over a record; a context without disk cache keeping its record to itself; tuning on one thread
 * while another runs forward calls.
 *
 * Every forward run is checked against the float64 host reference (run_forward_case, bounds in
 * forward_check.h). Scratch directory: FLASHCL_TUNE_TEST_DIR in the build tree.
 */
#include "forward_check.h"
#include "internal.h"
#include "test_problem.h"

#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FLASHCL_TUNE_TEST_DIR
#error "FLASHCL_TUNE_TEST_DIR must name a scratch directory in the build tree"
#endif

#define HD 32            /* the head_dim tuned and recorded */
#define OTHER_HD 48      /* one that is never recorded */

static const char *dir = FLASHCL_TUNE_TEST_DIR;

static void clear_dir(void) {
  mkdir(dir, 0755);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0'))) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
}

static int file_exists(const char *path) { return path && access(path, F_OK) == 0; }

/* Contexts of the portable kernels only: a record matters to them alone (docs/api.md), and on an NVIDIA GPU f32
   would otherwise plan the tensor-core kernel whatever was recorded. */
static fcl_context *new_context(test_env *env, const char *cache_dir) {
  fcl_context_options o = {0};
  o.cache_dir = cache_dir, o.flags = FCL_FLAG_PORTABLE_ONLY;
  fcl_context *c = NULL;
  if (fcl_context_create(env->context, env->device, &o, &c) != FCL_SUCCESS) {
    printf("fcl_context_create: %s\n", fcl_last_error());
    return NULL;
  }
  return c;
}

static void tune_desc(fcl_attention_desc *d, int64_t b, int64_t h, int64_t n, int64_t hd, fcl_dtype t) {
  memset(d, 0, sizeof *d);
  d->batch = b, d->num_heads = h, d->seqlen_q = n, d->seqlen_k = n, d->head_dim = hd, d->dtype = t;
}

/* The forward plan c describes for (hd, t); fails the run when it cannot. */
static fcl_plan_info plan_of(fcl_context *c, int hd, fcl_dtype t) {
  fcl_attention_desc d;
  tune_desc(&d, 1, 2, 100, hd, t);
  fcl_plan_info info;
  memset(&info, 0, sizeof info);
  fcl_status st = fcl_describe_plan(c, FCL_OP_FORWARD, &d, &info);
  if (st != FCL_SUCCESS) printf("fcl_describe_plan: %s\n", fcl_last_error());
  return info;
}

static int tuned(const fcl_plan_info *info) { return strstr(info->reason, "tuned on this device") != NULL; }

/* Forward cases at head_dim HD in f32 (the tuned pair) through context c, against the float64 reference. */
static void run_cases(test_env *env, fcl_context *c, const char *label) {
  static const fwd_case cases[] = {
      {1, 2, 0, 67, 45, HD, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1},
      {2, 4, 2, 33, 70, HD, FCL_DTYPE_F32, 1, LAYOUT_PADDED, 0, 1},
      {1, 3, 1, 129, 129, HD, FCL_DTYPE_F32, 1, LAYOUT_BNHD, 0.3f, 1},
  };
  fcl_context *saved = env->fcl;
  env->fcl = c;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_forward_case(env, env->queue, &cases[i], fcl_attention_forward, label);
  env->fcl = saved;
}

static void expect_status(fcl_status got, fcl_status want, const char *needle, const char *what) {
  const char *msg = fcl_last_error();
  check(got == want && strstr(msg, needle) != NULL, "%s: %s (want %s), message \"%s\" names %s", what,
        fcl_status_string(got), fcl_status_string(want), msg, needle);
}

static void argument_checks(test_env *env) {
  fcl_attention_desc d;
  tune_desc(&d, 1, 2, 64, HD, FCL_DTYPE_F32);
  fcl_tune_result r;
  expect_status(fcl_tune_forward(NULL, env->queue, &d, &r), FCL_ERROR_INVALID_ARGUMENT, "ctx", "ctx NULL");
  expect_status(fcl_tune_forward(env->fcl, NULL, &d, &r), FCL_ERROR_INVALID_ARGUMENT, "queue", "queue NULL");
  expect_status(fcl_tune_forward(env->fcl, env->queue, NULL, &r), FCL_ERROR_INVALID_ARGUMENT, "desc", "desc NULL");
  expect_status(fcl_tune_forward(env->fcl, env->queue, &d, NULL), FCL_ERROR_INVALID_ARGUMENT, "out", "out NULL");
  fcl_attention_desc bad = d;
  bad.head_dim = 0;
  expect_status(fcl_tune_forward(env->fcl, env->queue, &bad, &r), FCL_ERROR_INVALID_ARGUMENT, "head_dim", "head_dim 0");
  bad = d, bad.head_dim = FCL_MAX_HEAD_DIM + 1;
  expect_status(fcl_tune_forward(env->fcl, env->queue, &bad, &r), FCL_ERROR_UNSUPPORTED, "head_dim", "head_dim 257");
  bad = d, bad.dtype = (fcl_dtype)7;
  expect_status(fcl_tune_forward(env->fcl, env->queue, &bad, &r), FCL_ERROR_INVALID_ARGUMENT, "dtype", "dtype 7");
  bad = d, bad.num_kv_heads = 3;
  expect_status(fcl_tune_forward(env->fcl, env->queue, &bad, &r), FCL_ERROR_INVALID_ARGUMENT, "num_kv_heads",
                "num_kv_heads 3 of 2 heads");
  /* Buffers larger than the device allows. */
  bad = d, bad.batch = 1 << 20, bad.num_heads = 1 << 10, bad.seqlen_q = bad.seqlen_k = 1 << 20;
  expect_status(fcl_tune_forward(env->fcl, env->queue, &bad, &r), FCL_ERROR_OUT_OF_RESOURCES,
                "CL_DEVICE_MAX_MEM_ALLOC_SIZE", "scratch over the allocation limit");

  cl_int err;
  cl_command_queue plain = clCreateCommandQueue(env->context, env->device, 0, &err);
  if (err == CL_SUCCESS) {
    expect_status(fcl_tune_forward(env->fcl, plain, &d, &r), FCL_ERROR_INVALID_ARGUMENT, "CL_QUEUE_PROFILING_ENABLE",
                  "queue without profiling");
    clReleaseCommandQueue(plain);
  } else {
    check(0, "clCreateCommandQueue without profiling: %d", (int)err);
  }
  cl_context other = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
  cl_command_queue foreign = err == CL_SUCCESS
                                 ? clCreateCommandQueue(other, env->device, CL_QUEUE_PROFILING_ENABLE, &err) : NULL;
  if (foreign) {
    expect_status(fcl_tune_forward(env->fcl, foreign, &d, &r), FCL_ERROR_INVALID_ARGUMENT, "another cl_context",
                  "queue of another cl_context");
    clReleaseCommandQueue(foreign);
  }
  if (other) clReleaseContext(other);
  char *path = fcl_tune_file_path(env->fcl, HD, FCL_DTYPE_F32);
  check(path && !file_exists(path), "rejected calls record nothing (%s)", path ? path : "no path");
  free(path);
}

static int pick_shapes(test_env *env, fcl_forward_shape out[2], fcl_tile_plan *def);

/* A real tuning run on a tiny problem. */
static void real_tune(test_env *env) {
  fcl_attention_desc d;
  tune_desc(&d, 1, 2, 96, HD, FCL_DTYPE_F32);
  fcl_tune_result r;
  memset(&r, 0x5a, sizeof r);
  fcl_status st = fcl_tune_forward(env->fcl, env->queue, &d, &r);
  check(st == FCL_SUCCESS, "fcl_tune_forward d=%d f32: %s %s", HD, fcl_status_string(st), st ? fcl_last_error() : "");
  if (st) return;
  printf("  tuned: %d candidates, best %s %.4f ms, default %s %.4f ms, recorded %d, saved %d\n", r.candidates, r.shape,
         r.best_ms, r.default_shape, r.default_ms, r.recorded, r.saved);
  check(r.shape[0] && memchr(r.shape, 0, sizeof r.shape) && r.default_shape[0], "result names the shapes");
  fcl_forward_shape runnable[2];
  fcl_tile_plan def;
  if (r.candidates < 2 && pick_shapes(env, runnable, &def) != 0)
    skip("more than the default was timed: no other shape runs on this device at head_dim %d (%d timed)", HD,
         r.candidates);
  else
    check(r.candidates >= 2, "more than the default was timed (%d shapes)", r.candidates);
  check(r.best_ms > 0 && r.default_ms > 0 && r.best_ms <= r.default_ms, "best %.4f ms <= default %.4f ms, both > 0",
        r.best_ms, r.default_ms);
  check(r.recorded == (strcmp(r.shape, r.default_shape) != 0 && r.best_ms < r.default_ms * 0.98),
        "recorded exactly when the winner beats the default by 2%%");
  char *path = fcl_tune_file_path(env->fcl, HD, FCL_DTYPE_F32);
  check(r.saved == r.recorded && file_exists(path) == r.recorded, "tune file present (%d) exactly when recorded (%d)",
        file_exists(path), r.recorded);
  free(path);
  fcl_context *c = new_context(env, dir);
  if (c) {
    fcl_plan_info info = plan_of(c, HD, FCL_DTYPE_F32);
    check(tuned(&info) == r.recorded, "a new context plans the tuned shape exactly when one was recorded: %s",
          info.reason);
    fcl_context_release(c);
  }
}

/* Packed and paged descriptors are tuned as their dense sequences (before, the scratch buffers were sized from
   the packed layout's strides, a zero-byte buffer, or read past by the dense kernel with paged keys). A context
   without a disk cache, at a head_dim of its own, so nothing here reaches the other cases' records. */
static void sequence_descriptors(test_env *env) {
  fcl_context *c = new_context(env, "");
  if (!c) {
    check(0, "a context without a disk cache for the sequence descriptors");
    return;
  }
  cl_int err;
  const cl_int cu[3] = {0, 10, 24}, table[4] = {3, 0, 2, 1};
  cl_mem cu_buf = clCreateBuffer(env->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof cu, (void *)cu, &err);
  cl_mem table_buf =
      clCreateBuffer(env->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof table, (void *)table, &err);
  fcl_attention_desc d;
  fcl_tune_result r;
  tune_desc(&d, 2, 2, 24, 16, FCL_DTYPE_F32);
  d.cu_seqlens_q = d.cu_seqlens_k = cu_buf, d.total_q = d.total_k = 24;
  fcl_status st = fcl_tune_forward(c, env->queue, &d, &r);
  check(st == FCL_SUCCESS, "packed sequences (cu_seqlens_q, cu_seqlens_k) tune as dense ones: %s %s",
        fcl_status_string(st), st ? fcl_last_error() : "");
  tune_desc(&d, 1, 2, 64, 16, FCL_DTYPE_F32);
  d.seqlen_q = 1, d.block_table = table_buf, d.block_table_stride = 4, d.block_size = 16, d.num_blocks = 4;
  st = fcl_tune_forward(c, env->queue, &d, &r);
  check(st == FCL_SUCCESS, "paged keys tune as dense ones: %s %s", fcl_status_string(st), st ? fcl_last_error() : "");
  clReleaseMemObject(cu_buf);
  clReleaseMemObject(table_buf);
  fcl_context_release(c);
}

/* Shapes to force: the first two that fit, whose compiled kernel admits their work-items (rusticl's
   llvmpipe admits 32), and that differ from the rule's default and each other. */
static int pick_shapes(test_env *env, fcl_forward_shape out[2], fcl_tile_plan *def) {
  static const fcl_forward_shape pool[] = {{4, 2, 16, 32, 1, 1}, {8, 4, 8, 16, 1, 1}, {8, 16, 4, 2, 1, 0},
                                           {16, 8, 4, 4, 1, 1},  {4, 4, 8, 8, 1, 0},  {2, 2, 4, 4, 0, 0}};
  const fcl_device_caps caps = env->fcl->caps;
  const fcl_problem p = test_problem(HD, FCL_DTYPE_F32, 4096, 0);
  if (fcl_plan_forward(&caps, &no_overrides, &p, FCL_PLAN_RULE, NULL, def) != 0) return -1;
  int n = 0;
  for (size_t i = 0; i < sizeof pool / sizeof pool[0] && n < 2; ++i) {
    const fcl_forward_shape *s = &pool[i];
    fcl_tile_plan t;
    if (fcl_plan_forward_shape(&caps, HD, 0, s->tr, s->tc, s->rm, s->rn, s->pad, s->kt, &t) != 0) continue;
    if (t.br == def->br && t.bc == def->bc) continue; /* told apart from the default by its tiles */
    if (n == 1 && t.br == out[0].tr * out[0].rm && t.bc == out[0].tc * out[0].rn) continue;
    cl_kernel kernel;
    size_t wg = 0;
    pthread_mutex_lock(&env->fcl->lock);
    const fcl_status st =
        fcl_variant_kernel(env->fcl, &fcl_variants[FCL_VARIANT_PORTABLE_FORWARD], &p, &t, 0, "", &kernel, &wg);
    pthread_mutex_unlock(&env->fcl->lock);
    if (st != FCL_SUCCESS || wg < (size_t)t.wg) continue;
    out[n++] = *s;
  }
  return n == 2 ? 0 : -1;
}

static unsigned char *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *data = malloc(1 << 16);
  *size = data ? fread(data, 1, 1 << 16, f) : 0;
  fclose(f);
  return data;
}

static void spit(const char *path, const unsigned char *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(data, 1, size, f);
    fclose(f);
  }
}

/* A new context on dir plans the rule's default for (HD, f32) and computes correctly. */
static void expect_default(test_env *env, const fcl_tile_plan *def, const char *what) {
  fcl_context *c = new_context(env, dir);
  if (!c) {
    check(0, "%s: context", what);
    return;
  }
  fcl_plan_info info = plan_of(c, HD, FCL_DTYPE_F32);
  check(!tuned(&info) && info.block_q == def->br && info.block_k == def->bc,
        "%s: ignored, the default %dx%d planned (%dx%d: %s)", what, def->br, def->bc, info.block_q, info.block_k,
        info.reason);
  run_cases(env, c, what);
  fcl_context_release(c);
}

static void recorded_shapes(test_env *env) {
  fcl_forward_shape s[2];
  fcl_tile_plan def;
  if (pick_shapes(env, s, &def) != 0) {
    skip("no two shapes besides the default fit this device at head_dim %d", HD);
    return;
  }
  const int br = s[0].tr * s[0].rm, bc = s[0].tc * s[0].rn;
  int saved = 0;
  fcl_status st = fcl_tune_record(env->fcl, HD, FCL_DTYPE_F32, &s[0], 1.0, 2.0, &saved);
  char *path = fcl_tune_file_path(env->fcl, HD, FCL_DTYPE_F32);
  check(st == FCL_SUCCESS && saved && file_exists(path), "record %d,%d,%d,%d: written to %s", s[0].tr, s[0].tc, s[0].rm,
        s[0].rn, path ? path : "(none)");
  fcl_plan_info info = plan_of(env->fcl, HD, FCL_DTYPE_F32);
  check(tuned(&info) && info.block_q == br && info.block_k == bc, "the recording context plans it: %dx%d, %s",
        info.block_q, info.block_k, info.reason);

  fcl_context *c = new_context(env, dir);
  if (c) {
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(tuned(&info) && info.block_q == br && info.block_k == bc, "a new context plans it from disk: %dx%d, %s",
          info.block_q, info.block_k, info.reason);
    info = plan_of(c, OTHER_HD, FCL_DTYPE_F32);
    check(!tuned(&info), "head_dim %d keeps the rule: %s", OTHER_HD, info.reason);
    info = plan_of(c, HD, FCL_DTYPE_F16);
    check(!tuned(&info), "f16 at head_dim %d keeps the rule: %s", HD, info.reason);
    run_cases(env, c, "tuned shape");
    fcl_context_release(c);
  }
  /* Another device identity (here: another driver version) does not see the record. */
  c = new_context(env, dir);
  if (c) {
    c->caps.driver_version[0] ^= 0x20; /* a different string of the same length */
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(!tuned(&info) && info.block_q == def.br && info.block_k == def.bc,
          "a context on another driver version plans the default: %s", info.reason);
    fcl_context_release(c);
  }

  /* FLASHCL_FORWARD_SHAPE wins over the record. */
  char env_shape[64];
  snprintf(env_shape, sizeof env_shape, "%d,%d,%d,%d,%d", s[1].tr, s[1].tc, s[1].rm, s[1].rn, s[1].kt);
  setenv("FLASHCL_FORWARD_SHAPE", env_shape, 1);
  c = new_context(env, dir);
  unsetenv("FLASHCL_FORWARD_SHAPE");
  if (c) {
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(strstr(info.reason, "FLASHCL_FORWARD_SHAPE") && info.block_q == s[1].tr * s[1].rm &&
              info.block_k == s[1].tc * s[1].rn,
          "FLASHCL_FORWARD_SHAPE=%s wins over the record: %s", env_shape, info.reason);
    fcl_context_release(c);
  }

  /* Damaged records. */
  size_t size = 0;
  unsigned char *good = path ? slurp(path, &size) : NULL;
  if (!good || size <= FCL_CACHE_HEADER_SIZE) {
    check(0, "read the tune file back");
    free(good);
    free(path);
    return;
  }
  unsigned char *bad = malloc(size);
  memcpy(bad, good, size);
  bad[size - 3] ^= 0x01; /* a payload byte: the checksum no longer matches */
  spit(path, bad, size);
  expect_default(env, &def, "corrupt payload byte");
  spit(path, good, FCL_CACHE_HEADER_SIZE / 2);
  expect_default(env, &def, "truncated file");
  memcpy(bad, good, size);
  bad[20] ^= 0x80; /* the key in the header */
  spit(path, bad, size);
  expect_default(env, &def, "another key in the header");
  /* Well-formed entries (right key, valid checksum) whose payload does not fit. */
  fcl_cache_key key;
  memcpy(key.bytes, good + 16, FCL_CACHE_KEY_SIZE);
  unsigned char tag[FCL_CACHE_TAG_SIZE];
  memcpy(tag, good + 48, FCL_CACHE_TAG_SIZE);
  const char *payloads[][2] = {
      {"flashcl forward tune 1\nhead_dim 48\ndtype 0\nshape 4,4,8,8 pad 1 kt 0\n", "record for another head_dim"},
      {"flashcl forward tune 1\nhead_dim 32\ndtype 1\nshape 4,4,8,8 pad 1 kt 0\n", "record for another dtype"},
      {"flashcl forward tune 9\nhead_dim 32\ndtype 0\nshape 4,4,8,8 pad 1 kt 0\n", "record of another format"},
      {"flashcl forward tune 1\nhead_dim 32\ndtype 0\nshape 255,255,1,1 pad 1 kt 0\n", "record that does not fit"},
      {"flashcl forward tune 1\nhead_dim 32\ndtype 0\nshape 0,4,8,8 pad 1 kt 0\n", "record with a zero size"},
      {"garbage", "record of garbage"}};
  for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; ++i) {
    check(fcl_cache_write_entry(dir, &key, tag, FCL_TUNE_ENTRY_NAME, "", payloads[i][0], strlen(payloads[i][0])) == 0, "write %s",
          payloads[i][1]);
    expect_default(env, &def, payloads[i][1]);
  }
  /* The good file again, then a record of "the default": the file goes. */
  spit(path, good, size);
  c = new_context(env, dir);
  if (c) {
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(tuned(&info), "the restored file is planned again: %s", info.reason);
    st = fcl_tune_record(c, HD, FCL_DTYPE_F32, NULL, 1.0, 1.0, &saved);
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(st == FCL_SUCCESS && !file_exists(path) && !tuned(&info), "recording the default removes the file: %s",
          info.reason);
    fcl_context_release(c);
  }
  expect_default(env, &def, "after the default was recorded");
  free(bad);
  free(good);
  free(path);

  /* No disk cache: the record stays in its context. */
  c = new_context(env, "");
  if (c) {
    char *none = fcl_tune_file_path(c, HD, FCL_DTYPE_F32);
    st = fcl_tune_record(c, HD, FCL_DTYPE_F32, &s[0], 1.0, 2.0, &saved);
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(st == FCL_SUCCESS && !saved && !none && tuned(&info) && info.block_q == br,
          "without a disk cache the context keeps the record: %s", info.reason);
    run_cases(env, c, "tuned, no disk cache");
    fcl_context_release(c);
    c = new_context(env, "");
    info = plan_of(c, HD, FCL_DTYPE_F32);
    check(!tuned(&info), "and a new context without disk cache does not see it: %s", info.reason);
    fcl_context_release(c);
  }
  check(fcl_tune_record(env->fcl, 0, FCL_DTYPE_F32, &s[0], 1, 2, NULL) == FCL_ERROR_INVALID_ARGUMENT,
        "fcl_tune_record rejects head_dim 0");
  fcl_forward_shape zero = s[0];
  zero.rm = 0;
  check(fcl_tune_record(env->fcl, HD, FCL_DTYPE_F32, &zero, 1, 2, NULL) == FCL_ERROR_INVALID_ARGUMENT,
        "fcl_tune_record rejects a zero-sized shape");
}

/* Tuning on one thread while this one runs forward calls on the same context. */
typedef struct tune_job {
  test_env *env;
  cl_command_queue queue;
  fcl_status st;
  char error[512];
} tune_job;

static void *tune_thread(void *arg) {
  tune_job *job = arg;
  fcl_attention_desc d;
  tune_desc(&d, 1, 2, 80, HD, FCL_DTYPE_F32);
  fcl_tune_result r;
  job->st = fcl_tune_forward(job->env->fcl, job->queue, &d, &r);
  snprintf(job->error, sizeof job->error, "%s", job->st ? fcl_last_error() : "");
  return NULL;
}

static void concurrent(test_env *env) {
  cl_int err;
  tune_job job = {env, clCreateCommandQueue(env->context, env->device, CL_QUEUE_PROFILING_ENABLE, &err), FCL_SUCCESS, ""};
  pthread_t th;
  if (err != CL_SUCCESS || pthread_create(&th, NULL, tune_thread, &job) != 0) {
    check(0, "start the tuning thread");
    if (job.queue) clReleaseCommandQueue(job.queue);
    return;
  }
  run_cases(env, env->fcl, "forward while tuning");
  pthread_join(th, NULL);
  check(job.st == FCL_SUCCESS, "tuning on another thread: %s %s", fcl_status_string(job.st), job.error);
  clReleaseCommandQueue(job.queue);
  run_cases(env, env->fcl, "after concurrent tuning");
}

int main(void) {
  test_seed();
  clear_dir();
  fcl_context_options o = {0};
  o.cache_dir = dir, o.flags = FCL_FLAG_PORTABLE_ONLY; /* as new_context's */
  test_env env;
  if (test_open(&env, &o) != 0) return 1;
  argument_checks(&env);
  real_tune(&env);
  sequence_descriptors(&env);
  recorded_shapes(&env);
  concurrent(&env);
  test_close(&env);
  return test_summary("tune");
}
