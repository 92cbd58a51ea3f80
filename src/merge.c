/* Exact merge of partial attention results over disjoint key sets (cl/combine.cl): split-KV's last step
 * inside fcl_attention_forward, and fcl_attention_merge for callers (ring and cascade attention). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

fcl_combine_layout fcl_combine_layout_of(int64_t parts, int64_t d, size_t wg) {
  fcl_combine_layout c;
  /* Lanes of at most four parts each where 16 lanes allow (one round of loads a lane, combine.cl unrolls
     four), so a row's loads are in flight together; more lanes would lengthen their merge. */
  c.pl = 1;
  while (c.pl < 16 && (int64_t)c.pl * 4 < parts) c.pl *= 2;
  c.vw = d % 4 == 0 ? 4 : 1;
  const int nv = (int)(d / c.vw), w = wg ? (int)wg : 1;
  c.lanes = c.pl < w ? c.pl : w;
  c.cv = nv < w / c.lanes ? nv : w / c.lanes;
  c.slices = (nv + c.cv - 1) / c.cv;
  return c;
}

fcl_status fcl_prepare_combine(fcl_context *ctx, const fcl_problem *p, int in_dtype, cl_uint count,
                               fcl_combine *out) {
  /* Work-items: the lanes times the column groups of a row, at most 128, a power of two the device and the
     kernel admit. */
  const fcl_combine_layout want = fcl_combine_layout_of(count, p->d, 128);
  size_t max_wg = 1;
  while (max_wg < (size_t)want.lanes * (size_t)want.cv) max_wg *= 2;
  char defines[128];
  snprintf(defines, sizeof defines, "-DDTYPE=%d -DPART=%d -DD=%d -DPL=%d%s%s", (int)p->dtype, in_dtype, (int)p->d,
           want.pl, p->sinks ? " -DSINKS=1" : "", p->cu_q ? " -DVARLEN_Q=1" : "");
  static const char *const files[] = {"common.cl", "combine.cl"};
  fcl_status st = fcl_get_kernel_wg(ctx, files, 2, "fcl_combine", defines, max_wg, &out->kernel, &out->wg);
  if (st) return st;
  out->slices = fcl_combine_layout_of(count, p->d, out->wg).slices;
  return fcl_combine_within_budget(&ctx->caps, p, (int64_t)count, out->wg);
}

fcl_status fcl_enqueue_combine(cl_command_queue queue, const fcl_problem *p, const fcl_combine *c,
                               const fcl_merge_parts *parts, cl_mem o, cl_mem lse, cl_uint num_wait,
                               const cl_event *wait, cl_event *event) {
  const cl_kernel kernel = c->kernel;
  size_t wg = c->wg;
  cl_uint a = 0;
  const cl_long part_layout[5] = {parts->offset, parts->stride[0], parts->stride[1], parts->stride[2], parts->part_stride};
  const cl_long o_layout[4] = {p->o_offset, p->o_stride[0], p->o_stride[1], p->o_stride[2]};
  const cl_int count = (cl_int)parts->count, heads = (cl_int)p->heads, nq = (cl_int)p->nq;
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), &parts->o));
  for (int i = 0; i < 5; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_long), &part_layout[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), &parts->lse));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_long), &parts->lse_offset));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_int), &count));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), &o));
  for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_long), &o_layout[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), lse ? &lse : NULL));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_int), &heads));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_int), &nq));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), p->sinks ? &p->sinks : NULL));
  const cl_int total_q = (cl_int)p->total_q;
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), p->cu_q ? &p->cu_q : NULL));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_int), &total_q));
  const size_t global[2] = {(size_t)(p->batch * p->heads * p->nq) * wg, (size_t)c->slices}, local[2] = {wg, 1};
  FCL_CL_CHECK(clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, local, num_wait, wait, event));
  return FCL_SUCCESS;
}

