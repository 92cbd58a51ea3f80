/* Descriptor validation shared by every operation: sizes, strides, buffers, queue and wait list. */
#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const tensor_names[4] = {"q", "k", "v", "o"};

static fcl_status check_mem_context(const fcl_context *ctx, cl_mem buf, const char *what, size_t *size);

#define LOG2E 1.4426950408889634 /* kernels take scores, scales and caps in log2 units, as floats */

int fcl_mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
  if (c > FCL_MAX_EXTENT || (a && b > (FCL_MAX_EXTENT - c) / a)) return -1;
  *out = a * b + c;
  return *out > FCL_MAX_EXTENT ? -1 : 0;
}

fcl_status fcl_padded_rows(const fcl_problem *p, size_t *rows) {
  uint64_t n;
  if (fcl_mul_add((uint64_t)p->batch, (uint64_t)p->heads, 0, &n) || fcl_mul_add(n, (uint64_t)p->nq, 0, &n) ||
      n > SIZE_MAX / sizeof(float))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "batch * num_heads * seqlen_q (%lld * %lld * %lld) is too large",
                    (long long)p->batch, (long long)p->heads, (long long)p->nq);
  *rows = (size_t)n;
  return FCL_SUCCESS;
}

fcl_status fcl_row_count(const fcl_problem *p, size_t *rows) {
  if (!p->cu_q) return fcl_padded_rows(p, rows);
  uint64_t n;
  if (fcl_mul_add((uint64_t)p->heads, (uint64_t)p->total_q, 0, &n) || n > SIZE_MAX / sizeof(float))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "num_heads * total_q (%lld * %lld) is too large",
                    (long long)p->heads, (long long)p->total_q);
  *rows = (size_t)n;
  return FCL_SUCCESS;
}

int fcl_problem_sequences(const fcl_problem *p) { return p->cu_q || p->cu_k || p->seqlens_k || p->block_table; }

/* The sequence layout of desc into p (after p's sizes): packed queries, packed or paged keys. The index
   buffers' contents are the kernels' to distrust; their sizes are checked by fcl_check_sequences. */
static fcl_status resolve_sequences(const fcl_attention_desc *desc, fcl_problem *p) {
  p->cu_q = desc->cu_seqlens_q, p->cu_k = desc->cu_seqlens_k, p->seqlens_k = desc->seqlens_k;
  p->block_table = desc->block_table;
  const int64_t q_counts[3] = {p->batch, p->heads, p->nq}, kv_counts[3] = {p->batch, p->kv_heads, p->nk};
  memcpy(p->q_counts, q_counts, sizeof q_counts);
  memcpy(p->kv_counts, kv_counts, sizeof kv_counts);
  /* Packed rows are indexed with int32 in the kernels (the index buffers are int32 too). */
  if (p->cu_q) {
    if (desc->total_q < 1 || desc->total_q > INT32_MAX)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->total_q is %lld; with cu_seqlens_q it must be in [1, 2^31)",
                      (long long)desc->total_q);
    p->total_q = desc->total_q;
    p->q_counts[0] = 1, p->q_counts[2] = p->total_q;
  } else if (desc->total_q) {
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->total_q is %lld but cu_seqlens_q is NULL", (long long)desc->total_q);
  }
  if (p->cu_k && p->block_table)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "desc->cu_seqlens_k and desc->block_table are both set: paged keys take their lengths from "
                    "seqlens_k");
  if (p->cu_k) {
    if (desc->total_k < 1 || desc->total_k > INT32_MAX)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->total_k is %lld; with cu_seqlens_k it must be in [1, 2^31)",
                      (long long)desc->total_k);
    p->total_k = desc->total_k;
    p->kv_counts[0] = 1, p->kv_counts[2] = p->total_k;
  } else if (desc->total_k) {
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->total_k is %lld but cu_seqlens_k is NULL", (long long)desc->total_k);
  }
  if (p->block_table) {
    if (desc->block_size < 1 || desc->block_size > 1024)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->block_size is %lld; with a block table it must be in [1, 1024]",
                      (long long)desc->block_size);
    if (desc->num_blocks < 1 || desc->num_blocks > INT32_MAX)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_blocks is %lld; it must be in [1, 2^31)",
                      (long long)desc->num_blocks);
    if (desc->block_table_stride < 1 || desc->block_table_stride > INT32_MAX)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->block_table_stride is %lld; it must be in [1, 2^31)",
                      (long long)desc->block_table_stride);
    if (desc->block_table_stride < (p->nk + desc->block_size - 1) / desc->block_size)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->seqlen_k (%lld) needs %lld blocks of %lld keys but a block table row holds %lld "
                      "(block_table_stride)",
                      (long long)p->nk, (long long)((p->nk + desc->block_size - 1) / desc->block_size),
                      (long long)desc->block_size, (long long)desc->block_table_stride);
    p->block_size = desc->block_size, p->num_blocks = desc->num_blocks, p->table_stride = desc->block_table_stride;
    p->kv_counts[0] = p->num_blocks, p->kv_counts[2] = p->block_size;
  } else if (desc->block_size || desc->num_blocks || desc->block_table_stride) {
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "desc->block_size, num_blocks or block_table_stride is set but block_table is NULL");
  }
  return FCL_SUCCESS;
}

