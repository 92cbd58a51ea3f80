#include "sequence_inputs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *kv_names[3] = {"dense", "packed", "paged"};
static const char *bad_names[11] = {"", "_bad-block", "_bad-seqlen", "_bad-cu-q", "_bad-cu-k", "_bad-cu-q-order",
                                    "_bad-cu-k-order", "_bad-cu-q-order-early", "_bad-cu-k-order-early",
                                    "_bad-cu-q-negative", "_bad-cu-k-negative"};

/* The ranges a cu_seqlens plant moves (ORDER 1, ORDER_EARLY 2, any other 0), and in *in_q whether an order or
   NEGATIVE plant goes into cu_seqlens_q (else cu_seqlens_k). */
static int order_plant(int bad, int *in_q) {
  *in_q = bad == BAD_CU_Q_ORDER || bad == BAD_CU_Q_ORDER_EARLY || bad == BAD_CU_Q_NEGATIVE;
  return bad == BAD_CU_Q_ORDER || bad == BAD_CU_K_ORDER ? 1 : bad == BAD_CU_Q_ORDER_EARLY || bad == BAD_CU_K_ORDER_EARLY ? 2 : 0;
}

int seq_bad_for(const seq_case *c, int b) {
  int in_q;
  const int moved = order_plant(c->bad, &in_q);
  const int negative = c->bad == BAD_CU_Q_NEGATIVE || c->bad == BAD_CU_K_NEGATIVE;
  if (moved || negative) return negative || b >= c->b - moved - 1 ? (in_q ? BAD_CU_Q : BAD_CU_K) : BAD_NONE;
  return b == c->b - 1 ? c->bad : BAD_NONE;
}

/* The order plant: the last `moved` of B ranges moved down together so that the first of them starts one row
   before the range ahead of it, their lengths kept (so within the bounds each is checked against on its own). 0
   when it cannot be planted. */
static int plant_overlap(int *cu, int B, int moved) {
  const int k = B - moved; /* the first moved range's start */
  if (k < 2 || cu[k - 1] < 1) return 0;
  const int shift = cu[k] - cu[k - 1] + 1;
  for (int i = k; i <= B; ++i) cu[i] -= shift;
  return 1;
}

void seq_case_name(const seq_case *c, char *out, size_t size) {
  char lens[64] = "", mods[96] = "";
  for (int i = 0; i < c->b; ++i) snprintf(lens + strlen(lens), sizeof lens - strlen(lens), "%s%d", i ? "-" : "", c->lens[i]);
  mods_name(&c->mods, mods, sizeof mods);
  char block[16] = "";
  if (c->kv == KV_PAGED) snprintf(block, sizeof block, "%d%s", c->block_size, c->shared ? "s" : "");
  char nq[16];
  if (c->nq) snprintf(nq, sizeof nq, "%d", c->nq);
  else snprintf(nq, sizeof nq, "prompt");
  char spare[24] = "";
  if (c->spare_k) snprintf(spare, sizeof spare, "_seqused-spare%d", c->spare_k);
  snprintf(out, size, "H%d_Hkv%d_d%d_%s%s_q%s%s_%s%s_k%s%s%s%s", c->h, c->hkv, c->d, dtype_name(c->dtype),
           c->causal ? "_causal" : "", nq, c->varlen_q ? "-packed" : "", kv_names[c->kv], block, lens, spare, mods,
           bad_names[c->bad]);
}

cl_mem seq_int_buffer(test_env *env, const int *values, size_t count) {
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, count * sizeof(int), (void *)values,
                            &err);
  return err == CL_SUCCESS ? m : NULL;
}

cl_mem seq_dtype_buffer(test_env *env, const float *host, size_t n, fcl_dtype t, float fill) {
  const size_t es = dtype_size(t);
  unsigned char *bytes = malloc(n * es + 1);
  for (size_t i = 0; i < n; ++i) encode_dtype(host ? host[i] : fill, t, bytes + i * es);
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * es, bytes, &err);
  free(bytes);
  return err == CL_SUCCESS ? m : NULL;
}

int seq_read_dtype(test_env *env, cl_mem buf, float *out, size_t n, fcl_dtype t) {
  const size_t es = dtype_size(t);
  unsigned char *bytes = malloc(n * es + 1);
  const int bad = clEnqueueReadBuffer(env->queue, buf, CL_TRUE, 0, n * es, bytes, 0, NULL, NULL) != CL_SUCCESS;
  for (size_t i = 0; i < n && !bad; ++i) out[i] = decode_dtype(bytes + i * es, t);
  free(bytes);
  return bad;
}

