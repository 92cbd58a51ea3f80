/* flashcl-bench: times fcl_attention_forward ("flash"), the CLBlast reference path ("reference") and
 * fcl_attention_backward ("backward") on one OpenCL device, over a list of sequence lengths, a sweep that
 * doubles N until the reference path runs out of memory and goes on with the others, or one batch of
 * sequences of different lengths.
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
 * Variable lengths (--varlen MIN:MAX or --varlen-list, the shape serving engines run): B sequences with
 * their own key counts (drawn from --seed, so runs repeat), packed end to end by cu_seqlens as
 * FlashAttention's flash_attn_varlen_func takes them, [total, heads, d]; each sequence has as many query rows
 * as keys (prefill) or --seqlen-q rows (decode), and with --paged its K and V sit in a shuffled paged pool
 * found through seqlens_k and a block table (vLLM's decode). One row of results; its N is the longest
 * sequence, and the JSON gives every key count and the totals. For example, vLLM-shaped prefill and decode:
 *   flashcl-bench --varlen 100:8000 --batch 64 --heads 32 --kv-heads 8 --head-dim 128 --dtype f16 --causal
 *   flashcl-bench --varlen 100:8000 --batch 64 --heads 32 --kv-heads 8 --head-dim 128 --dtype f16 --causal \
 *     --seqlen-q 1 --paged 16
 *
 * FLOP counts (the usual convention, so rows compare by time), summed over the sequences: forward
 * 4*H*Nq*Nk*d per sequence, backward 10*H*Nq*Nk*d, halved when causal with Nq = Nk; with a causal mask and
 * Nq != Nk, or a window, only the visible scores count. K+V read rate: the bytes of the keys and values the
 * sequences attend to, per median time. Extra memory: device memory a call uses beyond its inputs and
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
  double softcap;         /* --softcap C; 0: off */
  int alibi;              /* --alibi: one slope a head, 2^(-8 (h + 1) / H) */
  int sinks;              /* --sinks: one random logit a head (and, backward, its gradient) */
  int mask;               /* --mask DTYPE: a random additive [Nq, Nk] mask shared by every batch and head */
  fcl_dtype mask_dtype;
  int impl[IMPL_COUNT];
  int iters, warmup;
  int json;
  int bnhd;               /* --layout bnhd: q, k, v and o as [batch, seq, heads, d] */
  long long flush_mib;    /* --flush: MiB written before each run, so its inputs do not start in the cache */
  int flush_read;         /* --flush-read: the flush reads its buffer instead, leaving clean lines in the cache */
  int from_gate;          /* --from-gate: one-kernel calls timed from the gate too, their launch included */
  long long paged;        /* --paged BS: K and V in a pool of blocks of BS rows, in shuffled order; 0 dense */
  long long *varlen;      /* --varlen, --varlen-list: each sequence's key count, [batch]; NULL: dense tensors */
  long long varlen_min, varlen_max; /* --varlen MIN:MAX, the range varlen is drawn from; 0: --varlen-list */
  unsigned long long seed; /* --seed: the --varlen draw and the --paged block order */
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
  cl_mem flush_buf; /* --flush MiB, filled (or read, --flush-read) before each run's gate (NULL: none) */
  cl_mem flush_sink; /* --flush-read: the word the read kernel could write, so that its loads are kept */
  cl_program flush_program;
  cl_kernel flush_kernel; /* --flush-read: flush_read_source's kernel */
  size_t flush_global;    /* its work-items: 1024 a compute unit */
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
  const char *plan; /* flash, backward: why the variant and its tiles were chosen (fcl_plan_info.reason) */
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
          "  --varlen MIN:MAX    a batch of B (--batch) sequences of different lengths instead of --seqlen:\n"
          "                      key counts drawn uniformly from MIN..MAX, q, k, v, o packed [total, heads, d]\n"
          "                      by cu_seqlens (FlashAttention's varlen layout; with --paged, k and v in the\n"
          "                      pool and seqlens_k giving the key counts); each sequence's query rows are\n"
          "                      its key count (prefill), or --seqlen-q Q (decode: 1)\n"
          "  --varlen-list N,... the same with these key counts (B = their number)\n"
          "  --seed S            seed of the --varlen draw and the --paged block order (default 1)\n"
          "  --layout bhnd|bnhd  q, k, v, o as [batch, heads, seq, d] (default) or [batch, seq, heads, d]\n"
          "  --paged BS          k and v in a paged pool [blocks, BS, kv heads, d] (vLLM's order) with a\n"
          "                      block table in shuffled order (the backward refuses it)\n"
          "  --flush MIB         fill a MIB-MiB buffer before each run (outside its time), so that its inputs\n"
          "                      are not read from the cache a previous run left them in (default 0)\n"
          "  --flush-read        the --flush reads its buffer (filled once) instead of writing it: the cache\n"
          "                      then holds clean lines, and the run does not pay for writing back the\n"
          "                      flush's dirty ones (they matter to memory-bound calls such as decode)\n"
          "  --from-gate         time a flash call of one kernel from the end of the gate command, as calls of\n"
          "                      several kernels are, so that its launch counts (as CUDA events around a call\n"
          "                      count it); by default such a call is timed by its kernel's own start and end\n"
          "  --causal            causal mask\n"
          "  --window L,R        sliding window: key j visible from query i iff i - L <= j <= i + R (-1:\n"
          "                      unbounded); TFLOP/s then count the visible scores only\n"
          "  --softcap C         logit softcap: s = C tanh(s / C)\n"
          "  --alibi             ALiBi, one slope a head (2^(-8 (h + 1) / H), shared by the batch)\n"
          "  --sinks             attention sinks, one random logit a head\n"
          "  --mask f32|f16|bf16 an additive mask of random values in [-1, 1), [Nq, Nk], shared by every\n"
          "                      batch and head (strides 0, 0, Nk)\n"
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

