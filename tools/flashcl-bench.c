/* flashcl-bench: times fcl_attention_forward ("flash"), the CLBlast reference path ("reference") and
 * fcl_attention_backward ("backward") on one OpenCL device, over a list of sequence lengths or a sweep
 * that doubles N until the reference path runs out of memory and goes on with the others.
 *
 * Timing: each run is enqueued behind a gate command (a 4-byte fill) that waits on a user event; the user
 * event is released once the whole call is enqueued, so host-side enqueue cost is excluded and the device
 * runs the call's commands back to back. A run's time is the profiling END of its last command minus the
 * END of the gate (all of a multi-command call, gaps between its commands included); a flash forward of
 * one kernel (not split) is timed by its own START and END. Where the device reports no usable profiling
 * times (zero, an end not after the start, more than the wall clock, or under a thousandth of it: rusticl
 * on llvmpipe counts 0, 1, 2, 3 ns per command) the host's wall clock from the release to completion is
 * used (shown as timer "wall"). After --warmup untimed runs,
 * --iters runs give the median, min and max.
 *
 * FLOP counts (the usual convention, so rows compare by time): forward 4*B*H*Nq*Nk*d, backward
 * 10*B*H*Nq*Nk*d, halved when causal. Extra memory: device memory a call uses beyond its inputs and
 * outputs: the split-KV partials for the flash forward (0 unless it splits), the score matrix and float32
 * copies for the reference path, the workspace for the backward.
 */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IMPL_FLASH, IMPL_REFERENCE, IMPL_BACKWARD, IMPL_COUNT };
static const char *const impl_names[IMPL_COUNT] = {"flash", "reference", "backward"};

typedef struct options {
  const char *device;
  fcl_dtype dtype;
  long long batch, heads, kv_heads, head_dim;
  long long seqlens[64];
  int num_seqlens;
  int sweep;
  long long max_seqlen;
  int causal;
  int window;             /* --window L,R */
  long long seqlen_q;     /* --seqlen-q: fixed query rows (decode); 0: Nq = Nk */
  long long window_left, window_right;
  int impl[IMPL_COUNT];
  int iters, warmup;
  int json;
  int bnhd;               /* --layout bnhd: q, k, v and o as [batch, seq, heads, d] */
  long long flush_mib;    /* --flush: MiB written before each run, so its inputs do not start in the cache */
  long long paged;        /* --paged BS: K and V in a pool of blocks of BS rows, in shuffled order; 0 dense */
  double max_diff; /* > 0: exit status 1 when max |O_flash - O_reference| exceeds it */
} options;

typedef struct bench {
  options opt;
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  fcl_context *fcl;
  char device_name[256], driver[128], platform_name[128];
  cl_ulong max_alloc;
  cl_mem gate_buf; /* 4 bytes the gate command fills */
  cl_mem flush_buf; /* --flush MiB, filled before each run's gate (NULL: none) */
} bench;

/* One (impl, N) measurement. */
typedef struct result {
  int ok;
  char status[32];   /* "ok", "unsupported", "out of memory", "error" */
  char message[512];
  double median_ms, min_ms, max_ms, tflops;
  double kv_gbps; /* bytes of K and V in the inputs per median time, GB/s */
  size_t extra_bytes;
  char kernel[64]; /* flash: the forward's variant and split-KV chunks (fcl_describe_plan) */
  int splits;
  const char *timer;
  double max_diff; /* reference rows: max |O_flash - O_reference| when both ran; < 0: not compared */
} result;

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-bench [options]\n"
          "  --device N|NAME     device index (as listed by clinfo -l, counted over all platforms) or a\n"
          "                      substring of its name; default: the first GPU, else the first device\n"
          "  --dtype f32|f16|bf16           (default f32)\n"
          "  --batch B --heads H --kv-heads HKV --head-dim D   (defaults 4, 16, =H, 64)\n"
          "  --seqlen N[,N...]   sequence lengths, Nq = Nk (default 512,1024,2048,4096)\n"
          "  --sweep             N = 512, 1024, ... up to --max-seqlen (default 131072); the reference path\n"
          "                      stops at its first failure (out of memory), the others go on\n"
          "  --seqlen-q Q        Q query rows against each --seqlen N keys (decode: 1; default Q = N);\n"
          "                      the table then also gives the K and V bytes read per second\n"
          "  --layout bhnd|bnhd  q, k, v, o as [batch, heads, seq, d] (default) or [batch, seq, heads, d]\n"
          "  --paged BS          k and v in a paged pool [blocks, BS, kv heads, d] (vLLM's order) with a\n"
          "                      block table in shuffled order (the flash forward only)\n"
          "  --flush MIB         fill a MIB-MiB buffer before each run (outside its time), so that its inputs\n"
          "                      are not read from the cache a previous run left them in (default 0)\n"
          "  --causal            causal mask\n"
          "  --window L,R        sliding window: key j visible from query i iff i - L <= j <= i + R (-1:\n"
          "                      unbounded); TFLOP/s then count the visible scores only\n"
          "  --impl LIST         any of flash,reference,backward (default flash,reference)\n"
          "  --iters N           timed runs, at least 10 (default 20)\n"
          "  --warmup N          untimed runs first (default 3)\n"
          "  --json              one JSON object per line instead of the table\n"
          "  --max-diff TOL      exit status 1 when max |O_flash - O_reference| of a row exceeds TOL\n"
          "Progress goes to stderr.\n");
}