fcl_status fcl_check_sequences(const fcl_context *ctx, const fcl_problem *p) {
  const struct {
    cl_mem buf;
    int64_t count;
    const char *what;
  } idx[4] = {{p->cu_q, p->batch + 1, "desc->cu_seqlens_q"},
              {p->cu_k, p->batch + 1, "desc->cu_seqlens_k"},
              {p->seqlens_k, p->batch, "desc->seqlens_k"},
              {p->block_table, 0, "desc->block_table"}};
  for (int i = 0; i < 4; ++i) {
    if (!idx[i].buf) continue;
    uint64_t count = (uint64_t)idx[i].count;
    if (i == 3 && fcl_mul_add((uint64_t)p->batch, (uint64_t)p->table_stride, 0, &count))
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "batch * block_table_stride is too large");
    size_t size = 0;
    fcl_status st = check_mem_context(ctx, idx[i].buf, idx[i].what, &size);
    if (st) return st;
    if (size / sizeof(cl_int) < count)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is too small: it needs %llu int32 entries but holds %zu bytes",
                      idx[i].what, (unsigned long long)count, size);
  }
  return FCL_SUCCESS;
}

void fcl_sequence_bytes(const fcl_problem *p, uint64_t out[4][2]) {
  memset(out, 0, 4 * sizeof out[0]);
  if (p->cu_q) out[0][1] = (uint64_t)(p->batch + 1) * sizeof(cl_int);
  if (p->cu_k) out[1][1] = (uint64_t)(p->batch + 1) * sizeof(cl_int);
  if (p->seqlens_k) out[2][1] = (uint64_t)p->batch * sizeof(cl_int);
  if (p->block_table) out[3][1] = (uint64_t)p->batch * (uint64_t)p->table_stride * sizeof(cl_int);
}