static float rnd(fcl_dtype t) { return round_to_dtype((float)test_uniform(), t); }

size_t seq_q_at(const seq_inputs *in, int b, int h, int i) {
  const int H = in->c->h, D = in->c->d;
  return in->c->varlen_q ? ((size_t)(in->cu_q[b] + i) * H + h) * D : (((size_t)b * H + h) * in->nq_max + i) * D;
}

size_t seq_lse_at(const seq_inputs *in, int b, int h, int i) {
  return in->c->varlen_q ? (size_t)h * in->total_q + in->cu_q[b] + i : ((size_t)b * in->c->h + h) * in->nq_max + i;
}

size_t seq_kv_at(const seq_inputs *in, int b, int g, int j) {
  const int Hkv = in->c->hkv, D = in->c->d, bs = in->bs;
  if (in->c->kv == KV_DENSE) return (((size_t)b * Hkv + g) * in->nk_max + j) * D;
  if (in->c->kv == KV_PACKED) return ((size_t)(in->cu_k[b] + j) * Hkv + g) * D;
  /* A planted bad entry names no block: (size_t)-1. */
  const int blk = b == in->c->b - 1 && j / bs == in->bad_block_entry ? -1 : in->table[b * in->table_stride + j / bs];
  return blk < 0 ? (size_t)-1 : (((size_t)blk * bs + j % bs) * Hkv + g) * D;
}

float *seq_layout(const seq_inputs *in, float *const *per_seq, int kv_side) {
  const int D = in->c->d, heads = kv_side ? in->c->hkv : in->c->h;
  const size_t n = kv_side ? in->kv_elems : in->q_elems;
  float *out = malloc(n * sizeof(float) + 1);
  for (size_t i = 0; i < n; ++i) out[i] = NAN;
  for (int b = 0; b < in->c->b; ++b) {
    const int rows = kv_side ? in->nk[b] : in->nq[b];
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < rows; ++i) {
        const size_t at = kv_side ? seq_kv_at(in, b, h, i) : seq_q_at(in, b, h, i);
        if (at == (size_t)-1) continue;
        memcpy(out + at, per_seq[b] + ((size_t)h * rows + i) * D, (size_t)D * sizeof(float));
      }
  }
  return out;
}