static int parse_ll(const char *s, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->dtype = FCL_DTYPE_F32;
  o->batch = 4, o->heads = 16, o->kv_heads = 0, o->head_dim = 64;
  o->max_seqlen = 131072;
  o->iters = 20, o->warmup = 3;
  o->impl[IMPL_FLASH] = o->impl[IMPL_REFERENCE] = 1;
  const long long defaults[] = {512, 1024, 2048, 4096};
  for (int i = 0; i < 4; ++i) o->seqlens[i] = defaults[i];
  o->num_seqlens = 4;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                               \
  do {                                                             \
    if (!val) {                                                    \
      fprintf(stderr, "flashcl-bench: %s needs a value\n", a);     \
      return -1;                                                   \
    }                                                              \
    ++i;                                                           \
  } while (0)
#define NUMBER(field, min)                                                      \
  do {                                                                          \
    NEED_VALUE();                                                               \
    long long v_;                                                               \
    if (parse_ll(val, &v_) || v_ < (min)) {                                     \
      fprintf(stderr, "flashcl-bench: %s %s: expected an integer >= %lld\n", a, val, (long long)(min)); \
      return -1;                                                                \
    }                                                                           \
    field = v_;                                                                 \
  } while (0)
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--device")) {
      NEED_VALUE();
      o->device = val;
    } else if (!strcmp(a, "--dtype")) {
      NEED_VALUE();
      if (!strcmp(val, "f32")) o->dtype = FCL_DTYPE_F32;
      else if (!strcmp(val, "f16")) o->dtype = FCL_DTYPE_F16;
      else if (!strcmp(val, "bf16")) o->dtype = FCL_DTYPE_BF16;
      else {
        fprintf(stderr, "flashcl-bench: --dtype %s: expected f32, f16 or bf16\n", val);
        return -1;
      }
    } else if (!strcmp(a, "--batch")) NUMBER(o->batch, 1);
    else if (!strcmp(a, "--heads")) NUMBER(o->heads, 1);
    else if (!strcmp(a, "--kv-heads")) NUMBER(o->kv_heads, 0);
    else if (!strcmp(a, "--head-dim")) NUMBER(o->head_dim, 1);
    else if (!strcmp(a, "--max-seqlen")) NUMBER(o->max_seqlen, 1);
    else if (!strcmp(a, "--seqlen-q")) NUMBER(o->seqlen_q, 1);
    else if (!strcmp(a, "--iters")) NUMBER(o->iters, 10);
    else if (!strcmp(a, "--warmup")) NUMBER(o->warmup, 0);
    else if (!strcmp(a, "--flush")) NUMBER(o->flush_mib, 0);
    else if (!strcmp(a, "--paged")) NUMBER(o->paged, 1);
    else if (!strcmp(a, "--causal")) o->causal = 1;
    else if (!strcmp(a, "--layout")) {
      NEED_VALUE();
      if (strcmp(val, "bhnd") && strcmp(val, "bnhd")) {
        fprintf(stderr, "flashcl-bench: --layout %s: expected bhnd or bnhd\n", val);
        return -1;
      }
      o->bnhd = !strcmp(val, "bnhd");
    }
    else if (!strcmp(a, "--window")) {
      NEED_VALUE();
      if (sscanf(val, "%lld,%lld", &o->window_left, &o->window_right) != 2 || o->window_left < -1 ||
          o->window_right < -1) {
        fprintf(stderr, "flashcl-bench: --window %s: expected L,R with each -1 or >= 0\n", val);
        return -1;
      }
      o->window = 1;
    }
    else if (!strcmp(a, "--sweep")) o->sweep = 1;
    else if (!strcmp(a, "--json")) o->json = 1;
    else if (!strcmp(a, "--max-diff")) {
      NEED_VALUE();
      char *end;
      o->max_diff = strtod(val, &end);
      if (end == val || *end || !(o->max_diff > 0)) {
        fprintf(stderr, "flashcl-bench: --max-diff %s: expected a positive number\n", val);
        return -1;
      }
    }
    else if (!strcmp(a, "--seqlen")) {
      NEED_VALUE();
      char *copy = strdup(val);
      o->num_seqlens = 0;
      for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        long long v;
        if (parse_ll(tok, &v) || v < 1 || o->num_seqlens == 64) {
          fprintf(stderr, "flashcl-bench: --seqlen %s: expected up to 64 comma-separated integers >= 1\n", val);
          free(copy);
          return -1;
        }
        o->seqlens[o->num_seqlens++] = v;
      }
      free(copy);
      if (!o->num_seqlens) {
        fprintf(stderr, "flashcl-bench: --seqlen needs at least one length\n");
        return -1;
      }
    } else if (!strcmp(a, "--impl")) {
      NEED_VALUE();
      memset(o->impl, 0, sizeof o->impl);
      char *copy = strdup(val);
      for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int k = 0; k < IMPL_COUNT; ++k)
          if (!strcmp(tok, impl_names[k])) o->impl[k] = found = 1;
        if (!found) {
          fprintf(stderr, "flashcl-bench: --impl %s: unknown implementation %s (flash, reference, backward)\n", val, tok);
          free(copy);
          return -1;
        }
      }
      free(copy);
    } else {
      fprintf(stderr, "flashcl-bench: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
#undef NUMBER
#undef NEED_VALUE
  }
  if (o->kv_heads && o->heads % o->kv_heads) {
    fprintf(stderr, "flashcl-bench: --kv-heads %lld does not divide --heads %lld\n", o->kv_heads, o->heads);
    return -1;
  }
  if (o->sweep) {
    o->num_seqlens = 0;
    for (long long n = 512; n <= o->max_seqlen && o->num_seqlens < 64; n *= 2) o->seqlens[o->num_seqlens++] = n;
  }
  return 0;
}