fcl_status fcl_attention_merge(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                               cl_uint num_parts, cl_mem o_parts, int64_t parts_stride, cl_mem lse_parts, cl_mem o,
                               cl_mem lse, cl_uint num_wait, const cl_event *wait, cl_event *event) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  fcl_problem p;
  fcl_status st;
  size_t rows = 0;
  if ((st = fcl_resolve_problem(desc, &p)) || (st = fcl_check_queue(ctx, queue)) ||
      (st = fcl_check_wait_list(ctx, num_wait, wait)) || (st = fcl_row_count(&p, &rows)))
    return st;
  if (fcl_problem_sequences(&p))
    return fcl_fail(FCL_ERROR_UNSUPPORTED,
                    "fcl_attention_merge takes dense queries only (desc->cu_seqlens_q, cu_seqlens_k, seqlens_k or "
                    "block_table is set)");
  if (num_parts < 1 || num_parts > INT32_MAX)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "num_parts is %u; it must be at least 1", num_parts);
  if (parts_stride < 0)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "parts_stride is %lld; it must not be negative", (long long)parts_stride);
  /* Part i is a tensor laid out as o at element o_offset + i * parts_stride of o_parts. */
  uint64_t last;
  if (fcl_mul_add(num_parts - 1, (uint64_t)parts_stride, (uint64_t)p.o_offset, &last))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "o_offset + (num_parts - 1) * parts_stride (%lld + (%u - 1) * %lld) overflows",
                    (long long)p.o_offset, num_parts, (long long)parts_stride);
  const int64_t last_offset = (int64_t)last;
  if ((st = fcl_check_tensor(ctx, o_parts, "o_parts", &p, p.q_counts, p.o_stride, last_offset)) ||
      (rows > SIZE_MAX / num_parts &&
       (st = fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "num_parts * batch * num_heads * seqlen_q is too large"))) ||
      (st = fcl_check_float_buffer(ctx, lse_parts, "lse_parts", rows * num_parts)) ||
      (st = fcl_check_tensor(ctx, o, "o", &p, p.q_counts, p.o_stride, p.o_offset)) ||
      (st = fcl_check_no_overlap("o", &p, p.q_counts, p.o_stride, "o")) ||
      (lse && (st = fcl_check_float_buffer(ctx, lse, "lse", rows))) || (st = fcl_check_modifiers(ctx, &p)))
    return st;
  /* The outputs must not share memory with the parts, the sinks or each other. */
  uint64_t po[2], r[2], m[3][2];
  if ((st = fcl_tensor_bytes(&p, "o_parts", p.q_counts, p.o_stride, p.o_offset, &po[0], &r[1])) ||
      (st = fcl_tensor_bytes(&p, "o_parts", p.q_counts, p.o_stride, last_offset, &r[0], &po[1])) ||
      (st = fcl_tensor_bytes(&p, "o", p.q_counts, p.o_stride, p.o_offset, &r[0], &r[1])))
    return st;
  fcl_modifier_bytes(&p, m[0], m[1], m[2]);
  const fcl_buffer_use uses[] = {{o_parts, po[0], po[1], 0, "o_parts"},
                                 {lse_parts, 0, (uint64_t)rows * num_parts * sizeof(float), 0, "lse_parts"},
                                 {p.sinks, m[2][0], m[2][1], 0, "desc->sinks"},
                                 {o, r[0], r[1], 1, "o"},
                                 {lse, 0, (uint64_t)rows * sizeof(float), 1, "lse"}};
  if ((st = fcl_check_aliasing(uses, (int)(sizeof uses / sizeof uses[0])))) return st;

  const fcl_merge_parts parts = {o_parts, p.o_offset, {p.o_stride[0], p.o_stride[1], p.o_stride[2]}, parts_stride,
                                 lse_parts, 0, num_parts, 1};
  pthread_mutex_lock(&ctx->lock);
  fcl_combine c;
  st = fcl_prepare_combine(ctx, &p, 1, num_parts, &c);
  if (!st) st = fcl_enqueue_combine(queue, &p, &c, &parts, o, lse, num_wait, wait, event);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}