/* The score modifiers of desc into p (after p's sizes): ranges checked here, buffers by fcl_check_modifiers. */
static fcl_status resolve_modifiers(const fcl_attention_desc *desc, fcl_problem *p) {
  if (!isfinite(desc->softcap) || desc->softcap < 0.0f)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->softcap is %g; it must be 0 (off) or positive and finite",
                    (double)desc->softcap);
  /* Kernels take softcap, the cap in log2 units and its inverse as floats (common.cl): all three must be normal
     floats, which a device that flushes subnormals keeps (the inverse is normal while the cap is at most 2^126). */
  const double cap = (double)desc->softcap * LOG2E, cap_max = 0x1p126;
  if (desc->softcap > 0.0f && (desc->softcap < FLT_MIN || cap > cap_max))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "desc->softcap is %g; it must be 0 (off) or from %g to %g (softcap, softcap * log2(e) and its "
                    "inverse must be normal floats)",
                    (double)desc->softcap, (double)FLT_MIN, cap_max / LOG2E);
  p->softcap = desc->softcap;
  if (desc->window != 0 && desc->window != 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->window is %d; it must be 0 or 1", desc->window);
  int64_t left = -1, right = -1;
  if (desc->window) {
    if (desc->window_left < -1 || desc->window_right < -1)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->window_left and window_right are %lld and %lld; each must be -1 (unbounded) or >= 0",
                      (long long)desc->window_left, (long long)desc->window_right);
    left = desc->window_left, right = desc->window_right;
  }
  if (p->causal) right = 0; /* causal is the window's right side 0, with or without a window */
  /* p - j never exceeds nk - 1 and j - p never exceeds nq - 1, so nk and nq stand for unbounded. */
  p->wl = left < 0 || left > p->nk ? p->nk : left;
  p->wr = right < 0 || right > p->nq ? p->nq : right;

  p->alibi = desc->alibi_slopes;
  if (p->alibi) {
    if (desc->alibi_batch_stride < 0 || desc->alibi_offset < 0)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->alibi_batch_stride (%lld) and desc->alibi_offset (%lld) must not be negative",
                      (long long)desc->alibi_batch_stride, (long long)desc->alibi_offset);
    p->alibi_sb = desc->alibi_batch_stride, p->alibi_offset = desc->alibi_offset;
  }
  p->mask = desc->mask;
  if (p->mask) {
    if (desc->mask_dtype != FCL_DTYPE_F32 && desc->mask_dtype != FCL_DTYPE_F16 && desc->mask_dtype != FCL_DTYPE_BF16)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->mask_dtype is %d; it must be FCL_DTYPE_F32, FCL_DTYPE_F16 or FCL_DTYPE_BF16",
                      (int)desc->mask_dtype);
    p->mask_dtype = desc->mask_dtype;
    for (int i = 0; i < 3; ++i) {
      if (desc->mask_stride[i] < 0)
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->mask_stride[%d] is %lld; it must not be negative", i,
                        (long long)desc->mask_stride[i]);
      p->mask_stride[i] = desc->mask_stride[i];
    }
    if (desc->mask_offset < 0)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->mask_offset is %lld; it must not be negative",
                      (long long)desc->mask_offset);
    p->mask_offset = desc->mask_offset;
  }
  p->sinks = desc->sinks;
  p->d_sinks = desc->d_sinks;
  if (p->d_sinks && !p->sinks)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->d_sinks is set but desc->sinks is NULL");
  return FCL_SUCCESS;
}

int fcl_problem_windowed(const fcl_problem *p) { return p->wl < p->nk || p->wr < p->nq; }

int fcl_problem_window_kind(const fcl_problem *p) {
  return !fcl_problem_windowed(p) ? 0 : p->wl == p->nk && p->wr == 0 ? 1 : 2;
}

int fcl_problem_score_mods(const fcl_problem *p) { return p->softcap > 0.0f || p->alibi || p->mask; }

void fcl_modifier_defines(const fcl_problem *p, char *out, size_t size) {
  const int window = fcl_problem_window_kind(p); /* WINDOW (common.cl) */
  snprintf(out, size, " -DWINDOW=%d%s%s%s%s", window, p->softcap > 0.0f ? " -DSOFTCAP=1" : "", p->alibi ? " -DALIBI=1" : "",
           !p->mask                              ? ""
           : p->mask_dtype == FCL_DTYPE_F32      ? " -DMASK=1"
           : p->mask_dtype == FCL_DTYPE_F16      ? " -DMASK=2"
                                                 : " -DMASK=3",
           p->sinks ? " -DSINKS=1" : "");
  const size_t n = strlen(out);
  fcl_sequence_defines(p, out + n, size - n);
}

void fcl_sequence_defines(const fcl_problem *p, char *out, size_t size) {
  if (!size) return;
  out[0] = '\0';
  if (fcl_problem_sequences(p))
    snprintf(out, size, "%s -DKV=%d%s", p->cu_q ? " -DVARLEN_Q=1" : "", p->block_table ? 2 : p->cu_k ? 1 : 0,
             p->seqlens_k ? " -DSEQLENS_K=1" : "");
}