/* A comma-separated list of integers in [1, 2^31) into out[0 .. max - 1]; returns their number, or -1
   (reported). */
static int parse_list(const char *opt, const char *val, long long *out, int max) {
  char *copy = strdup(val);
  int count = 0, bad = 0;
  for (char *tok = strtok(copy, ","); tok && !bad; tok = strtok(NULL, ",")) {
    long long v;
    bad = parse_ll(tok, &v) || v < 1 || v > INT32_MAX || count == max;
    if (!bad) out[count++] = v;
  }
  free(copy);
  if (bad && count == max) fprintf(stderr, "flashcl-bench: %s %s: at most %d lengths\n", opt, val, max);
  else if (bad || !count)
    fprintf(stderr, "flashcl-bench: %s %s: expected comma-separated integers from 1 to 2^31 - 1\n", opt, val);
  return bad || !count ? -1 : count;
}

/* The bench's pseudo-random choices (the --varlen lengths, the --paged block order): splitmix64 from --seed,
   the same on every platform, so that a seed names one batch everywhere. */
static unsigned long long draw_state;
static long long draw_below(long long n) {
  unsigned long long z = (draw_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (long long)((z ^ (z >> 31)) % (unsigned long long)n);
}

/* --varlen, --varlen-list: the key counts, checked against the options they replace or bound. */
static int setup_varlen(options *o, int batch_given, int seqlens_given, int num_listed) {
  if (seqlens_given || o->sweep || o->bnhd) {
    fprintf(stderr, "flashcl-bench: --varlen and --varlen-list pack the sequences [total, heads, d]: they take no "
                    "--seqlen, --sweep or --layout\n");
    return -1;
  }
  if (num_listed) {
    if (batch_given && o->batch != num_listed) {
      fprintf(stderr, "flashcl-bench: --batch %lld but --varlen-list has %d lengths\n", o->batch, num_listed);
      return -1;
    }
    o->batch = num_listed;
  } else {
    o->varlen = malloc(sizeof(long long) * (size_t)o->batch);
    if (!o->varlen) return -1;
    for (long long b = 0; b < o->batch; ++b)
      o->varlen[b] = o->varlen_min + draw_below(o->varlen_max - o->varlen_min + 1);
  }
  long long total_k = 0, longest = 0;
  for (long long b = 0; b < o->batch; ++b) {
    total_k += o->varlen[b];
    if (o->varlen[b] > longest) longest = o->varlen[b];
  }
  const long long total_q = o->seqlen_q ? o->batch * o->seqlen_q : total_k;
  if (total_k > INT32_MAX || total_q > INT32_MAX) { /* cu_seqlens are int32 */
    fprintf(stderr, "flashcl-bench: --varlen: %lld keys and %lld query rows in all; at most 2^31 - 1\n", total_k,
            total_q);
    return -1;
  }
  o->seqlens[0] = longest; /* one row of results, N = the longest sequence */
  o->num_seqlens = 1;
  return 0;
}

/* f32, f16 or bf16 into *out; -1 for anything else. */
static int parse_dtype(const char *s, fcl_dtype *out) {
  if (!strcmp(s, "f32")) *out = FCL_DTYPE_F32;
  else if (!strcmp(s, "f16")) *out = FCL_DTYPE_F16;
  else if (!strcmp(s, "bf16")) *out = FCL_DTYPE_BF16;
  else return -1;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  int batch_given = 0, seqlens_given = 0, num_listed = 0;
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
      if (parse_dtype(val, &o->dtype)) {
        fprintf(stderr, "flashcl-bench: --dtype %s: expected f32, f16 or bf16\n", val);
        return -1;
      }
    } else if (!strcmp(a, "--batch")) {
      NUMBER(o->batch, 1);
      batch_given = 1;
    }
    else if (!strcmp(a, "--heads")) NUMBER(o->heads, 1);
    else if (!strcmp(a, "--kv-heads")) NUMBER(o->kv_heads, 0);
    else if (!strcmp(a, "--head-dim")) NUMBER(o->head_dim, 1);
    else if (!strcmp(a, "--max-seqlen")) NUMBER(o->max_seqlen, 1);
    else if (!strcmp(a, "--seqlen-q")) NUMBER(o->seqlen_q, 1);
    else if (!strcmp(a, "--iters")) NUMBER(o->iters, 10);
    else if (!strcmp(a, "--warmup")) NUMBER(o->warmup, 0);
    else if (!strcmp(a, "--flush")) NUMBER(o->flush_mib, 0);
    else if (!strcmp(a, "--flush-read")) o->flush_read = 1;
    else if (!strcmp(a, "--from-gate")) o->from_gate = 1;
    else if (!strcmp(a, "--paged")) NUMBER(o->paged, 1);
    else if (!strcmp(a, "--seed")) NUMBER(o->seed, 0);
    else if (!strcmp(a, "--varlen") || !strcmp(a, "--varlen-list")) {
      NEED_VALUE();
      if (o->varlen_min || o->varlen) {
        fprintf(stderr, "flashcl-bench: %s: --varlen or --varlen-list, once\n", a);
        return -1;
      }
      if (!strcmp(a, "--varlen-list")) {
        const int max = (int)strlen(val) / 2 + 1; /* no more than the commas allow */
        o->varlen = malloc(sizeof(long long) * (size_t)max);
        if (!o->varlen || (num_listed = parse_list(a, val, o->varlen, max)) < 0) return -1;
      } else {
        char tail;
        if (sscanf(val, "%lld:%lld%c", &o->varlen_min, &o->varlen_max, &tail) != 2 || o->varlen_min < 1 ||
            o->varlen_max < o->varlen_min || o->varlen_max > INT32_MAX) {
          fprintf(stderr, "flashcl-bench: --varlen %s: expected MIN:MAX with 1 <= MIN <= MAX < 2^31\n", val);
          return -1;
        }
      }
    }
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
    else if (!strcmp(a, "--softcap")) {
      NEED_VALUE();
      char *end;
      o->softcap = strtod(val, &end);
      if (end == val || *end || !(o->softcap > 0) || !isfinite(o->softcap)) {
        fprintf(stderr, "flashcl-bench: --softcap %s: expected a positive number\n", val);
        return -1;
      }
    }
    else if (!strcmp(a, "--alibi")) o->alibi = 1;
    else if (!strcmp(a, "--sinks")) o->sinks = 1;
    else if (!strcmp(a, "--mask")) {
      NEED_VALUE();
      if (parse_dtype(val, &o->mask_dtype)) {
        fprintf(stderr, "flashcl-bench: --mask %s: expected f32, f16 or bf16\n", val);
        return -1;
      }
      o->mask = 1;
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
      if ((o->num_seqlens = parse_list(a, val, o->seqlens, 64)) < 0) return -1;
      seqlens_given = 1;
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
  draw_state = o->seed;
  if (o->flush_read && !o->flush_mib) {
    fprintf(stderr, "flashcl-bench: --flush-read needs --flush MIB\n");
    return -1;
  }
  if ((o->varlen_min || o->varlen) && setup_varlen(o, batch_given, seqlens_given, num_listed)) return -1;
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

/* --flush-read's kernel: every word of the buffer is read, and the sink written only for an XOR of them that
   the fill's words do not give, so no load can be dropped. */
static const char flush_read_source[] =
    "__kernel void flush_read(__global const uint4 *p, uint n, __global uint *sink) {\n"
    "  uint4 acc = (uint4)(0u);\n"
    "  for (uint i = get_global_id(0); i < n; i += get_global_size(0)) acc ^= p[i];\n"
    "  if (acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) sink[0] = acc.z;\n"
    "}\n";

static const cl_uint flush_junk = 0x3c003c00u; /* the flush buffer's words (f16 ones) */

/* The --flush buffer and, with --flush-read, its read kernel (the buffer filled once here). */
static int setup_flush(bench *b) {
  cl_int err;
  const size_t bytes = (size_t)b->opt.flush_mib << 20;
  b->flush_buf = clCreateBuffer(b->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: clCreateBuffer of --flush %lld MiB failed (%d)\n", b->opt.flush_mib, (int)err);
    return -1;
  }
  if (!b->opt.flush_read) return 0;
  if (bytes / 16 > 0x7fffffffu) { /* the kernel's 32-bit index, and its stride, stay below 2^32 */
    fprintf(stderr, "flashcl-bench: --flush-read takes at most 32767 MiB\n");
    return -1;
  }
  cl_uint units = 0;
  if (clGetDeviceInfo(b->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL) != CL_SUCCESS || !units)
    units = 1;
  b->flush_global = (size_t)units * 1024;
  const cl_uint n = (cl_uint)(bytes / 16);
  const char *src = flush_read_source;
  b->flush_sink = clCreateBuffer(b->context, CL_MEM_READ_WRITE, 4, NULL, &err);
  if (err == CL_SUCCESS) b->flush_program = clCreateProgramWithSource(b->context, 1, &src, NULL, &err);
  if (err == CL_SUCCESS && (err = clBuildProgram(b->flush_program, 1, &b->device, "", NULL, NULL)) != CL_SUCCESS) {
    char log[2048] = "";
    clGetProgramBuildInfo(b->flush_program, b->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    fprintf(stderr, "flashcl-bench: the --flush-read kernel did not build (%d):\n%s\n", (int)err, log);
    return -1;
  }
  if (err == CL_SUCCESS) b->flush_kernel = clCreateKernel(b->flush_program, "flush_read", &err);
  if (err == CL_SUCCESS) err = clSetKernelArg(b->flush_kernel, 0, sizeof(cl_mem), &b->flush_buf);
  if (err == CL_SUCCESS) err = clSetKernelArg(b->flush_kernel, 1, sizeof n, &n);
  if (err == CL_SUCCESS) err = clSetKernelArg(b->flush_kernel, 2, sizeof(cl_mem), &b->flush_sink);
  if (err == CL_SUCCESS)
    err = clEnqueueFillBuffer(b->queue, b->flush_buf, &flush_junk, sizeof flush_junk, 0, bytes, 0, NULL, NULL);
  if (err == CL_SUCCESS) err = clFinish(b->queue);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "flashcl-bench: setting up --flush-read failed (%d)\n", (int)err);
    return -1;
  }
  return 0;
}

/* The flush before a run's gate: a fill, or with --flush-read a read of the whole buffer (enough work-groups
   for every compute unit, each work-item striding through it). */
static cl_int enqueue_flush(bench *b) {
  if (!b->opt.flush_read)
    return clEnqueueFillBuffer(b->queue, b->flush_buf, &flush_junk, sizeof flush_junk, 0,
                               (size_t)b->opt.flush_mib << 20, 0, NULL, NULL);
  return clEnqueueNDRangeKernel(b->queue, b->flush_kernel, 1, NULL, &b->flush_global, NULL, 0, NULL, NULL);
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
  if (b->opt.flush_mib > 0 && setup_flush(b)) return -1;
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

/* ---- the batch of sequences, its descriptor and tensors ---- */

typedef struct tensors {
  cl_mem q, k, v, o, o_ref, lse, d_o, dq, dk, dv, workspace;
  cl_mem cu_q, cu_k, seqlens_k, table; /* the int32 index buffers desc names */
  cl_mem alibi, sinks, d_sinks, mask;   /* the score modifiers' buffers desc names */
  size_t o_elems; /* elements of o (and o_ref) */
  fcl_plan_info forward; /* the flash forward's plan (fcl_describe_plan): its variant and split-KV chunks */
  fcl_plan_info backward; /* the backward's plan, when --impl has backward */
} tensors;

/* The batch for one row of results: sequence b attends with nq[b] query rows (--seqlen-q, else nk[b]) to
   nk[b] keys (its --varlen length, else the row's N). */
typedef struct batch_lengths {
  long long *nq, *nk;
  long long total_q, total_k, max_q, max_k;
} batch_lengths;

static void batch_lengths_free(batch_lengths *len) {
  free(len->nq);
  free(len->nk);
}

static int batch_lengths_init(const options *o, long long n, batch_lengths *len) {
  memset(len, 0, sizeof *len);
  len->nq = malloc(sizeof(long long) * (size_t)o->batch);
  len->nk = malloc(sizeof(long long) * (size_t)o->batch);
  if (!len->nq || !len->nk) {
    batch_lengths_free(len);
    return -1;
  }
  for (long long b = 0; b < o->batch; ++b) {
    len->nk[b] = o->varlen ? o->varlen[b] : n;
    len->nq[b] = o->seqlen_q ? o->seqlen_q : len->nk[b];
    len->total_q += len->nq[b], len->total_k += len->nk[b];
    if (len->nq[b] > len->max_q) len->max_q = len->nq[b];
    if (len->nk[b] > len->max_k) len->max_k = len->nk[b];
  }
  return 0;
}

static long long blocks_for(long long keys, long long block_size) { return (keys + block_size - 1) / block_size; }

/* The descriptor of the batch, index buffers aside (make_indices): dense [batch] tensors (--layout's
   strides), or with --varlen packed [total, heads, d] sequences (zero strides), K/V paged with --paged. */
static void describe(const options *o, const batch_lengths *len, fcl_attention_desc *desc) {
  const long long hkv = o->kv_heads ? o->kv_heads : o->heads, d = o->head_dim;
  memset(desc, 0, sizeof *desc);
  desc->batch = o->batch, desc->num_heads = o->heads, desc->num_kv_heads = o->kv_heads;
  desc->seqlen_q = len->max_q, desc->seqlen_k = len->max_k, desc->head_dim = d; /* FA2's max_seqlen_q, _k */
  desc->dtype = o->dtype, desc->causal = o->causal;
  desc->window = o->window, desc->window_left = o->window_left, desc->window_right = o->window_right;
  desc->softcap = (float)o->softcap;
  if (o->bnhd) { /* [batch, seq, heads, d]: element strides (batch, head, row) */
    const int64_t qs[3] = {desc->seqlen_q * o->heads * d, d, o->heads * d};
    const int64_t ks[3] = {desc->seqlen_k * hkv * d, d, hkv * d};
    memcpy(desc->q_stride, qs, sizeof qs), memcpy(desc->o_stride, qs, sizeof qs);
    memcpy(desc->k_stride, ks, sizeof ks), memcpy(desc->v_stride, ks, sizeof ks);
  }
  if (o->varlen) {
    desc->total_q = len->total_q;
    if (!o->paged) desc->total_k = len->total_k;
  }
  if (o->paged) { /* vLLM's pool order [block, row, kv head, d]; each sequence has just the blocks it needs */
    desc->block_size = o->paged, desc->block_table_stride = blocks_for(len->max_k, o->paged);
    for (long long b = 0; b < o->batch; ++b) desc->num_blocks += blocks_for(len->nk[b], o->paged);
    const int64_t ps[3] = {o->paged * hkv * d, d, hkv * d};
    memcpy(desc->k_stride, ps, sizeof ps), memcpy(desc->v_stride, ps, sizeof ps);
  }
}

/* The paged block table [batch, block_table_stride]: the pool's blocks in shuffled order (as an allocator
   leaves them after some churn), dealt to the sequences in turn; entries past a sequence's last block are
   never read and hold 0, as vLLM pads them. NULL when out of host memory. */
static long long *block_table(const batch_lengths *len, const fcl_attention_desc *desc) {
  long long *order = malloc(sizeof(long long) * (size_t)desc->num_blocks);
  long long *table = calloc((size_t)(desc->batch * desc->block_table_stride), sizeof(long long));
  if (order && table) {
    for (long long i = 0; i < desc->num_blocks; ++i) order[i] = i;
    for (long long i = desc->num_blocks - 1; i > 0; --i) {
      const long long j = draw_below(i + 1), x = order[i];
      order[i] = order[j], order[j] = x;
    }
    long long next = 0;
    for (long long b = 0; b < desc->batch; ++b)
      for (long long j = 0; j < blocks_for(len->nk[b], desc->block_size); ++j)
        table[b * desc->block_table_stride + j] = order[next++];
  } else {
    free(table);
    table = NULL;
  }
  free(order);
  return table;
}

/* An int32 buffer of values[0 .. count - 1]; NULL with *err set on failure. */
/* A read-only buffer holding a copy of bytes at host; NULL with *err set on failure. */
static cl_mem host_buffer(bench *b, const void *host, size_t bytes, cl_int *err) {
  cl_mem buf = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)host, err);
  return *err == CL_SUCCESS ? buf : NULL;
}

