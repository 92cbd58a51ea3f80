/* Packed (varlen) queries, packed keys, per-sequence key counts and paged K/V pools, against the float64
 * host reference run on each sequence's own dense tensors (gathered on the host): sequences of lengths 1,
 * 15, 16, 17 and 1000 in one batch; decode (1 query row), speculative (5) and whole prompts; block sizes 1,
 * 3, 16, 64 and 256; block tables in random order with blocks shared between sequences (prefix sharing)
 * and garbage in the unused entries; every score modifier; and planted bad indices (a block outside the
 * pool, a key count beyond seqlen_k, packed offsets past the end), whose documented outcome is checked
 * element by element: NaN in exactly the rows that see a bad block, NaN in every row of a sequence with a
 * bad key count, and nothing written for a sequence whose query offsets do not fit.
 * Usage: test_sequences [--small] [--reference] [--list | --case NAME]
 *   --small              a few small cases, for Oclgrind (which proves no access leaves a buffer)
 *   --reference          the same cases, planted bad indices included, through fcl_attention_reference
 *                        (CLBlast), which must give the forward's documented outcome
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "forward_check.h"
#include "host_reference.h"
#include "internal.h" /* fcl_reference_scratch_bytes */
#include "test_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KV_DENSE = 0, KV_PACKED = 1, KV_PAGED = 2 };
enum { BAD_NONE = 0, BAD_BLOCK, BAD_SEQLEN, BAD_CU_Q, BAD_CU_K };
enum { MAX_SEQS = 8 };

typedef struct seq_case {
  int b, h, hkv, d;
  fcl_dtype dtype;
  int causal;
  int varlen_q;   /* 1: packed queries (cu_seqlens_q) */
  int kv;         /* KV_*: dense [batch] tensors with seqlens_k, packed (cu_seqlens_k) or paged */
  int block_size; /* KV_PAGED */
  int shared;     /* KV_PAGED: the second sequence starts with the first one's blocks */
  int nq;         /* query rows of every sequence; 0: each sequence's whole prompt (nq_b = nk_b) */
  const int *lens; /* b key counts */
  int bad;        /* BAD_*: an index planted to be wrong */
  test_mods mods;
} seq_case;

static const char *kv_names[3] = {"dense", "packed", "paged"};
static const char *bad_names[5] = {"", "_bad-block", "_bad-seqlen", "_bad-cu-q", "_bad-cu-k"};

static void case_name(const seq_case *c, char *out, size_t size) {
  char lens[64] = "", mods[96] = "";
  for (int i = 0; i < c->b; ++i) snprintf(lens + strlen(lens), sizeof lens - strlen(lens), "%s%d", i ? "-" : "", c->lens[i]);
  mods_name(&c->mods, mods, sizeof mods);
  char block[16] = "";
  if (c->kv == KV_PAGED) snprintf(block, sizeof block, "%d%s", c->block_size, c->shared ? "s" : "");
  char nq[16];
  if (c->nq) snprintf(nq, sizeof nq, "%d", c->nq);
  else snprintf(nq, sizeof nq, "prompt");
  snprintf(out, size, "H%d_Hkv%d_d%d_%s%s_q%s%s_%s%s_k%s%s%s", c->h, c->hkv, c->d, dtype_name(c->dtype),
           c->causal ? "_causal" : "", nq, c->varlen_q ? "-packed" : "", kv_names[c->kv], block, lens, mods,
           bad_names[c->bad]);
}

static cl_mem int_buffer(test_env *env, const int *values, size_t count) {
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, count * sizeof(int), (void *)values,
                            &err);
  return err == CL_SUCCESS ? m : NULL;
}

/* A device buffer of n elements of dtype holding host (already rounded), NaN where host is NULL. */
static cl_mem dtype_buffer(test_env *env, const float *host, size_t n, fcl_dtype t) {
  const size_t es = dtype_size(t);
  unsigned char *bytes = malloc(n * es + 1);
  for (size_t i = 0; i < n; ++i) encode_dtype(host ? host[i] : NAN, t, bytes + i * es);
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * es, bytes, &err);
  free(bytes);
  return err == CL_SUCCESS ? m : NULL;
}