fcl_status fcl_resolve_problem(const fcl_attention_desc *desc, fcl_problem *p) {
  if (!desc) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  memset(p, 0, sizeof *p);
  if (desc->batch < 1) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->batch is %lld; it must be at least 1", (long long)desc->batch);
  if (desc->num_heads < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_heads is %lld; it must be at least 1", (long long)desc->num_heads);
  if (desc->num_kv_heads < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_kv_heads is %lld; it must be 0 (= num_heads) or divide num_heads", (long long)desc->num_kv_heads);
  int64_t kv_heads = desc->num_kv_heads ? desc->num_kv_heads : desc->num_heads;
  if (desc->num_heads % kv_heads != 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_kv_heads (%lld) does not divide desc->num_heads (%lld)",
                    (long long)kv_heads, (long long)desc->num_heads);
  if (desc->seqlen_q < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->seqlen_q is %lld; it must be at least 1", (long long)desc->seqlen_q);
  if (desc->seqlen_k < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->seqlen_k is %lld; it must be at least 1", (long long)desc->seqlen_k);
  if (desc->head_dim < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->head_dim is %lld; it must be at least 1", (long long)desc->head_dim);
  if (desc->head_dim > FCL_MAX_HEAD_DIM)
    return fcl_fail(FCL_ERROR_UNSUPPORTED, "desc->head_dim is %lld; flashcl supports head_dim up to %d",
                    (long long)desc->head_dim, FCL_MAX_HEAD_DIM);
  /* Grid dimensions and in-kernel row indices are 32-bit: batch and heads below 2^31, lengths below 2^30. */
  if (desc->seqlen_q > INT32_MAX / 2 || desc->seqlen_k > INT32_MAX / 2 || desc->batch > INT32_MAX ||
      desc->num_heads > INT32_MAX)
    return fcl_fail(FCL_ERROR_UNSUPPORTED, "desc sizes exceed the limits (batch and num_heads below 2^31, seqlens below 2^30; batch %lld, num_heads %lld, seqlen_q %lld, seqlen_k %lld)",
                    (long long)desc->batch, (long long)desc->num_heads, (long long)desc->seqlen_q, (long long)desc->seqlen_k);
  switch (desc->dtype) {
    case FCL_DTYPE_F32: p->elem_size = 4; break;
    case FCL_DTYPE_F16:
    case FCL_DTYPE_BF16: p->elem_size = 2; break;
    default: return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->dtype is %d; it must be FCL_DTYPE_F32, FCL_DTYPE_F16 or FCL_DTYPE_BF16", (int)desc->dtype);
  }
  if (!isfinite(desc->scale))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->scale is %g; it must be finite (0 = 1/sqrt(head_dim))", (double)desc->scale);
  /* Kernels turn scores into log2 units with scale * log2(e) in float; that product must stay finite. */
  if (fabs((double)desc->scale) * LOG2E > (double)FLT_MAX)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->scale is %g; its magnitude must be at most %g (scale * log2(e) must be a finite float)",
                    (double)desc->scale, (double)FLT_MAX / LOG2E);
  if (desc->causal != 0 && desc->causal != 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->causal is %d; it must be 0 or 1", desc->causal);

  p->batch = desc->batch;
  p->heads = desc->num_heads;
  p->kv_heads = kv_heads;
  p->group = desc->num_heads / kv_heads;
  p->nq = desc->seqlen_q;
  p->nk = desc->seqlen_k;
  p->d = desc->head_dim;
  p->dtype = desc->dtype;
  p->scale = desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)desc->head_dim));
  p->causal = desc->causal;
  fcl_status st = resolve_modifiers(desc, p);
  if (st || (st = resolve_sequences(desc, p))) return st;

  const int64_t *strides[4] = {desc->q_stride, desc->k_stride, desc->v_stride, desc->o_stride};
  int64_t *resolved[4] = {p->q_stride, p->k_stride, p->v_stride, p->o_stride};
  const int64_t offsets[4] = {desc->q_offset, desc->k_offset, desc->v_offset, desc->o_offset};
  int64_t *resolved_offsets[4] = {&p->q_offset, &p->k_offset, &p->v_offset, &p->o_offset};
  for (int t = 0; t < 4; ++t) {
    const int64_t heads = (t == 1 || t == 2) ? kv_heads : desc->num_heads;
    const int64_t *counts = t == 0 || t == 3 ? p->q_counts : p->kv_counts;
    const int64_t rows = counts[2];
    const int64_t *s = strides[t];
    if (offsets[t] < 0)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->%s_offset is %lld; it must not be negative", tensor_names[t], (long long)offsets[t]);
    *resolved_offsets[t] = offsets[t];
    for (int i = 0; i < 3; ++i) /* also where a layout leaves a stride unused */
      if (s[i] < 0)
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->%s_stride[%d] is %lld; strides must not be negative",
                        tensor_names[t], i, (long long)s[i]);
    const int packed = t == 0 || t == 3 ? p->cu_q != NULL : p->cu_k != NULL;
    if (packed && s[1] == 0 && s[2] == 0) { /* packed [total, heads, d] */
      uint64_t row_elems;
      if (fcl_mul_add((uint64_t)heads, (uint64_t)desc->head_dim, 0, &row_elems))
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is too large", tensor_names[t]);
      resolved[t][0] = 0, resolved[t][1] = desc->head_dim, resolved[t][2] = (int64_t)row_elems;
      continue;
    }
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) {
      uint64_t head_elems, batch_elems;
      if (fcl_mul_add((uint64_t)rows, (uint64_t)desc->head_dim, 0, &head_elems) ||
          fcl_mul_add((uint64_t)heads, head_elems, 0, &batch_elems))
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is too large: one batch of it exceeds 2^62 elements", tensor_names[t]);
      resolved[t][2] = desc->head_dim;
      resolved[t][1] = (int64_t)head_elems;
      resolved[t][0] = (int64_t)batch_elems;
      continue;
    }
    for (int i = 0; i < 3; ++i) resolved[t][i] = s[i];
  }
  return FCL_SUCCESS;
}

