/* fcl_kv_cache_append: new tokens' K and V rows into the paged pools at caller-given slots (cl/kv_append.cl).
 * The pools are described to the shared tensor checks as [num_blocks, kv_heads, block_size, head_dim] tensors
 * and the new rows as [num_tokens, kv_heads, 1, head_dim], so sizes, strides and offsets go through the same
 * overflow-checked byte ranges as every attention tensor. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static const char *const append_files[] = {"kv_append.cl"};

/* Element indices and byte counts stay below this (as in desc.c): kernels index with signed 64-bit. */
#define APPEND_MAX_EXTENT ((int64_t)1 << 62)
/* Work-items of one launch at most; a larger append loops inside the kernel (a multiple of every WG). */
#define APPEND_MAX_GLOBAL ((size_t)1 << 30)

/* a * b, or -1 when it would exceed APPEND_MAX_EXTENT (a, b >= 0). */
static int64_t mul_checked(int64_t a, int64_t b) {
  if (a && b > APPEND_MAX_EXTENT / a) return -1;
  return a * b;
}

/* A resolved descriptor: pool strides (block, head, row) and new-row strides (token, head, unused). */
typedef struct append_problem {
  int64_t tokens, heads, d, block_size, num_blocks, num_slots;
  fcl_dtype dtype;
  size_t elem_size;
  int64_t kn_stride[3], vn_stride[3], kp_stride[3], vp_stride[3];
  int64_t kn_offset, vn_offset, kp_offset, vp_offset;
} append_problem;

static fcl_status resolve_strides(const char *field, const int64_t *given, int count, const int64_t *packed,
                                  int64_t *out) {
  int all_zero = 1;
  for (int i = 0; i < count; ++i) all_zero &= given[i] == 0;
  for (int i = 0; i < count; ++i) {
    if (given[i] < 0)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->%s[%d] is %lld; strides must not be negative", field, i,
                      (long long)given[i]);
    out[i] = all_zero ? packed[i] : given[i];
  }
  return FCL_SUCCESS;
}

static fcl_status resolve_append(const fcl_kv_append_desc *desc, append_problem *p) {
  if (!desc) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
  memset(p, 0, sizeof *p);
  if (desc->num_tokens < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_tokens is %lld; it must not be negative",
                    (long long)desc->num_tokens);
  /* Head and column indices are 32-bit in the kernel. */
  if (desc->num_kv_heads < 1 || desc->num_kv_heads > INT32_MAX)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_kv_heads is %lld; it must be 1 .. 2^31 - 1",
                    (long long)desc->num_kv_heads);
  if (desc->head_dim < 1 || desc->head_dim > INT32_MAX)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->head_dim is %lld; it must be 1 .. 2^31 - 1",
                    (long long)desc->head_dim);
  switch (desc->dtype) {
    case FCL_DTYPE_F32: p->elem_size = 4; break;
    case FCL_DTYPE_F16:
    case FCL_DTYPE_BF16: p->elem_size = 2; break;
    default:
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "desc->dtype is %d; it must be FCL_DTYPE_F32, FCL_DTYPE_F16 or FCL_DTYPE_BF16", (int)desc->dtype);
  }
  if (desc->block_size < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->block_size is %lld; it must be at least 1",
                    (long long)desc->block_size);
  if (desc->num_blocks < 1)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_blocks is %lld; it must be at least 1",
                    (long long)desc->num_blocks);
  p->num_slots = mul_checked(desc->num_blocks, desc->block_size);
  if (p->num_slots < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_blocks * desc->block_size (%lld * %lld) is too large",
                    (long long)desc->num_blocks, (long long)desc->block_size);
  p->tokens = desc->num_tokens, p->heads = desc->num_kv_heads, p->d = desc->head_dim;
  p->block_size = desc->block_size, p->num_blocks = desc->num_blocks, p->dtype = desc->dtype;

  const int64_t row = mul_checked(p->heads, p->d), block_head = mul_checked(p->block_size, p->d);
  const int64_t block = block_head < 0 ? -1 : mul_checked(p->heads, block_head);
  if (row < 0 || block < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "the pools are too large: one block exceeds 2^62 elements");
  const int64_t packed_new[2] = {row, p->d}, packed_pool[3] = {block, block_head, p->d};
  fcl_status st;
  if ((st = resolve_strides("k_new_stride", desc->k_new_stride, 2, packed_new, p->kn_stride)) ||
      (st = resolve_strides("v_new_stride", desc->v_new_stride, 2, packed_new, p->vn_stride)) ||
      (st = resolve_strides("k_pool_stride", desc->k_pool_stride, 3, packed_pool, p->kp_stride)) ||
      (st = resolve_strides("v_pool_stride", desc->v_pool_stride, 3, packed_pool, p->vp_stride)))
    return st;
  const int64_t offsets[4] = {desc->k_new_offset, desc->v_new_offset, desc->k_pool_offset, desc->v_pool_offset};
  static const char *const offset_names[4] = {"k_new_offset", "v_new_offset", "k_pool_offset", "v_pool_offset"};
  for (int i = 0; i < 4; ++i)
    if (offsets[i] < 0)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->%s is %lld; it must not be negative", offset_names[i],
                      (long long)offsets[i]);
  p->kn_offset = offsets[0], p->vn_offset = offsets[1], p->kp_offset = offsets[2], p->vp_offset = offsets[3];
  return FCL_SUCCESS;
}