static int read_dtype(test_env *env, cl_mem buf, float *out, size_t n, fcl_dtype t) {
  const size_t es = dtype_size(t);
  unsigned char *bytes = malloc(n * es + 1);
  const int bad = clEnqueueReadBuffer(env->queue, buf, CL_TRUE, 0, n * es, bytes, 0, NULL, NULL) != CL_SUCCESS;
  for (size_t i = 0; i < n && !bad; ++i) out[i] = decode_dtype(bytes + i * es, t);
  free(bytes);
  return bad;
}

static float rnd(fcl_dtype t) { return round_to_dtype((float)test_uniform(), t); }

/* Runs case c through fn (fcl_attention_forward or fcl_attention_reference); label names fn in messages. */
static void run_sequence_case(test_env *env, const seq_case *c, fwd_fn fn, const char *label) {
  char name[TEST_CASE_NAME_MAX];
  case_name(c, name, sizeof name);
  const int B = c->b, H = c->h, Hkv = c->hkv, D = c->d;
  int nk[MAX_SEQS], nq[MAX_SEQS], nq_max = 0, nk_max = 0, total_q = 0, total_k = 0;
  int cu_q[MAX_SEQS + 1] = {0}, cu_k[MAX_SEQS + 1] = {0};
  for (int b = 0; b < B; ++b) {
    nk[b] = c->lens[b];
    nq[b] = c->nq ? c->nq : nk[b];
    nq_max = nq[b] > nq_max ? nq[b] : nq_max, nk_max = nk[b] > nk_max ? nk[b] : nk_max;
    cu_q[b + 1] = cu_q[b] + nq[b], cu_k[b + 1] = cu_k[b] + nk[b];
  }
  if (!c->varlen_q) /* dense queries: every sequence has nq_max rows */
    for (int b = 0; b < B; ++b) nq[b] = nq_max, cu_q[b + 1] = cu_q[b] + nq_max;
  total_q = cu_q[B], total_k = cu_k[B];

  /* Each sequence's logical tensors [H or Hkv][n][D], rounded to the dtype. */
  float *sq[MAX_SEQS], *sk[MAX_SEQS], *sv[MAX_SEQS];
  for (int b = 0; b < B; ++b) {
    sq[b] = malloc((size_t)H * nq[b] * D * sizeof(float) + 1);
    sk[b] = malloc((size_t)Hkv * nk[b] * D * sizeof(float) + 1);
    sv[b] = malloc((size_t)Hkv * nk[b] * D * sizeof(float) + 1);
    for (long i = 0; i < (long)H * nq[b] * D; ++i) sq[b][i] = rnd(c->dtype);
    for (long i = 0; i < (long)Hkv * nk[b] * D; ++i) sk[b][i] = rnd(c->dtype), sv[b][i] = rnd(c->dtype);
  }

  /* Paged: each sequence's blocks, in random order through the pool; with sharing, the second sequence
     starts with the first one's full blocks (their keys made equal). Spare blocks hold NaN. */
  const int bs = c->block_size > 0 ? c->block_size : 1;
  int table_stride = (nk_max + bs - 1) / bs + 1, num_blocks = 0;
  int *table = calloc((size_t)B * table_stride, sizeof(int));
  int shared_blocks = 0;
  if (c->kv == KV_PAGED) {
    if (c->shared && B >= 2) {
      shared_blocks = (nk[0] < nk[1] ? nk[0] : nk[1]) / bs;
      for (int hk = 0; hk < Hkv; ++hk)
        for (long j = 0; j < (long)shared_blocks * bs; ++j)
          for (int d = 0; d < D; ++d) {
            sk[1][((long)hk * nk[1] + j) * D + d] = sk[0][((long)hk * nk[0] + j) * D + d];
            sv[1][((long)hk * nk[1] + j) * D + d] = sv[0][((long)hk * nk[0] + j) * D + d];
          }
    }
    int used = 0;
    for (int b = 0; b < B; ++b) used += (nk[b] + bs - 1) / bs - (b == 1 ? shared_blocks : 0);
    num_blocks = used + 3;
    int *perm = malloc((size_t)num_blocks * sizeof(int));
    for (int i = 0; i < num_blocks; ++i) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; --i) {
      const int j = (int)((test_uniform() + 1.0) * 0.5 * (i + 1)) % (i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    int next = 0;
    for (int b = 0; b < B; ++b)
      for (int e = 0; e < table_stride; ++e) {
        int *slot = &table[b * table_stride + e];
        if (e >= (nk[b] + bs - 1) / bs) *slot = e % 2 ? -5 : num_blocks + 1000 * e; /* never followed */
        else if (b == 1 && e < shared_blocks) *slot = table[e];
        else *slot = perm[next++];
      }
    free(perm);
  }

  /* Device tensors. Queries and outputs: packed [total_q, H, D] or dense [B, H, nq_max, D]. Keys: dense
     [B, Hkv, nk_max, D] (rows past a sequence's count NaN), packed [total_k, Hkv, D], or a pool in vLLM's
     order [num_blocks, block_size, Hkv, D]. */
  const size_t q_elems = (size_t)total_q * H * D;
  float *hq = malloc(q_elems * sizeof(float));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < nq[b]; ++i)
        for (int d = 0; d < D; ++d) {
          const size_t at = c->varlen_q ? ((size_t)(cu_q[b] + i) * H + h) * D + d
                                        : (((size_t)b * H + h) * nq_max + i) * D + d;
          hq[at] = sq[b][((size_t)h * nq[b] + i) * D + d];
        }
  size_t kv_elems = c->kv == KV_DENSE    ? (size_t)B * Hkv * nk_max * D
                    : c->kv == KV_PACKED ? (size_t)total_k * Hkv * D
                                         : (size_t)num_blocks * bs * Hkv * D;
  float *hk = malloc(kv_elems * sizeof(float)), *hv = malloc(kv_elems * sizeof(float));
  for (size_t i = 0; i < kv_elems; ++i) hk[i] = hv[i] = NAN;
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < Hkv; ++g)
      for (int j = 0; j < nk[b]; ++j) {
        size_t at;
        if (c->kv == KV_DENSE) at = (((size_t)b * Hkv + g) * nk_max + j) * D;
        else if (c->kv == KV_PACKED) at = ((size_t)(cu_k[b] + j) * Hkv + g) * D;
        else at = (((size_t)table[b * table_stride + j / bs] * bs + j % bs) * Hkv + g) * D;
        for (int d = 0; d < D; ++d) {
          hk[at + d] = sk[b][((size_t)g * nk[b] + j) * D + d];
          hv[at + d] = sv[b][((size_t)g * nk[b] + j) * D + d];
        }
      }

  /* Planted bad indices, and what each must give. The last sequence is the victim. */
  const int victim = B - 1;
  int seqlens[MAX_SEQS];
  for (int b = 0; b < B; ++b) seqlens[b] = nk[b];
  int bad_block_entry = -1; /* BAD_BLOCK: the victim's logical block that points outside the pool */
  if (c->bad == BAD_BLOCK) {
    bad_block_entry = (nk[victim] - 1) / bs / 2;
    table[victim * table_stride + bad_block_entry] = num_blocks + 7;
  }
  if (c->bad == BAD_SEQLEN) seqlens[victim] = nk_max + 1;
  if (c->bad == BAD_CU_Q) cu_q[B] = total_q + 1;
  if (c->bad == BAD_CU_K) cu_k[B] = total_k + 1;

  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = B, desc.num_heads = H, desc.num_kv_heads = Hkv, desc.seqlen_q = nq_max, desc.seqlen_k = nk_max;
  desc.head_dim = D, desc.dtype = c->dtype, desc.causal = c->causal;
  mod_buffers mb;
  memset(&mb, 0, sizeof mb);
  cl_mem q = dtype_buffer(env, hq, q_elems, c->dtype), o = dtype_buffer(env, NULL, q_elems, c->dtype);
  cl_mem k = dtype_buffer(env, hk, kv_elems, c->dtype), v = dtype_buffer(env, hv, kv_elems, c->dtype);
  cl_mem lse = create_float_buffer(env, (size_t)total_q * H, NAN);
  cl_mem cuq = NULL, cuk = NULL, lens = NULL, tab = NULL;
  int setup = !q || !o || !k || !v || !lse || mods_create(env, &c->mods, &desc, &mb);
  if (c->varlen_q) {
    setup |= !(cuq = int_buffer(env, cu_q, (size_t)B + 1));
    desc.cu_seqlens_q = cuq, desc.total_q = total_q;
  }
  if (c->kv == KV_PACKED) {
    setup |= !(cuk = int_buffer(env, cu_k, (size_t)B + 1));
    desc.cu_seqlens_k = cuk, desc.total_k = total_k;
  } else {
    setup |= !(lens = int_buffer(env, seqlens, (size_t)B));
    desc.seqlens_k = lens;
  }
  if (c->kv == KV_PAGED) {
    setup |= !(tab = int_buffer(env, table, (size_t)B * table_stride));
    desc.block_table = tab, desc.block_table_stride = table_stride, desc.block_size = bs, desc.num_blocks = num_blocks;
    const int64_t pool_stride[3] = {(int64_t)bs * Hkv * D, D, (int64_t)Hkv * D};
    memcpy(desc.k_stride, pool_stride, sizeof pool_stride);
    memcpy(desc.v_stride, pool_stride, sizeof pool_stride);
  }

  float *got = malloc(q_elems * sizeof(float)), *got_lse = malloc((size_t)total_q * H * sizeof(float));
  fcl_status st = FCL_ERROR_OPENCL;
  if (!setup) {
    cl_event ev = NULL;
    st = fn(env->fcl, env->queue, &desc, q, k, v, o, lse, 0, NULL, &ev);
    if (st == FCL_SUCCESS) {
      clWaitForEvents(1, &ev);
      clReleaseEvent(ev);
      if (read_dtype(env, o, got, q_elems, c->dtype) || read_floats(env, lse, got_lse, (size_t)total_q * H))
        st = FCL_ERROR_OPENCL;
    }
  }

  /* The host reference, sequence by sequence, on its own dense tensors. */
  double err2 = 0, ref2 = 0, max_abs = 0, lse_max = 0;
  long nan_wrong = 0, checked_rows = 0;
  if (st == FCL_SUCCESS) {
    for (int b = 0; b < B; ++b) {
      fcl_attention_desc one = desc;
      one.batch = 1, one.seqlen_q = nq[b], one.seqlen_k = nk[b];
      one.cu_seqlens_q = one.cu_seqlens_k = one.seqlens_k = one.block_table = NULL;
      double *rq = to_double(sq[b], (size_t)H * nq[b] * D), *rk = to_double(sk[b], (size_t)Hkv * nk[b] * D);
      double *rv = to_double(sv[b], (size_t)Hkv * nk[b] * D);
      if (b == victim && c->bad == BAD_BLOCK) /* the keys of the bad block read as NaN */
        for (int g = 0; g < Hkv; ++g)
          for (int j = bad_block_entry * bs; j < (bad_block_entry + 1) * bs && j < nk[b]; ++j)
            for (int d = 0; d < D; ++d) rk[((size_t)g * nk[b] + j) * D + d] = rv[((size_t)g * nk[b] + j) * D + d] = NAN;
      /* This sequence's modifiers: slopes of batch b, the mask rows of batch b. */
      host_mods hm = mb.host;
      double *mask = NULL;
      if (mb.host.slopes) hm.slopes = mb.host.slopes + (size_t)b * H;
      if (mb.host.mask) {
        mask = malloc((size_t)H * nq[b] * nk[b] * sizeof(double) + 1);
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < nq[b]; ++i)
            for (int j = 0; j < nk[b]; ++j)
              mask[((size_t)h * nq[b] + i) * nk[b] + j] =
                  mb.host.mask[(((size_t)b * H + h) * nq_max + i) * nk_max + j];
        hm.mask = mask;
      }
      double *ro = malloc((size_t)H * nq[b] * D * sizeof(double) + 1), *rl = malloc((size_t)H * nq[b] * sizeof(double) + 1);
      reference_forward(&one, &hm, rq, rk, rv, ro, rl);
      const int whole_nan = b == victim && (c->bad == BAD_SEQLEN || c->bad == BAD_CU_K);
      const int unwritten = b == victim && c->bad == BAD_CU_Q; /* still the NaN poison */
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < nq[b]; ++i) {
          ++checked_rows;
          const size_t row = c->varlen_q ? (size_t)(cu_q[b] + i) * H + h : ((size_t)b * H + h) * nq_max + i;
          const size_t lrow = c->varlen_q ? (size_t)h * total_q + cu_q[b] + i : ((size_t)b * H + h) * nq_max + i;
          const double rlse = rl[(size_t)h * nq[b] + i];
          const float gl = got_lse[lrow];
          if (whole_nan || unwritten || isnan(rlse)) nan_wrong += !isnan(gl);
          else if (rlse == -INFINITY) nan_wrong += gl != -INFINITY;
          else lse_max = fmax(lse_max, isnan(gl) ? INFINITY : fabs(gl - rlse));
          for (int d = 0; d < D; ++d) {
            const double r = ro[((size_t)h * nq[b] + i) * D + d];
            const float g = got[row * D + d];
            if (whole_nan || unwritten || isnan(r)) {
              nan_wrong += !isnan(g);
              continue;
            }
            const double e = isnan(g) ? INFINITY : fabs(g - r);
            err2 += e * e, ref2 += r * r, max_abs = fmax(max_abs, e);
          }
        }
      free(rq), free(rk), free(rv), free(ro), free(rl), free(mask);
    }
  }
  const double rel = sqrt(err2) / fmax(sqrt(ref2), 1e-30), tol = forward_tolerance(c->dtype);
  /* The reference may refuse only as a build or device limit, never the sequences themselves. */
  if (st == FCL_ERROR_UNSUPPORTED && fn == fcl_attention_reference &&
      (strstr(fcl_last_error(), "without CLBlast") || strstr(fcl_last_error(), "loop budget")))
    skip("%s %s: %s", label, name, fcl_last_error());
  else if (st != FCL_SUCCESS) check(0, "%s %s: %s: %s", label, name, fcl_status_string(st), fcl_last_error());
  else
    check(rel <= tol && lse_max <= FWD_TOL_LSE && nan_wrong == 0,
          "%s %s: rel %.2e (bound %.1e) max abs %.2e, lse max abs %.2e (bound %.0e), %ld rows, %ld elements "
          "where the expected NaN, -inf or poison differs",
          label, name, rel, tol, max_abs, lse_max, FWD_TOL_LSE, checked_rows, nan_wrong);

  free(got), free(got_lse), free(hq), free(hk), free(hv), free(table);
  for (int b = 0; b < B; ++b) free(sq[b]), free(sk[b]), free(sv[b]);
  cl_mem bufs[] = {q, o, k, v, lse, cuq, cuk, lens, tab};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  mods_release(&mb);
}