static cl_mem int_buffer(bench *b, const long long *values, size_t count, cl_int *err) {
  int32_t *host = malloc(count * sizeof *host);
  if (!host) {
    *err = CL_OUT_OF_HOST_MEMORY;
    return NULL;
  }
  for (size_t i = 0; i < count; ++i) host[i] = (int32_t)values[i];
  cl_mem buf = host_buffer(b, host, count * sizeof *host, err);
  free(host);
  return buf;
}

/* Offsets of packed sequences: cu[0] = 0, cu[b + 1] = cu[b] + lengths[b]. */
static cl_mem cu_seqlens_buffer(bench *b, const long long *lengths, long long batch, cl_int *err) {
  long long *cu = malloc(sizeof(long long) * (size_t)(batch + 1));
  if (!cu) {
    *err = CL_OUT_OF_HOST_MEMORY;
    return NULL;
  }
  cu[0] = 0;
  for (long long i = 0; i < batch; ++i) cu[i + 1] = cu[i] + lengths[i];
  cl_mem buf = int_buffer(b, cu, (size_t)batch + 1, err);
  free(cu);
  return buf;
}

/* The index buffers desc calls for, into t and desc: cu_seqlens_q and cu_seqlens_k (seqlens_k with paged K/V)
   of packed sequences, the block table of paged K/V. Returns 0 or the failing CL error. */
