#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

int test_passed, test_failed, test_skipped;
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

void skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&report_lock);
  printf("skip ");
  vprintf(fmt, ap);
  printf("\n");
  ++test_skipped;
  pthread_mutex_unlock(&report_lock);
  va_end(ap);
}

void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&report_lock);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  if (ok) ++test_passed; else ++test_failed;
  pthread_mutex_unlock(&report_lock);
}

int test_summary(const char *suite) {
  printf("%s: %d passed, %d failed, %d skipped\n", suite, test_passed, test_failed, test_skipped);
  return test_failed ? 1 : 0;
}

/* ---- device ---- */

static int pick_device(cl_platform_id *platform, cl_device_id *device) {
  cl_platform_id platforms[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS || np == 0) {
    fprintf(stderr, "no OpenCL platform found\n");
    return -1;
  }
  const char *want = getenv("FLASHCL_TEST_DEVICE");
  int index = 0, fallback = -1, chosen = -1;
  cl_platform_id plats[64];
  cl_device_id devs[64];
  for (cl_uint p = 0; p < np && np <= 16; ++p) {
    cl_device_id list[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, list, &nd) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < nd && index < 64; ++d, ++index) {
      plats[index] = platforms[p];
      devs[index] = list[d];
      char name[256] = "";
      clGetDeviceInfo(list[d], CL_DEVICE_NAME, sizeof name, name, NULL);
      cl_device_type type = 0;
      clGetDeviceInfo(list[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      if (want && *want) {
        char *end;
        long n = strtol(want, &end, 10);
        if ((*end == '\0' && n == index) || (*end != '\0' && strstr(name, want))) {
          if (chosen < 0) chosen = index;
        }
      } else if ((type & CL_DEVICE_TYPE_GPU) && chosen < 0) {
        chosen = index;
      }
      if (fallback < 0) fallback = index;
    }
  }
  if (chosen < 0 && !(want && *want)) chosen = fallback;
  if (chosen < 0) {
    fprintf(stderr, "no OpenCL device matches FLASHCL_TEST_DEVICE=%s\n", want ? want : "");
    return -1;
  }
  *platform = plats[chosen];
  *device = devs[chosen];
  return 0;
}

int test_open(test_env *env, const fcl_context_options *options) {
  memset(env, 0, sizeof *env);
  if (pick_device(&env->platform, &env->device)) return -1;
  clGetDeviceInfo(env->device, CL_DEVICE_NAME, sizeof env->device_name, env->device_name, NULL);
  char ext[8192] = "";
  clGetDeviceInfo(env->device, CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
  env->has_fp64 = strstr(ext, "cl_khr_fp64") != NULL;
  cl_int err;
  env->context = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "clCreateContext failed: %d\n", err);
    return -1;
  }
  env->queue = clCreateCommandQueue(env->context, env->device, CL_QUEUE_PROFILING_ENABLE, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "clCreateCommandQueue failed: %d\n", err);
    return -1;
  }
  fcl_status st = fcl_context_create(env->context, env->device, options, &env->fcl);
  if (st != FCL_SUCCESS) {
    fprintf(stderr, "fcl_context_create: %s: %s\n", fcl_status_string(st), fcl_last_error());
    return -1;
  }
  printf("device: %s\n", env->device_name);
  return 0;
}

fcl_context *test_context_unsplit(test_env *env) {
  const char *was = getenv("FLASHCL_FORWARD_SPLITS");
  char saved[32] = "";
  if (was) snprintf(saved, sizeof saved, "%s", was);
  setenv("FLASHCL_FORWARD_SPLITS", "1", 1);
  fcl_context *ctx = NULL;
  if (fcl_context_create(env->context, env->device, NULL, &ctx) != FCL_SUCCESS) ctx = NULL;
  if (was) setenv("FLASHCL_FORWARD_SPLITS", saved, 1);
  else unsetenv("FLASHCL_FORWARD_SPLITS");
  return ctx;
}

void test_close(test_env *env) {
  fcl_context_release(env->fcl);
  if (env->queue) clReleaseCommandQueue(env->queue);
  if (env->context) clReleaseContext(env->context);
  memset(env, 0, sizeof *env);
}

/* ---- random ---- */

/* Each thread draws its own stream: seed, then the order in which threads first draw. */
static _Thread_local uint64_t rng_state;
static unsigned long long seed_value;
static unsigned long long streams;
static pthread_mutex_t seed_lock = PTHREAD_MUTEX_INITIALIZER;

void test_seed(void) {
  const char *s = getenv("FLASHCL_TEST_SEED");
  seed_value = s && *s ? strtoull(s, NULL, 10) : (unsigned long long)time(NULL) ^ ((unsigned long long)clock() << 20);
  printf("seed: %llu (set FLASHCL_TEST_SEED to repeat)\n", seed_value);
}