static fcl_status check_mem_context(const fcl_context *ctx, cl_mem buf, const char *what, size_t *size) {
  cl_context mem_ctx = NULL;
  cl_int err = clGetMemObjectInfo(buf, CL_MEM_CONTEXT, sizeof mem_ctx, &mem_ctx, NULL);
  if (err != CL_SUCCESS)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is not a valid buffer: clGetMemObjectInfo failed: %s (%d)", what,
                    fcl_cl_error_name(err), (int)err);
  if (mem_ctx != ctx->context)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s belongs to another cl_context than the fcl_context's", what);
  cl_mem_object_type type = 0;
  FCL_CL_CHECK(clGetMemObjectInfo(buf, CL_MEM_TYPE, sizeof type, &type, NULL));
  if (type != CL_MEM_OBJECT_BUFFER)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is an image (memory object type 0x%x); it must be a buffer", what,
                    (unsigned)type);
  err = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof *size, size, NULL);
  if (err != CL_SUCCESS) return fcl_cl_failure("clGetMemObjectInfo(CL_MEM_SIZE)", err);
  return FCL_SUCCESS;
}

fcl_status fcl_tensor_bytes(const fcl_problem *p, const char *what, const int64_t counts[3],
                            const int64_t stride[3], int64_t offset, uint64_t *first, uint64_t *end) {
  /* Last element reached, in elements, with every step checked against overflow. */
  uint64_t last = (uint64_t)p->d - 1;
  if (fcl_mul_add(1, (uint64_t)offset, last, &last))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s: offset %lld is beyond any buffer", what, (long long)offset);
  for (int i = 0; i < 3; ++i)
    if (fcl_mul_add((uint64_t)(counts[i] - 1), (uint64_t)stride[i], last, &last))
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s: stride[%d] = %lld reaches beyond any buffer", what, i,
                      (long long)stride[i]);
  uint64_t need = 0;
  if (fcl_mul_add(last + 1, p->elem_size, 0, &need) || need > SIZE_MAX)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s: its strides and offset reach beyond any buffer", what);
  *first = (uint64_t)offset * p->elem_size; /* offset <= last < 2^62 elements */
  *end = need;
  return FCL_SUCCESS;
}