static void run_forward(test_env *env, const void *c) { run_sequence_case(env, c, fcl_attention_forward, "forward"); }
static void run_reference(test_env *env, const void *c) {
  run_sequence_case(env, c, fcl_attention_reference, "reference");
}

/* The reference's scratch counts the gathered tensors: packed queries and paged keys add float32 copies of Q, K
   and O (padded to the longest sequence) to what the same shape on dense contiguous float32 tensors needs (which
   CLBlast reads in place), and nothing else. */
static void run_reference_scratch(test_env *env, const void *unused) {
  (void)unused;
  if (getenv("FLASHCL_REFERENCE_CHUNK")) {
    skip("reference scratch: FLASHCL_REFERENCE_CHUNK changes the chunk this check assumes");
    return;
  }
  enum { B = 2, H = 2, NQ = 5, NK = 7, D = 8 };
  fcl_attention_desc dense;
  memset(&dense, 0, sizeof dense);
  dense.batch = B, dense.num_heads = H, dense.seqlen_q = NQ, dense.seqlen_k = NK, dense.head_dim = D;
  dense.dtype = FCL_DTYPE_F32;
  const int cu[B + 1] = {0, 3, 8}, table[B * 2] = {0, 1, 2, 3};
  cl_mem cuq = int_buffer(env, cu, B + 1), tab = int_buffer(env, table, B * 2);
  fcl_attention_desc seq = dense;
  seq.cu_seqlens_q = cuq, seq.total_q = 8;
  seq.block_table = tab, seq.block_table_stride = 2, seq.block_size = 4, seq.num_blocks = 4;
  const size_t base = fcl_reference_scratch_bytes(env->fcl, &dense), with = fcl_reference_scratch_bytes(env->fcl, &seq);
  const size_t copies = (size_t)B * H * (2 * NQ + NK) * D * sizeof(float);
  if (base == 0 && with == 0) skip("reference scratch: 0 bytes (built without CLBlast)");
  else
    check(cuq && tab && base > 0 && with == base + copies,
          "reference scratch: %zu bytes dense, %zu packed and paged (expected %zu more: the Q, K and O copies)", base,
          with, copies);
  if (cuq) clReleaseMemObject(cuq);
  if (tab) clReleaseMemObject(tab);
}