static cl_int make_indices(bench *b, const batch_lengths *len, fcl_attention_desc *desc, tensors *t) {
  const options *o = &b->opt;
  cl_int err = CL_SUCCESS;
  if (o->varlen) {
    if (!(desc->cu_seqlens_q = t->cu_q = cu_seqlens_buffer(b, len->nq, o->batch, &err))) return err;
    if (o->paged ? !(desc->seqlens_k = t->seqlens_k = int_buffer(b, len->nk, (size_t)o->batch, &err))
                 : !(desc->cu_seqlens_k = t->cu_k = cu_seqlens_buffer(b, len->nk, o->batch, &err)))
      return err;
  }
  if (o->paged) {
    long long *entries = block_table(len, desc);
    if (!entries) return CL_OUT_OF_HOST_MEMORY;
    desc->block_table = t->table = int_buffer(b, entries, (size_t)(desc->batch * desc->block_table_stride), &err);
    free(entries);
  }
  return err;
}

/* The score modifiers' buffers into t and desc: ALiBi's slopes (one row for every batch), the sinks (and
   their gradient when the backward runs), the mask [max_q, max_k] broadcast over batch and heads. Returns 0 or
   the failing CL error. */
static cl_int make_modifiers(bench *b, fcl_attention_desc *desc, int backward, tensors *t) {
  const options *o = &b->opt;
  cl_int err = CL_SUCCESS;
  if (o->alibi) {
    float *slopes = malloc(sizeof(float) * (size_t)o->heads);
    if (!slopes) return CL_OUT_OF_HOST_MEMORY;
    for (long long h = 0; h < o->heads; ++h) slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)o->heads);
    desc->alibi_slopes = t->alibi = host_buffer(b, slopes, sizeof(float) * (size_t)o->heads, &err);
    free(slopes);
    if (!t->alibi) return err;
  }
  if (o->sinks) {
    if (!(desc->sinks = t->sinks = make_buffer(b, (size_t)o->heads, FCL_DTYPE_F32, 1, &err))) return err;
    if (backward && !(desc->d_sinks = t->d_sinks = make_buffer(b, (size_t)o->heads, FCL_DTYPE_F32, 0, &err)))
      return err;
  }
  if (o->mask) {
    const size_t cells = (size_t)desc->seqlen_q * (size_t)desc->seqlen_k;
    if (!(desc->mask = t->mask = make_buffer(b, cells, o->mask_dtype, 1, &err))) return err;
    desc->mask_dtype = o->mask_dtype;
    desc->mask_stride[0] = desc->mask_stride[1] = 0, desc->mask_stride[2] = desc->seqlen_k;
  }
  return err;
}