fcl_status fcl_check_tensor(const fcl_context *ctx, cl_mem buf, const char *what, const fcl_problem *p,
                            const int64_t counts[3], const int64_t stride[3], int64_t offset) {
  if (!buf) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  size_t size = 0;
  fcl_status st = check_mem_context(ctx, buf, what, &size);
  if (st) return st;
  uint64_t first, need;
  if ((st = fcl_tensor_bytes(p, what, counts, stride, offset, &first, &need))) return st;
  if (need > size)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "%s is too small: its strides and offset reach byte %llu but the buffer holds %zu bytes", what,
                    (unsigned long long)need, size);
  return FCL_SUCCESS;
}

fcl_status fcl_check_no_overlap(const char *what, const fcl_problem *p, const int64_t tensor_counts[3],
                                const int64_t stride[3], const char *desc_field) {
  /* Sufficient test: ordered by stride, each dimension's stride clears the whole extent of the dimensions
     inside it (dimensions of count 1 ignored). fcl_check_tensor has bounded every product below 2^62. */
  int64_t counts[3] = {tensor_counts[0], tensor_counts[1], tensor_counts[2]};
  int64_t strides[3] = {stride[0], stride[1], stride[2]};
  for (int i = 0; i < 3; ++i)
    for (int j = i; j > 0 && strides[j] < strides[j - 1]; --j) {
      int64_t t = strides[j];
      strides[j] = strides[j - 1];
      strides[j - 1] = t;
      t = counts[j];
      counts[j] = counts[j - 1];
      counts[j - 1] = t;
    }
  uint64_t extent = (uint64_t)p->d; /* elements spanned by the dimensions inside the current one */
  for (int i = 0; i < 3; ++i) {
    if (counts[i] <= 1) continue;
    if ((uint64_t)strides[i] < extent)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "%s would have overlapping elements: desc->%s_stride gives a stride of %lld where %llu "
                      "elements are needed",
                      what, desc_field, (long long)strides[i], (unsigned long long)extent);
    extent = (uint64_t)strides[i] * (uint64_t)(counts[i] - 1) + extent;
  }
  return FCL_SUCCESS;
}

fcl_status fcl_check_float_buffer(const fcl_context *ctx, cl_mem buf, const char *what, size_t count) {
  if (!buf) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
  size_t size = 0;
  fcl_status st = check_mem_context(ctx, buf, what, &size);
  if (st) return st;
  if (count > SIZE_MAX / sizeof(float) || size < count * sizeof(float))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is too small: it needs %zu bytes but holds %zu", what,
                    count * sizeof(float), size);
  return FCL_SUCCESS;
}

fcl_status fcl_check_queue(const fcl_context *ctx, cl_command_queue queue) {
  if (!queue) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "queue is NULL");
  cl_context qctx = NULL;
  cl_device_id qdev = NULL;
  cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
  if (err != CL_SUCCESS)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "queue is not a valid command queue: %s (%d)", fcl_cl_error_name(err), (int)err);
  if (qctx != ctx->context)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "queue belongs to another cl_context than the fcl_context's");
  FCL_CL_CHECK(clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL));
  if (qdev != ctx->device)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "queue is on another device than the fcl_context's");
  return FCL_SUCCESS;
}

fcl_status fcl_check_wait_list(const fcl_context *ctx, cl_uint num_wait, const cl_event *wait) {
  if ((num_wait > 0) != (wait != NULL))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "num_wait is %u but wait is %s", num_wait, wait ? "not NULL" : "NULL");
  for (cl_uint i = 0; i < num_wait; ++i) {
    if (!wait[i]) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "wait[%u] is NULL", i);
    cl_context ev_ctx = NULL;
    cl_int err = clGetEventInfo(wait[i], CL_EVENT_CONTEXT, sizeof ev_ctx, &ev_ctx, NULL);
    if (err != CL_SUCCESS)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "wait[%u] is not a valid event: clGetEventInfo failed: %s (%d)", i,
                      fcl_cl_error_name(err), (int)err);
    if (ev_ctx != ctx->context)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "wait[%u] belongs to another cl_context than the fcl_context's", i);
  }
  return FCL_SUCCESS;
}