int seq_inputs_create(test_env *env, const seq_case *c, seq_inputs *in) {
  memset(in, 0, sizeof *in);
  in->c = c;
  in->bad_block_entry = -1;
  const int B = c->b, H = c->h, Hkv = c->hkv, D = c->d, spare = c->kv == KV_PACKED ? c->spare_k : 0;
  for (int b = 0; b < B; ++b) {
    in->nk[b] = c->lens[b];
    in->nq[b] = c->nq ? c->nq : in->nk[b];
    if (in->nq[b] > in->nq_max) in->nq_max = in->nq[b];
    if (in->nk[b] + spare > in->nk_max) in->nk_max = in->nk[b] + spare;
    in->cu_q[b + 1] = in->cu_q[b] + in->nq[b], in->cu_k[b + 1] = in->cu_k[b] + in->nk[b] + spare;
  }
  if (!c->varlen_q) /* dense queries: every sequence has nq_max rows */
    for (int b = 0; b < B; ++b) in->nq[b] = in->nq_max, in->cu_q[b + 1] = in->cu_q[b] + in->nq_max;
  in->total_q = in->cu_q[B], in->total_k = in->cu_k[B];

  for (int b = 0; b < B; ++b) {
    const size_t nq = (size_t)H * in->nq[b] * D, nk = (size_t)Hkv * in->nk[b] * D;
    in->sq[b] = malloc(nq * sizeof(float) + 1);
    in->sk[b] = malloc(nk * sizeof(float) + 1);
    in->sv[b] = malloc(nk * sizeof(float) + 1);
    for (size_t i = 0; i < nq; ++i) in->sq[b][i] = rnd(c->dtype);
    for (size_t i = 0; i < nk; ++i) in->sk[b][i] = rnd(c->dtype), in->sv[b][i] = rnd(c->dtype);
  }

  /* Paged: each sequence's blocks, in random order through the pool; with sharing, the second sequence
     starts with the first one's full blocks (their keys made equal). Spare blocks hold NaN. */
  const int bs = in->bs = c->block_size > 0 ? c->block_size : 1;
  in->table_stride = (in->nk_max + bs - 1) / bs + 1;
  in->table = calloc((size_t)B * in->table_stride, sizeof(int));
  if (c->kv == KV_PAGED) {
    int shared_blocks = 0;
    if (c->shared && B >= 2) {
      const int *nk = in->nk;
      shared_blocks = (nk[0] < nk[1] ? nk[0] : nk[1]) / bs;
      for (int hk = 0; hk < Hkv; ++hk)
        for (long j = 0; j < (long)shared_blocks * bs; ++j)
          for (int d = 0; d < D; ++d) {
            in->sk[1][((long)hk * nk[1] + j) * D + d] = in->sk[0][((long)hk * nk[0] + j) * D + d];
            in->sv[1][((long)hk * nk[1] + j) * D + d] = in->sv[0][((long)hk * nk[0] + j) * D + d];
          }
    }
    int used = 0;
    for (int b = 0; b < B; ++b) used += (in->nk[b] + bs - 1) / bs - (b == 1 ? shared_blocks : 0);
    in->num_blocks = used + 3;
    int *perm = malloc((size_t)in->num_blocks * sizeof(int));
    for (int i = 0; i < in->num_blocks; ++i) perm[i] = i;
    for (int i = in->num_blocks - 1; i > 0; --i) {
      const int j = (int)((test_uniform() + 1.0) * 0.5 * (i + 1)) % (i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    int next = 0;
    for (int b = 0; b < B; ++b)
      for (int e = 0; e < in->table_stride; ++e) {
        int *slot = &in->table[b * in->table_stride + e];
        if (e >= (in->nk[b] + bs - 1) / bs) *slot = e % 2 ? -5 : in->num_blocks + 1000 * e; /* never followed */
        else if (b == 1 && e < shared_blocks) *slot = in->table[e];
        else *slot = perm[next++];
      }
    free(perm);
  }

  /* Device tensors. Queries and outputs: packed [total_q, H, D] or dense [B, H, nq_max, D]. Keys: dense
     [B, Hkv, nk_max, D] (rows past a sequence's count NaN), packed [total_k, Hkv, D], or a pool in vLLM's
     order [num_blocks, block_size, Hkv, D]. */
  in->q_elems = (size_t)in->total_q * H * D;
  in->kv_elems = c->kv == KV_DENSE    ? (size_t)B * Hkv * in->nk_max * D
                 : c->kv == KV_PACKED ? (size_t)in->total_k * Hkv * D
                                      : (size_t)in->num_blocks * bs * Hkv * D;
  float *hq = seq_layout(in, in->sq, 0), *hk = seq_layout(in, in->sk, 1), *hv = seq_layout(in, in->sv, 1);

  /* Planted bad indices, in the last sequence. */
  const int victim = B - 1;
  int seqlens[MAX_SEQS], cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
  memcpy(seqlens, in->nk, sizeof seqlens);
  memcpy(cu_q, in->cu_q, sizeof cu_q);
  memcpy(cu_k, in->cu_k, sizeof cu_k);
  if (c->bad == BAD_BLOCK) {
    in->bad_block_entry = (in->nk[victim] - 1) / bs / 2;
    in->table[victim * in->table_stride + in->bad_block_entry] = in->num_blocks + 7;
  }
  if (c->bad == BAD_SEQLEN) seqlens[victim] = in->nk_max + 1;
  if (c->bad == BAD_CU_Q) cu_q[B] = in->total_q + 1;
  if (c->bad == BAD_CU_K) cu_k[B] = in->total_k + 1;
  int in_q, setup = 0;
  const int moved = order_plant(c->bad, &in_q);
  if (moved) setup = !plant_overlap(in_q ? cu_q : cu_k, B, moved);
  if (c->bad == BAD_CU_Q_NEGATIVE) cu_q[0] = -1;
  if (c->bad == BAD_CU_K_NEGATIVE) cu_k[0] = -1;

  fcl_attention_desc *desc = &in->desc;
  memset(desc, 0, sizeof *desc);
  desc->batch = B, desc->num_heads = H, desc->num_kv_heads = Hkv, desc->seqlen_q = in->nq_max;
  desc->seqlen_k = in->nk_max, desc->head_dim = D, desc->dtype = c->dtype, desc->causal = c->causal;
  in->q = seq_dtype_buffer(env, hq, in->q_elems, c->dtype, NAN);
  in->k = seq_dtype_buffer(env, hk, in->kv_elems, c->dtype, NAN);
  in->v = seq_dtype_buffer(env, hv, in->kv_elems, c->dtype, NAN);
  free(hq), free(hk), free(hv);
  setup |= !in->q || !in->k || !in->v || mods_create(env, &c->mods, desc, &in->mb);
  if (c->varlen_q) {
    setup |= !(in->cuq = seq_int_buffer(env, cu_q, (size_t)B + 1));
    desc->cu_seqlens_q = in->cuq, desc->total_q = in->total_q;
  }
  if (c->kv == KV_PACKED) {
    setup |= !(in->cuk = seq_int_buffer(env, cu_k, (size_t)B + 1));
    desc->cu_seqlens_k = in->cuk, desc->total_k = in->total_k;
  }
  if (c->kv != KV_PACKED || spare) {
    setup |= !(in->lens = seq_int_buffer(env, seqlens, (size_t)B));
    desc->seqlens_k = in->lens;
  }
  if (c->kv == KV_PAGED) {
    setup |= !(in->tab = seq_int_buffer(env, in->table, (size_t)B * in->table_stride));
    desc->block_table = in->tab, desc->block_table_stride = in->table_stride, desc->block_size = bs;
    desc->num_blocks = in->num_blocks;
    const int64_t pool_stride[3] = {(int64_t)bs * Hkv * D, D, (int64_t)Hkv * D};
    memcpy(desc->k_stride, pool_stride, sizeof pool_stride);
    memcpy(desc->v_stride, pool_stride, sizeof pool_stride);
  }
  return setup;
}

void seq_inputs_release(seq_inputs *in) {
  for (int b = 0; b < MAX_SEQS; ++b) free(in->sq[b]), free(in->sk[b]), free(in->sv[b]);
  free(in->table);
  cl_mem bufs[] = {in->q, in->k, in->v, in->cuq, in->cuk, in->lens, in->tab};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  mods_release(&in->mb);
  memset(in, 0, sizeof *in);
}

void seq_reference_make(const seq_inputs *in, int b, seq_reference *r) {
  const seq_case *c = in->c;
  const int H = c->h, Hkv = c->hkv, D = c->d, nq = in->nq[b], nk = in->nk[b];
  memset(r, 0, sizeof *r);
  r->desc = in->desc;
  r->desc.batch = 1, r->desc.seqlen_q = nq, r->desc.seqlen_k = nk;
  r->desc.cu_seqlens_q = r->desc.cu_seqlens_k = r->desc.seqlens_k = r->desc.block_table = NULL;
  r->desc.total_q = r->desc.total_k = r->desc.block_table_stride = r->desc.block_size = r->desc.num_blocks = 0;
  r->q = to_double(in->sq[b], (size_t)H * nq * D);
  r->k = to_double(in->sk[b], (size_t)Hkv * nk * D);
  r->v = to_double(in->sv[b], (size_t)Hkv * nk * D);
  if (b == c->b - 1 && c->bad == BAD_BLOCK) /* the keys of the bad block read as NaN */
    for (int g = 0; g < Hkv; ++g)
      for (int j = in->bad_block_entry * in->bs; j < (in->bad_block_entry + 1) * in->bs && j < nk; ++j)
        for (int d = 0; d < D; ++d) r->k[((size_t)g * nk + j) * D + d] = r->v[((size_t)g * nk + j) * D + d] = NAN;
  /* This sequence's modifiers: slopes of batch b, the mask rows of batch b. */
  r->mods = in->mb.host;
  if (in->mb.host.slopes) r->mods.slopes = in->mb.host.slopes + (size_t)b * H;
  if (in->mb.host.mask) {
    r->mask = malloc((size_t)H * nq * nk * sizeof(double) + 1);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j)
          r->mask[((size_t)h * nq + i) * nk + j] =
              in->mb.host.mask[(((size_t)b * H + h) * in->nq_max + i) * in->nk_max + j];
    r->mods.mask = r->mask;
  }
}

void seq_reference_free(seq_reference *r) {
  free(r->q), free(r->k), free(r->v), free(r->mask);
  memset(r, 0, sizeof *r);
}