/* The shared tensor checks' view of one operand: the pools as [num_blocks, heads, block_size, d], the new rows
   as [tokens, heads, 1, d]. */
static void tensor_view(const append_problem *a, int pool, fcl_problem *p, int64_t *rows) {
  memset(p, 0, sizeof *p);
  p->batch = pool ? a->num_blocks : a->tokens;
  p->heads = p->kv_heads = a->heads;
  p->group = 1;
  p->nq = p->nk = *rows = pool ? a->block_size : 1;
  p->d = a->d;
  p->dtype = a->dtype;
  p->elem_size = a->elem_size;
}

/* fcl_kv_pools_disjoint (internal.h). Interleaved pools (FlashInfer's [num_blocks, 2, block_size, kv_heads,
   head_dim]) are disjoint although their spans cross. Exact: an element index difference is
   sum d_i * stride_i + e with |d_i| < count_i and |e| < head_dim. Taken from the largest stride down, each
   stride exceeds the reach of the dimensions inside it (no self-overlap), so at most two values of d_i leave
   a remainder those dimensions can still reach. */
int fcl_kv_pools_disjoint(int64_t num_blocks, int64_t heads, int64_t block_size, int64_t head_dim,
                          const int64_t stride[3], int64_t delta) {
  int64_t s[3] = {stride[0], stride[1], stride[2]}, n[3] = {num_blocks, heads, block_size};
  for (int i = 0; i < 3; ++i) /* by stride, largest first */
    for (int j = i + 1; j < 3; ++j)
      if (s[j] > s[i]) {
        int64_t t = s[i];
        s[i] = s[j], s[j] = t, t = n[i], n[i] = n[j], n[j] = t;
      }
  int64_t reach[4]; /* reach[i]: largest |sum| of dimensions i.. and the column (< 2^62: pool checks) */
  reach[3] = head_dim - 1;
  for (int i = 2; i >= 0; --i) reach[i] = reach[i + 1] + (n[i] - 1) * s[i];
  /* Depth-first over the candidates: rem[i] is what dimensions i.. must still make up. */
  int64_t rem[4], d[3], hi[3];
  int i = 0;
  rem[0] = delta;
  for (;;) {
    if (i == 3) {
      if (rem[3] >= -reach[3] && rem[3] <= reach[3]) return 0; /* a shared element */
      --i;
    } else if (n[i] <= 1 || s[i] == 0) { /* contributes nothing */
      d[i] = hi[i] = 0;
      rem[i + 1] = rem[i];
      ++i;
      continue;
    } else {
      /* d with |rem - d * s| <= reach[i + 1] and |d| < n: floor and ceil of the bounds' quotients. */
      const int64_t lo_num = rem[i] - reach[i + 1], hi_num = rem[i] + reach[i + 1];
      int64_t lo = lo_num / s[i] + (lo_num > 0 && lo_num % s[i] ? 1 : 0);
      int64_t up = hi_num / s[i] - (hi_num < 0 && hi_num % s[i] ? 1 : 0);
      if (lo < -(n[i] - 1)) lo = -(n[i] - 1);
      if (up > n[i] - 1) up = n[i] - 1;
      if (up - lo > 1) return 0; /* not the nesting assumed: give up, conservatively */
      if (lo <= up) {
        d[i] = lo, hi[i] = up;
        rem[i + 1] = rem[i] - d[i] * s[i];
        ++i;
        continue;
      }
      --i;
    }
    /* Backtrack to the last dimension with a candidate left. */
    for (; i >= 0 && d[i] >= hi[i]; --i) {
    }
    if (i < 0) return 1;
    ++d[i];
    rem[i + 1] = rem[i] - d[i] * s[i];
    ++i;
  }
}