/* ---- device ---- */

static int contains_nocase(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; ++hay) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) ++i;
    if (i == n) return 1;
  }
  return n == 0;
}

static int open_device(bench *b) {
  cl_uint np = 0;
  if (clGetPlatformIDs(0, NULL, &np) != CL_SUCCESS || np == 0) {
    fprintf(stderr, "flashcl-bench: no OpenCL platform\n");
    return -1;
  }
  cl_platform_id plats[16];
  if (np > 16) np = 16;
  clGetPlatformIDs(np, plats, NULL);
  long long want_index = -1;
  if (b->opt.device && parse_ll(b->opt.device, &want_index)) want_index = -1;
  int index = 0, chosen = 0, first_any = 0;
  for (cl_uint p = 0; p < np && !chosen; ++p) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || !nd) continue;
    cl_device_id devs[64];
    if (nd > 64) nd = 64;
    clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL);
    for (cl_uint d = 0; d < nd && !chosen; ++d, ++index) {
      char name[256] = "";
      cl_device_type type = 0;
      clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof name, name, NULL);
      clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      int take;
      if (!b->opt.device) take = (type & CL_DEVICE_TYPE_GPU) != 0;
      else if (want_index >= 0) take = index == want_index;
      else take = contains_nocase(name, b->opt.device);
      if (!take && !b->opt.device && !first_any) {
        b->platform = plats[p], b->device = devs[d];
        first_any = 1;
      }
      if (take) b->platform = plats[p], b->device = devs[d], chosen = 1;
    }
  }
  if (!chosen && (b->opt.device || !first_any)) {
    fprintf(stderr, "flashcl-bench: no device matches %s\n", b->opt.device ? b->opt.device : "(any)");
    return -1;
  }
  clGetDeviceInfo(b->device, CL_DEVICE_NAME, sizeof b->device_name, b->device_name, NULL);
  clGetDeviceInfo(b->device, CL_DRIVER_VERSION, sizeof b->driver, b->driver, NULL);
  clGetDeviceInfo(b->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof b->max_alloc, &b->max_alloc, NULL);
  clGetPlatformInfo(b->platform, CL_PLATFORM_NAME, sizeof b->platform_name, b->platform_name, NULL);
  cl_int err;
  b->context = clCreateContext(NULL, 1, &b->device, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: clCreateContext failed (%d)\n", (int)err);
    return -1;
  }
  b->queue = clCreateCommandQueue(b->context, b->device, CL_QUEUE_PROFILING_ENABLE, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: clCreateCommandQueue failed (%d)\n", (int)err);
    return -1;
  }
  b->gate_buf = clCreateBuffer(b->context, CL_MEM_READ_WRITE, 4, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: clCreateBuffer failed (%d)\n", (int)err);
    return -1;
  }
  if (b->opt.flush_mib > 0) {
    b->flush_buf = clCreateBuffer(b->context, CL_MEM_READ_WRITE, (size_t)b->opt.flush_mib << 20, NULL, &err);
    if (err != CL_SUCCESS) {
      fprintf(stderr, "flashcl-bench: clCreateBuffer of --flush %lld MiB failed (%d)\n", b->opt.flush_mib, (int)err);
      return -1;
    }
  }
  fcl_status st = fcl_context_create(b->context, b->device, NULL, &b->fcl);
  if (st) {
    fprintf(stderr, "flashcl-bench: fcl_context_create: %s: %s\n", fcl_status_string(st), fcl_last_error());
    return -1;
  }
  return 0;
}