/* ---- one timed call ---- */

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
    err = enqueue_flush(b);
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
       (split-KV, backward, reference), and with --from-gate every call, is measured from the end of the gate's
       fill (where that has no usable time, the wall clock is used). */
    const int one_kernel = impl == IMPL_FLASH && t->forward.splits <= 1 && !b->opt.from_gate;
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

/* Scores one sequence of nq query rows against nk keys computes, the FLOP count's unit: nq * nk, half of that
   when causal with nq == nk (the usual convention), else with a causal mask or window those it leaves
   visible, counted row by row. */
static double scores_computed(const fcl_attention_desc *desc, long long nq, long long nk) {
  if (!desc->window && (!desc->causal || nq == nk)) return (double)nq * (double)nk * (desc->causal ? 0.5 : 1.0);
  const long long left = desc->window ? desc->window_left : -1, right = desc->causal ? 0 : desc->window_right;
  double visible = 0;
  for (long long i = 0; i < nq; ++i) {
    const long long p = i + nk - nq; /* bottom-right aligned */
    const long long lo = left < 0 ? 0 : p - left, hi = right < 0 ? nk - 1 : p + right;
    const long long n = (hi < nk - 1 ? hi : nk - 1) - (lo > 0 ? lo : 0) + 1;
    visible += n > 0 ? (double)n : 0.0;
  }
  return visible;
}