/* Every check of the call, before anything is enqueued: buffers, sizes, queue, wait list, aliasing. */
static fcl_status validate(fcl_context *ctx, cl_command_queue queue, const append_problem *a, cl_mem k_new,
                           cl_mem v_new, cl_mem slots, cl_mem k_pool, cl_mem v_pool, cl_uint num_wait,
                           const cl_event *wait) {
  fcl_status st;
  fcl_problem pn, pp;
  int64_t rows_new, rows_pool;
  tensor_view(a, 0, &pn, &rows_new);
  tensor_view(a, 1, &pp, &rows_pool);
  const int64_t cn[3] = {pn.batch, a->heads, rows_new}, cp[3] = {pp.batch, a->heads, rows_pool};
  if ((st = fcl_check_queue(ctx, queue))) return st;
  if (a->tokens == 0) {
    /* Nothing is read from them, but they are still required buffers of the context: a caller's bug shows
       on the first call, not the first non-empty one. */
    if ((st = fcl_check_float_buffer(ctx, k_new, "k_new", 0)) || (st = fcl_check_float_buffer(ctx, v_new, "v_new", 0)) ||
        (st = fcl_check_float_buffer(ctx, slots, "slots", 0)))
      return st;
  } else {
    if ((uint64_t)a->tokens > SIZE_MAX / (2 * sizeof(float)))
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->num_tokens is %lld; too large", (long long)a->tokens);
    if ((st = fcl_check_tensor(ctx, k_new, "k_new", &pn, cn, a->kn_stride, a->kn_offset)) ||
        (st = fcl_check_tensor(ctx, v_new, "v_new", &pn, cn, a->vn_stride, a->vn_offset)) ||
        (st = fcl_check_float_buffer(ctx, slots, "slots", (size_t)a->tokens * 2)))
      return st;
  }
  if ((st = fcl_check_tensor(ctx, k_pool, "k_pool", &pp, cp, a->kp_stride, a->kp_offset)) ||
      (st = fcl_check_no_overlap("k_pool", &pp, cp, a->kp_stride, "k_pool")) ||
      (st = fcl_check_tensor(ctx, v_pool, "v_pool", &pp, cp, a->vp_stride, a->vp_offset)) ||
      (st = fcl_check_no_overlap("v_pool", &pp, cp, a->vp_stride, "v_pool")) ||
      (st = fcl_check_wait_list(ctx, num_wait, wait)))
    return st;
  /* The pools are written: they must share no byte with the inputs or with each other. */
  uint64_t r[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  if (a->tokens > 0 &&
      ((st = fcl_tensor_bytes(&pn, "k_new", cn, a->kn_stride, a->kn_offset, &r[0][0], &r[0][1])) ||
       (st = fcl_tensor_bytes(&pn, "v_new", cn, a->vn_stride, a->vn_offset, &r[1][0], &r[1][1]))))
    return st;
  if ((st = fcl_tensor_bytes(&pp, "k_pool", cp, a->kp_stride, a->kp_offset, &r[2][0], &r[2][1])) ||
      (st = fcl_tensor_bytes(&pp, "v_pool", cp, a->vp_stride, a->vp_offset, &r[3][0], &r[3][1])))
    return st;
  const fcl_buffer_use uses[] = {{k_new, r[0][0], r[0][1], 0, "k_new"},
                                 {v_new, r[1][0], r[1][1], 0, "v_new"},
                                 {slots, 0, (uint64_t)a->tokens * 8, 0, "slots"},
                                 {k_pool, r[2][0], r[2][1], 1, "k_pool"},
                                 {v_pool, r[3][0], r[3][1], 1, "v_pool"}};
  /* One buffer holding both pools with the same strides, element-disjoint (interleaved): each pool is checked
     against the inputs alone. Otherwise byte spans decide, conservatively, as for every operation. */
  if (k_pool == v_pool && !memcmp(a->kp_stride, a->vp_stride, sizeof a->kp_stride) &&
      fcl_kv_pools_disjoint(a->num_blocks, a->heads, a->block_size, a->d, a->kp_stride, a->vp_offset - a->kp_offset)) {
    const fcl_buffer_use k_only[] = {uses[0], uses[1], uses[2], uses[3]}, v_only[] = {uses[0], uses[1], uses[2], uses[4]};
    return (st = fcl_check_aliasing(k_only, 4)) ? st : fcl_check_aliasing(v_only, 4);
  }
  return fcl_check_aliasing(uses, (int)(sizeof uses / sizeof uses[0]));
}

static fcl_status enqueue_append(fcl_context *ctx, cl_command_queue queue, const append_problem *a, cl_mem k_new,
                                 cl_mem v_new, cl_mem slots, cl_mem k_pool, cl_mem v_pool, cl_uint num_wait,
                                 const cl_event *wait, cl_event *event) {
  char defines[32];
  snprintf(defines, sizeof defines, "-DDTYPE=%d", (int)a->dtype);
  cl_kernel kernel;
  size_t wg = 0;
  fcl_status st = fcl_get_kernel_wg(ctx, append_files, 1, "fcl_kv_append", defines, 256, &kernel, &wg);
  if (st) return st;
  /* tokens * heads * d: bounded by the slots buffer (tokens) and a pool block (heads * d), still checked. */
  const int64_t hd = a->heads * a->d, n = mul_checked(a->tokens, hd);
  if (n < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "num_tokens * num_kv_heads * head_dim is too large");
  size_t global = (size_t)n / wg * wg + ((size_t)n % wg ? wg : 0);
  if (global > APPEND_MAX_GLOBAL) global = APPEND_MAX_GLOBAL;
  /* The grid-stride loop runs ceil(n / global) times per work-item (loop_bounds.c counts its entry too): within the
     device's loop budget. */
  const uint64_t iterations = fcl_kv_append_loop_iterations(n, global);
  if (ctx->caps.loop_budget && iterations > ctx->caps.loop_budget)
    return fcl_fail(FCL_ERROR_UNSUPPORTED, "appending %lld elements takes %llu loop iterations per work-item; the "
                    "device's loop budget is %llu", (long long)n, (unsigned long long)iterations,
                    ctx->caps.loop_budget);
  const cl_long kn[3] = {a->kn_offset, a->kn_stride[0], a->kn_stride[1]};
  const cl_long vn[3] = {a->vn_offset, a->vn_stride[0], a->vn_stride[1]};
  const cl_long kp[4] = {a->kp_offset, a->kp_stride[0], a->kp_stride[1], a->kp_stride[2]};
  const cl_long vp[4] = {a->vp_offset, a->vp_stride[0], a->vp_stride[1], a->vp_stride[2]};
  const cl_long n_arg = n, bs = a->block_size, num_slots = a->num_slots;
  const cl_int heads = (cl_int)a->heads, d = (cl_int)a->d;
  cl_uint i = 0;
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_mem), &k_new));
  for (int j = 0; j < 3; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &kn[j]));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_mem), &v_new));
  for (int j = 0; j < 3; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &vn[j]));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_mem), &slots));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &n_arg));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_int), &heads));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_int), &d));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &bs));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &num_slots));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_mem), &k_pool));
  for (int j = 0; j < 4; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &kp[j]));
  FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_mem), &v_pool));
  for (int j = 0; j < 4; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, i++, sizeof(cl_long), &vp[j]));
  FCL_CL_CHECK(clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, &wg, num_wait, num_wait ? wait : NULL, event));
  return FCL_SUCCESS;
}

fcl_status fcl_kv_cache_append(fcl_context *ctx, cl_command_queue queue, const fcl_kv_append_desc *desc,
                               cl_mem k_new, cl_mem v_new, cl_mem slots, cl_mem k_pool, cl_mem v_pool,
                               cl_uint num_wait, const cl_event *wait, cl_event *event) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  append_problem a;
  fcl_status st;
  if ((st = resolve_append(desc, &a)) ||
      (st = validate(ctx, queue, &a, k_new, v_new, slots, k_pool, v_pool, num_wait, wait)))
    return st;
  if (a.tokens == 0) {
    /* No kernel; a marker gives the caller an event that completes after the wait list (and fails with it). */
    if (event) FCL_CL_CHECK(clEnqueueMarkerWithWaitList(queue, num_wait, num_wait ? wait : NULL, event));
    return FCL_SUCCESS;
  }
  pthread_mutex_lock(&ctx->lock);
  st = enqueue_append(ctx, queue, &a, k_new, v_new, slots, k_pool, v_pool, num_wait, wait, event);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}