unsigned long long test_seed_value(void) { return seed_value; }

void test_reseed(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const char *c = name; *c; ++c) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
  rng_state = (seed_value ^ h) * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  if (!rng_state) rng_state = 1;
}

double test_uniform(void) {
  if (!rng_state) {
    pthread_mutex_lock(&seed_lock);
    rng_state = (seed_value + streams++) * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    pthread_mutex_unlock(&seed_lock);
    if (!rng_state) rng_state = 1;
  }
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* ---- dtypes ---- */

size_t dtype_size(fcl_dtype t) { return t == FCL_DTYPE_F32 ? 4 : 2; }
const char *dtype_name(fcl_dtype t) { return t == FCL_DTYPE_F32 ? "f32" : t == FCL_DTYPE_F16 ? "f16" : "bf16"; }

static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (absx < 0x38800000u) { /* subnormal half */
    float af;
    memcpy(&af, &absx, 4);
    /* value / 2^-24, rounded to nearest even */
    double scaled = (double)af * 16777216.0;
    double r = nearbyint(scaled);
    return (uint16_t)(sign | (uint32_t)r);
  }
  uint32_t mant = absx & 0x7fffffu;
  int32_t exp = (int32_t)(absx >> 23) - 127 + 15;
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = (float)mant * (1.0f / 16777216.0f);
    uint32_t x;
    memcpy(&x, &f, 4);
    x |= sign;
    memcpy(&f, &x, 4);
    return f;
  }
  uint32_t x = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

void encode_dtype(float x, fcl_dtype t, void *dst) {
  if (t == FCL_DTYPE_F32) {
    memcpy(dst, &x, 4);
  } else {
    uint16_t h = t == FCL_DTYPE_F16 ? float_to_half(x) : float_to_bf16(x);
    memcpy(dst, &h, 2);
  }
}