/* A float32 buffer of ctx's context holding elements [first, first + count). */
static fcl_status check_float_range(const fcl_context *ctx, cl_mem buf, const char *what, uint64_t first,
                                    uint64_t count) {
  size_t size = 0;
  fcl_status st = check_mem_context(ctx, buf, what, &size);
  if (st) return st;
  uint64_t need = 0;
  if (fcl_mul_add(1, first, count, &need) || fcl_mul_add(need, sizeof(float), 0, &need) || need > size)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "%s is too small: it needs %llu bytes but holds %zu", what,
                    (unsigned long long)need, size);
  return FCL_SUCCESS;
}

void fcl_modifier_bytes(const fcl_problem *p, uint64_t alibi[2], uint64_t mask[2], uint64_t sinks[2]) {
  /* fcl_check_modifiers has bounded every sum and product here below 2^62. */
  alibi[0] = alibi[1] = mask[0] = mask[1] = sinks[0] = sinks[1] = 0;
  if (p->alibi) {
    alibi[0] = (uint64_t)p->alibi_offset * sizeof(float);
    alibi[1] = ((uint64_t)p->alibi_offset + (uint64_t)(p->batch - 1) * (uint64_t)p->alibi_sb + (uint64_t)p->heads) *
               sizeof(float);
  }
  if (p->mask) {
    const uint64_t es = p->mask_dtype == FCL_DTYPE_F32 ? 4 : 2;
    const int64_t counts[3] = {p->batch, p->heads, p->nq};
    uint64_t last = (uint64_t)p->mask_offset + (uint64_t)p->nk - 1;
    for (int i = 0; i < 3; ++i) last += (uint64_t)(counts[i] - 1) * (uint64_t)p->mask_stride[i];
    mask[0] = (uint64_t)p->mask_offset * es;
    mask[1] = (last + 1) * es;
  }
  if (p->sinks) sinks[1] = (uint64_t)p->heads * sizeof(float);
}

fcl_status fcl_check_modifiers(const fcl_context *ctx, const fcl_problem *p) {
  fcl_status st;
  if (p->alibi) {
    uint64_t first; /* of the last batch's slopes */
    if (fcl_mul_add((uint64_t)(p->batch - 1), (uint64_t)p->alibi_sb, (uint64_t)p->alibi_offset, &first))
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->alibi_batch_stride and alibi_offset reach beyond any buffer");
    if ((st = check_float_range(ctx, p->alibi, "desc->alibi_slopes", first, (uint64_t)p->heads))) return st;
  }
  if (p->sinks && (st = check_float_range(ctx, p->sinks, "desc->sinks", 0, (uint64_t)p->heads))) return st;
  if (p->mask) {
    size_t size = 0;
    if ((st = check_mem_context(ctx, p->mask, "desc->mask", &size))) return st;
    const int64_t counts[3] = {p->batch, p->heads, p->nq};
    uint64_t last = (uint64_t)p->nk - 1;
    if (fcl_mul_add(1, (uint64_t)p->mask_offset, last, &last))
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->mask_offset is beyond any buffer");
    for (int i = 0; i < 3; ++i)
      if (fcl_mul_add((uint64_t)(counts[i] - 1), (uint64_t)p->mask_stride[i], last, &last))
        return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->mask_stride[%d] reaches beyond any buffer", i);
    uint64_t need = 0;
    const size_t es = p->mask_dtype == FCL_DTYPE_F32 ? 4 : 2;
    if (fcl_mul_add(last + 1, es, 0, &need) || need > size)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->mask is too small: its strides and offset reach byte %llu but the buffer holds %zu bytes",
                      (unsigned long long)need, size);
  }
  return FCL_SUCCESS;
}