/* ---- the case lists ---- */

static const int lens_mixed[5] = {1, 15, 16, 17, 1000};
static const int lens_short[3] = {5, 1, 17};
static const int lens_two[2] = {40, 33};

static int add(seq_case *list, int n, seq_case c) {
  list[n] = c;
  return n + 1;
}

static int small_cases(seq_case *list) {
  int n = 0;
  const test_mods none = {0};
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F32, 1, 1, KV_PAGED, 3, 0, 0, lens_short, BAD_NONE, none});
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F16, 1, 1, KV_PAGED, 4, 0, 0, lens_short, BAD_BLOCK, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 2, lens_short, BAD_CU_Q, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_BF16, 0, 0, KV_DENSE, 0, 0, 1, lens_short, BAD_SEQLEN, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K, none});
  return n;
}

static int full_cases(seq_case *list) {
  int n = 0;
  const test_mods none = {0};
  static const fcl_dtype dt[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  /* Paged decode, speculative and chunked prefill over every block size; prefix sharing. */
  static const int block_sizes[5] = {1, 3, 16, 64, 256};
  for (int i = 0; i < 5; ++i) {
    n = add(list, n, (seq_case){5, 8, 2, 64, dt[i % 3], 1, 0, KV_PAGED, block_sizes[i], i % 2, 1, lens_mixed, 0, none});
    n = add(list, n, (seq_case){5, 4, 4, 40, dt[(i + 1) % 3], 1, 1, KV_PAGED, block_sizes[i], 0, 5, lens_mixed, 0, none});
  }
  n = add(list, n, (seq_case){2, 4, 1, 64, FCL_DTYPE_F16, 1, 1, KV_PAGED, 16, 1, 0, lens_two, 0, none});
  /* Varlen prefill: packed queries and keys, whole prompts, causal and not. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (seq_case){5, 4, 2, 64, dt[t], 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, none});
    n = add(list, n, (seq_case){3, 2, 2, 33, dt[t], 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, none});
  }
  /* Dense [batch] keys with per-sequence counts (a padded KV cache), decode and 5 rows. */
  n = add(list, n, (seq_case){5, 8, 1, 128, FCL_DTYPE_F16, 1, 0, KV_DENSE, 0, 0, 1, lens_mixed, 0, none});
  n = add(list, n, (seq_case){5, 2, 2, 16, FCL_DTYPE_F32, 0, 0, KV_DENSE, 0, 0, 5, lens_mixed, 0, none});
  /* Every modifier with each layout. */
  const test_mods all = {1.5f, 2, MASK_FULL_F32, 0, 1, 9, 2, 1}, ggml = {0, 1, MASK_GGML_F16, 1, 0, 0, 0, 1};
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PAGED, 16, 0, 0, lens_short, 0, all});
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F16, 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, ggml});
  n = add(list, n, (seq_case){3, 4, 4, 32, FCL_DTYPE_BF16, 1, 0, KV_DENSE, 0, 0, 3, lens_short, 0, all});
  /* Planted bad indices. */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PAGED, 16, 0, 0, lens_mixed, BAD_BLOCK, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 0, KV_PAGED, 16, 0, 1, lens_mixed, BAD_BLOCK, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 0, KV_PAGED, 16, 0, 1, lens_mixed, BAD_SEQLEN, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K, none});
  return n;
}

int main(int argc, char **argv) {
  int small = 0, reference = 0;
  test_cli cli = {0, NULL};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--reference")) reference = 1;
    else if (!test_cli_option(&cli, argc, argv, &i)) {
      fprintf(stderr, "usage: %s [--small] [--reference] [--list | --case NAME]\n", argv[0]);
      return 2;
    }
  }
  enum { MAX = 64 };
  static seq_case cases[MAX];
  static test_case list[MAX];
  const int count = small ? small_cases(cases) : full_cases(cases);
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, reference ? run_reference : run_forward, &cases[i]);
  }
  if (reference && !small) n = test_case_add(list, n, MAX, "", "scratch_counts_gathered_tensors", run_reference_scratch, NULL);
  return test_cases_main("test_sequences", &cli, list, n);
}