static void measure(bench *b, int impl, const fcl_attention_desc *desc, const batch_lengths *len, const tensors *t,
                    result *r) {
  const options *o = &b->opt;
  memset(r, 0, sizeof *r);
  r->max_diff = -1;
  r->timer = "events";
  if (impl == IMPL_REFERENCE) r->extra_bytes = fcl_reference_scratch_bytes(b->fcl, desc);
  if (impl == IMPL_BACKWARD) {
    r->extra_bytes = fcl_attention_backward_workspace_size(b->fcl, desc);
    r->plan = t->backward.reason;
  }
  if (impl == IMPL_FLASH) {
    r->plan = t->forward.reason;
    r->extra_bytes = fcl_attention_forward_workspace_size(b->fcl, desc); /* split-KV partials */
    snprintf(r->kernel, sizeof r->kernel, "%s", t->forward.kernel);
    r->splits = t->forward.splits;
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
  double scores = 0;
  for (long long i = 0; i < desc->batch; ++i) scores += scores_computed(desc, len->nq[i], len->nk[i]);
  const double flops = (impl == IMPL_BACKWARD ? 10.0 : 4.0) * (double)desc->num_heads * (double)desc->head_dim * scores;
  r->tflops = flops / (r->median_ms * 1e-3) / 1e12;
  const double kv_bytes = 2.0 * (double)(desc->num_kv_heads ? desc->num_kv_heads : desc->num_heads) *
                          (double)len->total_k * (double)desc->head_dim * (double)elem_size(desc->dtype);
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

/* printf-style text added to the string in buf (size bytes in all), cut to fit. */
static void append(char *buf, size_t size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void append(char *buf, size_t size, const char *fmt, ...) {
  const size_t used = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, size - used, fmt, ap);
  va_end(ap);
}

static void print_header(const bench *b) {
  const options *o = &b->opt;
  if (o->json) return;
  printf("# flashcl-bench %s | device: %s | platform: %s | driver: %s\n", fcl_version(), b->device_name,
         b->platform_name, b->driver);
  char window[160] = "";
  if (o->window) append(window, sizeof window, "  window=(%lld,%lld)", o->window_left, o->window_right);
  if (o->seqlen_q) append(window, sizeof window, "  Nq=%lld (N keys)", o->seqlen_q);
  if (o->bnhd) append(window, sizeof window, "  [B,N,H,d]");
  if (o->softcap > 0) append(window, sizeof window, "  softcap=%g", o->softcap);
  if (o->alibi) append(window, sizeof window, "  alibi");
  if (o->sinks) append(window, sizeof window, "  sinks");
  if (o->mask) append(window, sizeof window, "  mask=%s", dtype_str(o->mask_dtype));
  printf("# dtype %s  B=%lld H=%lld Hkv=%lld d=%lld  causal=%d%s  iters=%d warmup=%d  (median/min/max ms of "
         "device time; TFLOP/s from the median)\n",
         dtype_str(o->dtype), o->batch, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->head_dim, o->causal,
         window, o->iters, o->warmup);
  if (o->varlen) {
    long long shortest = o->varlen[0], total = 0;
    for (long long i = 0; i < o->batch; ++i) {
      total += o->varlen[i];
      if (o->varlen[i] < shortest) shortest = o->varlen[i];
    }
    printf("# varlen: B=%lld sequences of %lld..%lld keys, %lld in all (N below: the longest), packed [total, heads, "
           "d]%s; query rows: %s\n",
           o->batch, shortest, o->seqlens[0], total, o->paged ? ", K/V paged" : "",
           o->seqlen_q ? "Nq per sequence" : "as many as its keys");
  }
  printf("%-6s %-10s %7s %11s %11s %11s %9s %12s %12s  %s\n", "#", "impl", "N", "median_ms", "min_ms", "max_ms",
         "TFLOP/s", "extra_mem", "max|O-Oref|", "status");
}

static void print_result(const bench *b, int impl, const batch_lengths *len, const result *r) {
  const options *o = &b->opt;
  const long long n = len->max_k;
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
    if (o->softcap > 0) printf(",\"softcap\":%g", o->softcap);
    if (o->alibi) printf(",\"alibi\":true");
    if (o->sinks) printf(",\"sinks\":true");
    if (o->mask) printf(",\"mask\":\"%s\"", dtype_str(o->mask_dtype));
    if (o->paged) printf(",\"paged\":%lld", o->paged);
    printf(",\"total_q\":%lld,\"total_k\":%lld", len->total_q, len->total_k);
    if (o->varlen) {
      printf(",\"seqlens_k\":[");
      for (long long i = 0; i < o->batch; ++i) printf("%s%lld", i ? "," : "", len->nk[i]);
      printf("]");
    }
    if (o->varlen_min || o->paged) printf(",\"seed\":%llu", o->seed);
    if (r->kernel[0]) printf(",\"kernel\":\"%s\",\"splits\":%d", r->kernel, r->splits);
    printf(",\"flush_mib\":%lld,\"flush_read\":%s,\"from_gate\":%s", o->flush_mib, o->flush_read ? "true" : "false",
           o->from_gate ? "true" : "false");
    if (r->ok)
      printf(",\"median_ms\":%.6g,\"min_ms\":%.6g,\"max_ms\":%.6g,\"tflops\":%.6g,\"kv_gbps\":%.6g,\"extra_bytes\":%zu,"
             "\"timer\":\"%s\"",
             r->median_ms, r->min_ms, r->max_ms, r->tflops, r->kv_gbps, r->extra_bytes, r->timer);
    if (r->max_diff >= 0) printf(",\"max_abs_diff_vs_flash\":%.3g", r->max_diff);
    if (r->plan && r->plan[0]) {
      printf(",\"plan\":");
      json_string(r->plan);
    }
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
                   &t->cu_q, &t->cu_k, &t->seqlens_k, &t->table, &t->alibi, &t->sinks, &t->d_sinks, &t->mask};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (*all[i]) {
      clReleaseMemObject(*all[i]);
      *all[i] = NULL;
    }
}

/* Allocates every tensor the selected impls need for desc into t (its index buffers already made);
   returns 0, or the failing CL error. */
static cl_int alloc_tensors(bench *b, const fcl_attention_desc *desc, const int impl[IMPL_COUNT], tensors *t) {
  const options *o = &b->opt;
  const size_t hkv = (size_t)(o->kv_heads ? o->kv_heads : o->heads);
  /* Rows of every head: packed sequences' totals, the paged pool's rows, or batch x the dense length. */
  const size_t q_rows = desc->cu_seqlens_q ? (size_t)desc->total_q : (size_t)o->batch * (size_t)desc->seqlen_q;
  const size_t k_rows = desc->block_table    ? (size_t)desc->num_blocks * (size_t)desc->block_size
                        : desc->cu_seqlens_k ? (size_t)desc->total_k
                                             : (size_t)o->batch * (size_t)desc->seqlen_k;
  const size_t qn = q_rows * (size_t)o->heads * (size_t)o->head_dim, kn = k_rows * hkv * (size_t)o->head_dim;
  const size_t rows = q_rows * (size_t)o->heads;
  t->o_elems = qn;
  cl_int err = CL_SUCCESS;
  if (!(t->q = make_buffer(b, qn, o->dtype, 1, &err)) || !(t->k = make_buffer(b, kn, o->dtype, 1, &err)) ||
      !(t->v = make_buffer(b, kn, o->dtype, 1, &err)) || !(t->o = make_buffer(b, qn, o->dtype, 0, &err)) ||
      !(t->lse = make_buffer(b, rows, FCL_DTYPE_F32, 0, &err)))
    return err;
  if (impl[IMPL_REFERENCE] && !(t->o_ref = make_buffer(b, qn, o->dtype, 0, &err))) return err;
  memset(&t->forward, 0, sizeof t->forward);
  if (fcl_describe_plan(b->fcl, FCL_OP_FORWARD, desc, &t->forward) != FCL_SUCCESS) t->forward.splits = 1;
  memset(&t->backward, 0, sizeof t->backward);
  if (impl[IMPL_BACKWARD]) {
    (void)fcl_describe_plan(b->fcl, FCL_OP_BACKWARD, desc, &t->backward);
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
    batch_lengths len;
    if (batch_lengths_init(o, n, &len)) {
      fprintf(stderr, "flashcl-bench: out of host memory\n");
      ++failures;
      break;
    }
    fcl_attention_desc desc;
    describe(o, &len, &desc);
    tensors t;
    memset(&t, 0, sizeof t);
    cl_int err = make_indices(&b, &len, &desc, &t);
    if (err == CL_SUCCESS) err = make_modifiers(&b, &desc, alive[IMPL_BACKWARD], &t);
    if (err == CL_SUCCESS) err = alloc_tensors(&b, &desc, alive, &t);
    if (err != CL_SUCCESS) {
      result r;
      memset(&r, 0, sizeof r);
      r.max_diff = -1;
      snprintf(r.status, sizeof r.status, "out of memory");
      snprintf(r.message, sizeof r.message, "the inputs and outputs for N=%lld do not fit on the device (%s)", n,
               fcl_cl_error_name(err));
      for (int i = 0; i < IMPL_COUNT; ++i)
        if (alive[i]) print_result(&b, i, &len, &r);
      release_tensors(&t);
      batch_lengths_free(&len);
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
      measure(&b, impl, &desc, &len, &t, &r);
      if (impl == IMPL_FLASH) flash_ok = r.ok;
      if (impl == IMPL_REFERENCE && r.ok && flash_ok) r.max_diff = max_abs_diff(&b, t.o, t.o_ref, t.o_elems, o->dtype);
      print_result(&b, impl, &len, &r);
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
    batch_lengths_free(&len);
  }
  free(b.opt.varlen);
  fcl_context_release(b.fcl);
  clReleaseMemObject(b.gate_buf);
  if (b.flush_buf) clReleaseMemObject(b.flush_buf);
  if (b.flush_kernel) clReleaseKernel(b.flush_kernel);
  if (b.flush_program) clReleaseProgram(b.flush_program);
  if (b.flush_sink) clReleaseMemObject(b.flush_sink);
  clReleaseCommandQueue(b.queue);
  clReleaseContext(b.context);
  return failures ? 1 : 0;
}