float decode_dtype(const void *src, fcl_dtype t) {
  if (t == FCL_DTYPE_F32) {
    float f;
    memcpy(&f, src, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, src, 2);
  return t == FCL_DTYPE_F16 ? half_to_float(h) : bf16_to_float(h);
}

float round_to_dtype(float x, fcl_dtype t) {
  unsigned char tmp[4];
  encode_dtype(x, t, tmp);
  return decode_dtype(tmp, t);
}

/* ---- layouts and tensors ---- */

size_t layout_strides(int layout, long long b, long long h, long long n, long long d, long long stride[3],
                      long long *offset) {
  *offset = 0;
  if (layout == LAYOUT_BNHD) {
    stride[2] = h * d;
    stride[1] = d;
    stride[0] = n * h * d;
  } else if (layout == LAYOUT_PADDED) {
    /* Every dimension padded and a leading offset, so stride or offset mistakes read the gaps. */
    stride[2] = d + 3;
    stride[1] = n * stride[2] + 5;
    stride[0] = h * stride[1] + 7;
    *offset = 11;
  } else {
    stride[2] = d;
    stride[1] = n * d;
    stride[0] = h * n * d;
  }
  return (size_t)(*offset + (b - 1) * stride[0] + (h - 1) * stride[1] + (n - 1) * stride[2] + d);
}

static size_t host_index(const test_tensor *t, long long bi, long long hi, long long ni) {
  return (size_t)(t->offset + bi * t->stride[0] + hi * t->stride[1] + ni * t->stride[2]);
}

static int upload(test_env *env, test_tensor *t, int poison_only) {
  const size_t es = dtype_size(t->dtype);
  unsigned char *raw = malloc(t->elems * es);
  if (!raw) return -1;
  const float nan = NAN;
  for (size_t i = 0; i < t->elems; ++i) encode_dtype(nan, t->dtype, raw + i * es);
  if (!poison_only) {
    size_t li = 0;
    for (long long bi = 0; bi < t->b; ++bi)
      for (long long hi = 0; hi < t->h; ++hi)
        for (long long ni = 0; ni < t->n; ++ni)
          for (long long di = 0; di < t->d; ++di, ++li)
            encode_dtype(t->host[li], t->dtype, raw + (host_index(t, bi, hi, ni) + (size_t)di) * es);
  }
  cl_int err = clEnqueueWriteBuffer(env->queue, t->buf, CL_TRUE, 0, t->elems * es, raw, 0, NULL, NULL);
  free(raw);
  return err == CL_SUCCESS ? 0 : -1;
}

int tensor_create(test_env *env, test_tensor *t, long long b, long long h, long long n, long long d, int layout,
                  fcl_dtype dtype, int fill_random) {
  memset(t, 0, sizeof *t);
  t->b = b, t->h = h, t->n = n, t->d = d, t->dtype = dtype;
  t->elems = layout_strides(layout, b, h, n, d, t->stride, &t->offset);
  const size_t logical = (size_t)(b * h * n * d);
  t->host = malloc(logical * sizeof(float));
  cl_int err;
  t->buf = clCreateBuffer(env->context, CL_MEM_READ_WRITE, t->elems * dtype_size(dtype), NULL, &err);
  if (!t->host || err != CL_SUCCESS) return -1;
  for (size_t i = 0; i < logical; ++i) t->host[i] = fill_random ? round_to_dtype((float)test_uniform(), dtype) : NAN;
  return upload(env, t, !fill_random);
}

int tensor_poison(test_env *env, test_tensor *t) { return upload(env, t, 1); }

int tensor_upload(test_env *env, test_tensor *t) { return upload(env, t, 0); }

int tensor_read(test_env *env, test_tensor *t) {
  const size_t es = dtype_size(t->dtype);
  unsigned char *raw = malloc(t->elems * es);
  if (!raw) return -1;
  cl_int err = clEnqueueReadBuffer(env->queue, t->buf, CL_TRUE, 0, t->elems * es, raw, 0, NULL, NULL);
  size_t li = 0;
  for (long long bi = 0; bi < t->b; ++bi)
    for (long long hi = 0; hi < t->h; ++hi)
      for (long long ni = 0; ni < t->n; ++ni)
        for (long long di = 0; di < t->d; ++di, ++li)
          t->host[li] = decode_dtype(raw + (host_index(t, bi, hi, ni) + (size_t)di) * es, t->dtype);
  free(raw);
  return err == CL_SUCCESS ? 0 : -1;
}

int tensor_gaps_untouched(test_env *env, const test_tensor *t) {
  const size_t es = dtype_size(t->dtype);
  unsigned char *raw = malloc(t->elems * es);
  char *logical = calloc(t->elems, 1);
  int ok = raw && logical &&
           clEnqueueReadBuffer(env->queue, t->buf, CL_TRUE, 0, t->elems * es, raw, 0, NULL, NULL) == CL_SUCCESS;
  for (long long bi = 0; ok && bi < t->b; ++bi)
    for (long long hi = 0; hi < t->h; ++hi)
      for (long long ni = 0; ni < t->n; ++ni)
        memset(logical + host_index(t, bi, hi, ni), 1, (size_t)t->d);
  for (size_t i = 0; ok && i < t->elems; ++i)
    if (!logical[i] && !isnan(decode_dtype(raw + i * es, t->dtype))) ok = 0;
  free(raw);
  free(logical);
  return ok;
}

void tensor_release(test_tensor *t) {
  if (t->buf) clReleaseMemObject(t->buf);
  free(t->host);
  memset(t, 0, sizeof *t);
}

void tensor_to_desc(const test_tensor *t, int64_t stride[3], int64_t *offset) {
  for (int i = 0; i < 3; ++i) stride[i] = t->stride[i];
  *offset = t->offset;
}

/* ---- comparison ---- */

double *to_double(const float *x, size_t n) {
  double *y = malloc((n ? n : 1) * sizeof(double));
  for (size_t i = 0; y && i < n; ++i) y[i] = x[i];
  return y;
}

double rel_error(const float *out, const double *ref, size_t n, double *max_abs) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isinf(ref[i]) && out[i] == ref[i]) continue;
    double e = (double)out[i] - ref[i];
    if (isnan(e) || isinf(e)) {
      if (max_abs) *max_abs = INFINITY;
      return INFINITY;
    }
    num += e * e;
    if (!isinf(ref[i])) den += ref[i] * ref[i];
    if (fabs(e) > mx) mx = fabs(e);
  }
  if (max_abs) *max_abs = mx;
  return sqrt(num) / (den > 1e-60 ? sqrt(den) : 1e-30);
}

cl_mem create_float_buffer(test_env *env, size_t count, float fill) {
  cl_int err;
  cl_mem buf = clCreateBuffer(env->context, CL_MEM_READ_WRITE, count * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS) return NULL;
  float *tmp = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) tmp[i] = fill;
  err = clEnqueueWriteBuffer(env->queue, buf, CL_TRUE, 0, count * sizeof(float), tmp, 0, NULL, NULL);
  free(tmp);
  if (err != CL_SUCCESS) {
    clReleaseMemObject(buf);
    return NULL;
  }
  return buf;
}

int read_floats(test_env *env, cl_mem buf, float *dst, size_t count) {
  return clEnqueueReadBuffer(env->queue, buf, CL_TRUE, 0, count * sizeof(float), dst, 0, NULL, NULL) == CL_SUCCESS
             ? 0
             : -1;
}