/* ---- random inputs in the storage type ---- */

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static float rand_uniform(void) { /* [-1, 1), never exactly zero in bulk */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal or zero */
    if (e < -10) return (uint16_t)sign;
    m |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (m >> 13);
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 0x400u), (int)e - 25);
  uint32_t bits;
  memcpy(&bits, &v, 4);
  bits |= sign;
  memcpy(&v, &bits, 4);
  return v;
}

static size_t elem_size(fcl_dtype t) { return t == FCL_DTYPE_F32 ? 4 : 2; }

static float decode(const unsigned char *p, fcl_dtype t) {
  if (t == FCL_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  if (t == FCL_DTYPE_F16) return half_to_float(h);
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* A buffer of `count` elements; random contents when random, else NaN. NULL with *err set on failure. */
static cl_mem make_buffer(bench *b, size_t count, fcl_dtype t, int random, cl_int *err) {
  const size_t es = elem_size(t), bytes = count * es;
  if (bytes > b->max_alloc) {
    *err = CL_INVALID_BUFFER_SIZE;
    return NULL;
  }
  unsigned char *host = malloc(bytes);
  if (!host) {
    *err = CL_OUT_OF_HOST_MEMORY;
    return NULL;
  }
  for (size_t i = 0; i < count; ++i) {
    const float x = random ? rand_uniform() : NAN;
    if (t == FCL_DTYPE_F32) memcpy(host + 4 * i, &x, 4);
    else {
      const uint16_t h = t == FCL_DTYPE_F16 ? float_to_half(x) : float_to_bf16(x);
      memcpy(host + 2 * i, &h, 2);
    }
  }
  cl_mem buf = clCreateBuffer(b->context, CL_MEM_READ_WRITE, bytes, NULL, err);
  if (*err == CL_SUCCESS) {
    *err = clEnqueueWriteBuffer(b->queue, buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
    if (*err != CL_SUCCESS) {
      clReleaseMemObject(buf);
      buf = NULL;
    }
  } else {
    buf = NULL;
  }
  free(host);
  return buf;
}

/* ---- one timed call ---- */

typedef struct tensors {
  cl_mem q, k, v, o, o_ref, lse, d_o, dq, dk, dv, workspace, table;
  int splits; /* the flash forward's split-KV chunks (fcl_describe_plan) */
} tensors;

static fcl_status call_impl(bench *b, int impl, const fcl_attention_desc *desc, const tensors *t, cl_event *ev) {
  switch (impl) {
    case IMPL_FLASH:
      return fcl_attention_forward(b->fcl, b->queue, desc, t->q, t->k, t->v, t->o, t->lse, 0, NULL, ev);
    case IMPL_REFERENCE:
      return fcl_attention_reference(b->fcl, b->queue, desc, t->q, t->k, t->v, t->o_ref, t->lse, 0, NULL, ev);
    default:
      return fcl_attention_backward(b->fcl, b->queue, desc, t->q, t->k, t->v, t->o, t->lse, t->d_o, t->dq, t->dk,
                                    t->dv, t->workspace, 0, NULL, ev);
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Runs the call once behind a gate; *ms its time. Returns the call's status (FCL_ERROR_OPENCL with a
   message for failures of the timing itself). */
static fcl_status timed_call(bench *b, int impl, const fcl_attention_desc *desc, const tensors *t, double *ms,
                             int *used_wall) {
  cl_int err;
  cl_event gate = clCreateUserEvent(b->context, &err);
  if (err != CL_SUCCESS) return FCL_ERROR_OPENCL;
  cl_event marker = NULL, ev = NULL;
  /* The gate command: a 4-byte fill (a real command, so drivers that give markers no time still time it). */
  const cl_uint zero = 0;
  if (b->flush_buf) { /* before the gate, so outside the run's time */
    const cl_uint junk = 0x3c003c00u;
    err = clEnqueueFillBuffer(b->queue, b->flush_buf, &junk, sizeof junk, 0, (size_t)b->opt.flush_mib << 20, 0, NULL,
                              NULL);
    if (err != CL_SUCCESS) {
      clReleaseEvent(gate);
      return FCL_ERROR_OPENCL;
    }
  }
  err = clEnqueueFillBuffer(b->queue, b->gate_buf, &zero, sizeof zero, 0, sizeof zero, 1, &gate, &marker);
  if (err != CL_SUCCESS) {
    clSetUserEventStatus(gate, CL_COMPLETE);
    clReleaseEvent(gate);
    return FCL_ERROR_OPENCL;
  }
  fcl_status st = call_impl(b, impl, desc, t, &ev);
  const double t0 = now_ms();
  clSetUserEventStatus(gate, CL_COMPLETE);
  if (st == FCL_SUCCESS) {
    clWaitForEvents(1, &ev);
    const double wall = now_ms() - t0;
    cl_ulong start = 0, end = 0;
    /* A flash forward of one kernel: its own start and end are the exact device time. A multi-command call
       (split-KV, backward, reference) is measured from the end of the gate's fill (where that has no usable
       time, the wall clock is used). */
    const int one_kernel = impl == IMPL_FLASH && t->splits <= 1;
    int ok = clGetEventProfilingInfo(one_kernel ? ev : marker,
                                     one_kernel ? CL_PROFILING_COMMAND_START : CL_PROFILING_COMMAND_END,
                                     sizeof start, &start, NULL) == CL_SUCCESS &&
             clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS &&
             start > 0 && end > start;
    const double dev = ok ? (double)(end - start) / 1e6 : 0;
    /* Profiling times that exceed the wall clock by far, or fall under a thousandth of it (rusticl on llvmpipe
       counts 0, 1, 2, 3 ns per command), are not trusted. */
    if (ok && dev <= wall * 1.05 + 0.05 && dev * 1000.0 >= wall) {
      *ms = dev;
    } else {
      *ms = wall;
      *used_wall = 1;
    }
    clReleaseEvent(ev);
  }
  clFinish(b->queue);
  clReleaseEvent(marker);
  clReleaseEvent(gate);
  return st;
}

static int cmp_double(const void *a, const void *c) {
  const double x = *(const double *)a, y = *(const double *)c;
  return x < y ? -1 : x > y;
}

static void set_status(result *r, fcl_status st, const char *msg) {
  r->ok = 0;
  snprintf(r->status, sizeof r->status, "%s",
           st == FCL_ERROR_UNSUPPORTED ? "unsupported" : st == FCL_ERROR_OUT_OF_RESOURCES ? "out of memory" : "error");
  snprintf(r->message, sizeof r->message, "%s: %s", fcl_status_string(st), msg);
}

static void measure(bench *b, int impl, const fcl_attention_desc *desc, const tensors *t, result *r) {
  const options *o = &b->opt;
  memset(r, 0, sizeof *r);
  r->max_diff = -1;
  r->timer = "events";
  if (impl == IMPL_REFERENCE) r->extra_bytes = fcl_reference_scratch_bytes(b->fcl, desc);
  if (impl == IMPL_BACKWARD) r->extra_bytes = fcl_attention_backward_workspace_size(b->fcl, desc);
  if (impl == IMPL_FLASH) {
    r->extra_bytes = fcl_attention_forward_workspace_size(b->fcl, desc); /* split-KV partials */
    fcl_plan_info info;
    if (fcl_describe_plan(b->fcl, FCL_OP_FORWARD, desc, &info) == FCL_SUCCESS) {
      snprintf(r->kernel, sizeof r->kernel, "%s", info.kernel);
      r->splits = info.splits;
    }
  }
  double *times = malloc(sizeof(double) * (size_t)o->iters);
  int wall = 0;
  for (int i = 0; i < o->warmup + o->iters; ++i) {
    double ms = 0;
    fcl_status st = timed_call(b, impl, desc, t, &ms, &wall);
    if (st) {
      set_status(r, st, fcl_last_error());
      free(times);
      return;
    }
    if (i >= o->warmup) times[i - o->warmup] = ms;
  }
  qsort(times, (size_t)o->iters, sizeof *times, cmp_double);
  r->ok = 1;
  snprintf(r->status, sizeof r->status, "ok");
  r->median_ms = o->iters % 2 ? times[o->iters / 2] : 0.5 * (times[o->iters / 2 - 1] + times[o->iters / 2]);
  r->min_ms = times[0];
  r->max_ms = times[o->iters - 1];
  r->timer = wall ? "wall" : "events";
  double flops = (impl == IMPL_BACKWARD ? 10.0 : 4.0) * (double)desc->batch * (double)desc->num_heads *
                 (double)desc->seqlen_q * (double)desc->seqlen_k * (double)desc->head_dim;
  if (desc->window) {
    /* The scores the window leaves visible, counted row by row. */
    const long long nq = desc->seqlen_q, nk = desc->seqlen_k, wr = desc->causal ? 0 : desc->window_right;
    double visible = 0;
    for (long long i = 0; i < nq; ++i) {
      const long long p = i + nk - nq;
      const long long lo = desc->window_left < 0 ? 0 : p - desc->window_left;
      const long long hi = wr < 0 ? nk - 1 : p + wr;
      const long long n = (hi < nk - 1 ? hi : nk - 1) - (lo > 0 ? lo : 0) + 1;
      visible += n > 0 ? (double)n : 0.0;
    }
    flops = flops / ((double)nq * (double)nk) * visible;
  } else if (desc->causal) {
    flops /= 2;
  }
  r->tflops = flops / (r->median_ms * 1e-3) / 1e12;
  const double kv_bytes = 2.0 * (double)desc->batch * (double)(desc->num_kv_heads ? desc->num_kv_heads : desc->num_heads) *
                          (double)desc->seqlen_k * (double)desc->head_dim * (desc->dtype == FCL_DTYPE_F32 ? 4.0 : 2.0);
  r->kv_gbps = kv_bytes / (r->median_ms * 1e-3) / 1e9;
  free(times);
}

/* max |a - c| over count elements of two device tensors of dtype t; -1 when they cannot be read. */
static double max_abs_diff(bench *b, cl_mem a, cl_mem c, size_t count, fcl_dtype t) {
  const size_t bytes = count * elem_size(t);
  unsigned char *ha = malloc(bytes), *hc = malloc(bytes);
  double m = -1;
  if (ha && hc && clEnqueueReadBuffer(b->queue, a, CL_TRUE, 0, bytes, ha, 0, NULL, NULL) == CL_SUCCESS &&
      clEnqueueReadBuffer(b->queue, c, CL_TRUE, 0, bytes, hc, 0, NULL, NULL) == CL_SUCCESS) {
    m = 0;
    for (size_t i = 0; i < count; ++i) {
      const double d = fabs((double)decode(ha + i * elem_size(t), t) - (double)decode(hc + i * elem_size(t), t));
      if (!(d <= m)) m = d; /* NaN propagates */
    }
  }
  free(ha);
  free(hc);
  return m;
}

/* ---- output ---- */

static const char *dtype_str(fcl_dtype t) { return t == FCL_DTYPE_F32 ? "f32" : t == FCL_DTYPE_F16 ? "f16" : "bf16"; }

static void json_string(const char *s) {
  putchar('"');
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
    else putchar(*s);
  }
  putchar('"');
}

/* Bytes as a short human string: 0, 512 B, 4.0 KiB, 2.0 MiB, 1.00 GiB. */
static void human_bytes(size_t n, char *out, size_t size) {
  if (n == 0) snprintf(out, size, "0");
  else if (n < 1024) snprintf(out, size, "%zu B", n);
  else if (n < 1048576) snprintf(out, size, "%.1f KiB", n / 1024.0);
  else if (n < 1073741824) snprintf(out, size, "%.1f MiB", n / 1048576.0);
  else snprintf(out, size, "%.2f GiB", n / 1073741824.0);
}

static void print_header(const bench *b) {
  const options *o = &b->opt;
  if (o->json) return;
  printf("# flashcl-bench %s | device: %s | platform: %s | driver: %s\n", fcl_version(), b->device_name,
         b->platform_name, b->driver);
  char window[64] = "";
  if (o->window) snprintf(window, sizeof window, "  window=(%lld,%lld)", o->window_left, o->window_right);
  if (o->seqlen_q)
    snprintf(window + strlen(window), sizeof window - strlen(window), "  Nq=%lld (N keys)", o->seqlen_q);
  if (o->bnhd) snprintf(window + strlen(window), sizeof window - strlen(window), "  [B,N,H,d]");
  printf("# dtype %s  B=%lld H=%lld Hkv=%lld d=%lld  causal=%d%s  iters=%d warmup=%d  (median/min/max ms of "
         "device time; TFLOP/s from the median)\n",
         dtype_str(o->dtype), o->batch, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->head_dim, o->causal,
         window, o->iters, o->warmup);
  printf("%-6s %-10s %7s %11s %11s %11s %9s %12s %12s  %s\n", "#", "impl", "N", "median_ms", "min_ms", "max_ms",
         "TFLOP/s", "extra_mem", "max|O-Oref|", "status");
}

static void print_result(const bench *b, int impl, long long n, const result *r) {
  const options *o = &b->opt;
  if (o->json) {
    printf("{\"impl\":\"%s\",\"device\":", impl_names[impl]);
    json_string(b->device_name);
    printf(",\"driver\":");
    json_string(b->driver);
    printf(",\"dtype\":\"%s\",\"batch\":%lld,\"heads\":%lld,\"kv_heads\":%lld,\"seqlen\":%lld,\"head_dim\":%lld,"
           "\"causal\":%s,\"iters\":%d,\"warmup\":%d,\"status\":\"%s\"",
           dtype_str(o->dtype), o->batch, o->heads, o->kv_heads ? o->kv_heads : o->heads, n, o->head_dim,
           o->causal ? "true" : "false", o->iters, o->warmup, r->status);
    if (o->window) printf(",\"window\":[%lld,%lld]", o->window_left, o->window_right);
    if (o->seqlen_q) printf(",\"seqlen_q\":%lld", o->seqlen_q);
    if (o->bnhd) printf(",\"layout\":\"bnhd\"");
    if (o->paged) printf(",\"paged\":%lld", o->paged);
    if (r->kernel[0]) printf(",\"kernel\":\"%s\",\"splits\":%d", r->kernel, r->splits);
    if (r->ok)
      printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"tflops\":%.6g,\"kv_gbps\":%.6g,\"extra_bytes\":%zu,"
             "\"timer\":\"%s\"",
             r->median_ms, r->min_ms, r->max_ms, r->tflops, r->kv_gbps, r->extra_bytes, r->timer);
    if (r->max_diff >= 0) printf(",\"max_abs_diff_vs_flash\":%.3g", r->max_diff);
    if (!r->ok) {
      printf(",\"message\":");
      json_string(r->message);
    }
    printf("}\n");
  } else if (r->ok) {
    char diff[32] = "-", extra[32];
    if (r->max_diff >= 0) snprintf(diff, sizeof diff, "%.2e", r->max_diff);
    human_bytes(r->extra_bytes, extra, sizeof extra);
    char kv[48] = "";
    if (o->seqlen_q) snprintf(kv, sizeof kv, ", K+V read %.1f GB/s", r->kv_gbps);
    printf("%-6s %-10s %7lld %11.3f %11.3f %11.3f %9.4f %12s %12s  ok%s%s\n", "bench", impl_names[impl], n,
           r->median_ms, r->min_ms, r->max_ms, r->tflops, extra, diff,
           strcmp(r->timer, "wall") ? "" : " (wall clock)", kv);
  } else {
    printf("%-6s %-10s %7lld %11s %11s %11s %9s %12s %12s  %s: %s\n", "bench", impl_names[impl], n, "-", "-", "-", "-",
           "-", "-", r->status, r->message);
  }
  fflush(stdout);
}

static void release_tensors(tensors *t) {
  cl_mem *all[] = {&t->q, &t->k, &t->v, &t->o, &t->o_ref, &t->lse, &t->d_o, &t->dq, &t->dk, &t->dv, &t->workspace,
                   &t->table};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (*all[i]) {
      clReleaseMemObject(*all[i]);
      *all[i] = NULL;
    }
}

/* Allocates every tensor the selected impls need for length n; returns 0, or the failing CL error. */
static cl_int alloc_tensors(bench *b, const fcl_attention_desc *desc, const int impl[IMPL_COUNT], tensors *t) {
  memset(t, 0, sizeof *t);
  const options *o = &b->opt;
  const size_t hkv = (size_t)(o->kv_heads ? o->kv_heads : o->heads);
  const size_t qn = (size_t)(o->batch * o->heads) * (size_t)desc->seqlen_q * (size_t)o->head_dim;
  const size_t kn = desc->block_table ? (size_t)desc->num_blocks * (size_t)desc->block_size * hkv * (size_t)o->head_dim
                                      : (size_t)o->batch * hkv * (size_t)desc->seqlen_k * (size_t)o->head_dim;
  const size_t rows = (size_t)(o->batch * o->heads) * (size_t)desc->seqlen_q;
  cl_int err = CL_SUCCESS;
  if (!(t->q = make_buffer(b, qn, o->dtype, 1, &err)) || !(t->k = make_buffer(b, kn, o->dtype, 1, &err)) ||
      !(t->v = make_buffer(b, kn, o->dtype, 1, &err)) || !(t->o = make_buffer(b, qn, o->dtype, 0, &err)) ||
      !(t->lse = make_buffer(b, rows, FCL_DTYPE_F32, 0, &err)))
    return err;
  if (impl[IMPL_REFERENCE] && !(t->o_ref = make_buffer(b, qn, o->dtype, 0, &err))) return err;
  fcl_plan_info info;
  memset(&info, 0, sizeof info);
  t->splits = fcl_describe_plan(b->fcl, FCL_OP_FORWARD, desc, &info) == FCL_SUCCESS ? info.splits : 1;
  if (impl[IMPL_BACKWARD]) {
    const size_t ws = fcl_attention_backward_workspace_size(b->fcl, desc);
    if (!(t->d_o = make_buffer(b, qn, o->dtype, 1, &err)) || !(t->dq = make_buffer(b, qn, o->dtype, 0, &err)) ||
        !(t->dk = make_buffer(b, kn, o->dtype, 0, &err)) || !(t->dv = make_buffer(b, kn, o->dtype, 0, &err)))
      return err;
    if (ws && !(t->workspace = make_buffer(b, (ws + 3) / 4, FCL_DTYPE_F32, 0, &err))) return err;
  }
  return CL_SUCCESS;
}

int main(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  if (parse_args(argc, argv, &b.opt)) return 2;
  const options *o = &b.opt;
  if (open_device(&b)) return 1;
  print_header(&b);
  int alive[IMPL_COUNT];
  memcpy(alive, o->impl, sizeof alive);
  int failures = 0;
  for (int si = 0; si < o->num_seqlens; ++si) {
    const long long n = o->seqlens[si];
    int any = 0;
    for (int i = 0; i < IMPL_COUNT; ++i) any |= alive[i];
    if (!any) break;
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = o->batch, desc.num_heads = o->heads, desc.num_kv_heads = o->kv_heads;
    desc.seqlen_q = o->seqlen_q ? o->seqlen_q : n, desc.seqlen_k = n, desc.head_dim = o->head_dim;
    desc.dtype = o->dtype, desc.causal = o->causal;
    desc.window = o->window, desc.window_left = o->window_left, desc.window_right = o->window_right;
    if (o->bnhd) { /* [batch, seq, heads, d]: element strides (batch, head, row) */
      const long long hkv = o->kv_heads ? o->kv_heads : o->heads, d = o->head_dim;
      const int64_t qs[3] = {desc.seqlen_q * o->heads * d, d, o->heads * d}, ks[3] = {n * hkv * d, d, hkv * d};
      memcpy(desc.q_stride, qs, sizeof qs), memcpy(desc.o_stride, qs, sizeof qs);
      memcpy(desc.k_stride, ks, sizeof ks), memcpy(desc.v_stride, ks, sizeof ks);
    }
    cl_mem table = NULL;
    if (o->paged) { /* each sequence's blocks at shuffled places of one pool, vLLM's [block, row, head, d] order */
      const long long hkv = o->kv_heads ? o->kv_heads : o->heads, d = o->head_dim, per = (n + o->paged - 1) / o->paged;
      desc.block_table_stride = per, desc.block_size = o->paged, desc.num_blocks = o->batch * per;
      int *entries = malloc((size_t)desc.num_blocks * sizeof(int));
      for (long long i = 0; i < desc.num_blocks; ++i) entries[i] = (int)i;
      for (long long i = desc.num_blocks - 1; i > 0; --i) {
        const long long j = rand() % (i + 1);
        const int x = entries[i];
        entries[i] = entries[j], entries[j] = x;
      }
      cl_int terr;
      table = clCreateBuffer(b.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)desc.num_blocks * sizeof(int),
                             entries, &terr);
      free(entries);
      desc.block_table = table;
      const int64_t ps[3] = {o->paged * hkv * d, d, hkv * d};
      memcpy(desc.k_stride, ps, sizeof ps), memcpy(desc.v_stride, ps, sizeof ps);
    }
    tensors t;
    cl_int err = alloc_tensors(&b, &desc, alive, &t);
    t.table = table;
    if (err != CL_SUCCESS) {
      result r;
      memset(&r, 0, sizeof r);
      r.max_diff = -1;
      snprintf(r.status, sizeof r.status, "out of memory");
      snprintf(r.message, sizeof r.message, "the inputs and outputs for N=%lld do not fit on the device (%s)", n,
               fcl_cl_error_name(err));
      for (int i = 0; i < IMPL_COUNT; ++i)
        if (alive[i]) print_result(&b, i, n, &r);
      release_tensors(&t);
      break;
    }
    int flash_ok = 0;
    /* Backward needs O and lse of a forward pass: run it first when flash is not being timed. */
    if (alive[IMPL_BACKWARD] && !alive[IMPL_FLASH]) {
      cl_event ev = NULL;
      if (fcl_attention_forward(b.fcl, b.queue, &desc, t.q, t.k, t.v, t.o, t.lse, 0, NULL, &ev) == FCL_SUCCESS) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
      }
    }
    for (int impl = 0; impl < IMPL_COUNT; ++impl) {
      if (!alive[impl]) continue;
      fprintf(stderr, "flashcl-bench: %s N=%lld (%d warm-up + %d timed runs)...\n", impl_names[impl], n, o->warmup,
              o->iters);
      result r;
      measure(&b, impl, &desc, &t, &r);
      if (impl == IMPL_FLASH) flash_ok = r.ok;
      if (impl == IMPL_REFERENCE && r.ok && flash_ok)
        r.max_diff = max_abs_diff(&b, t.o, t.o_ref, (size_t)(o->batch * o->heads) * (size_t)n * (size_t)o->head_dim,
                                  o->dtype);
      print_result(&b, impl, n, &r);
      if (o->max_diff > 0 && impl == IMPL_REFERENCE && r.ok && flash_ok && !(r.max_diff <= o->max_diff)) {
        fprintf(stderr, "flashcl-bench: N=%lld: max |O_flash - O_reference| = %g exceeds --max-diff %g\n", n,
                r.max_diff, o->max_diff);
        ++failures;
      }
      if (!r.ok) {
        if (impl != IMPL_BACKWARD && strcmp(r.status, "unsupported") && strcmp(r.status, "out of memory"))
          ++failures;
        /* In a sweep an implementation stops at its first failure; a list goes on. */
        if (o->sweep || !strcmp(r.status, "unsupported")) alive[impl] = 0;
      }
    }
    release_tensors(&t);
  }
  fcl_context_release(b.fcl);
  clReleaseMemObject(b.gate_buf);
  if (b.flush_buf) clReleaseMemObject(b.flush_buf);
  clReleaseCommandQueue(b.queue);
  clReleaseContext(b.context);
  return failures ? 1 : 0;
}
