/* What every operation shares below its entry point: validation of the forward's arguments (the backward
 * and the reference path take the same ones and more) and the kernel arguments every attention kernel
 * takes after its buffers. */
#include "internal.h"

fcl_status fcl_check_forward_args(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                  cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                  cl_uint num_wait, const cl_event *wait, int o_written, fcl_problem *p) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  fcl_status st;
  size_t rows = 0;
  if ((st = fcl_resolve_problem(desc, p)) || (st = fcl_check_queue(ctx, queue)) ||
      (st = fcl_check_tensor(ctx, q, "q", p, p->q_counts, p->q_stride, p->q_offset)) ||
      (st = fcl_check_tensor(ctx, k, "k", p, p->kv_counts, p->k_stride, p->k_offset)) ||
      (st = fcl_check_tensor(ctx, v, "v", p, p->kv_counts, p->v_stride, p->v_offset)) ||
      (st = fcl_check_tensor(ctx, o, "o", p, p->q_counts, p->o_stride, p->o_offset)) ||
      (o_written && (st = fcl_check_no_overlap("o", p, p->q_counts, p->o_stride, "o"))) || (st = fcl_row_count(p, &rows)) ||
      (lse && (st = fcl_check_float_buffer(ctx, lse, "lse", rows))) || (st = fcl_check_modifiers(ctx, p)) || (st = fcl_check_sequences(ctx, p)) ||
      (workspace && (st = fcl_check_float_buffer(ctx, workspace, "workspace", 0))) ||
      (st = fcl_check_wait_list(ctx, num_wait, wait)))
    return st;
  return FCL_SUCCESS;
}

fcl_status fcl_validate_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                cl_uint num_wait, const cl_event *wait, fcl_problem *p) {
  fcl_status st;
  size_t rows = 0, ws_size = 0;
  if ((st = fcl_check_forward_args(ctx, queue, desc, q, k, v, o, lse, workspace, num_wait, wait, 1, p)) ||
      (st = fcl_row_count(p, &rows)))
    return st;
  if (workspace) FCL_CL_CHECK(clGetMemObjectInfo(workspace, CL_MEM_SIZE, sizeof ws_size, &ws_size, NULL));
  /* The outputs must not share memory with an input or each other. */
  uint64_t r[4][2];
  if ((st = fcl_attention_bytes(p, r))) return st;
  fcl_buffer_use uses[FCL_INPUT_USES + 3];
  int n = fcl_input_uses(p, q, k, v, r, uses);
  uses[n++] = (fcl_buffer_use){o, r[3][0], r[3][1], 1, "o"};
  uses[n++] = (fcl_buffer_use){lse, 0, (uint64_t)rows * sizeof(float), 1, "lse"};
  uses[n++] = (fcl_buffer_use){workspace, 0, ws_size, 1, "workspace"};
  return fcl_check_aliasing(uses, n);
}

int fcl_input_uses(const fcl_problem *p, cl_mem q, cl_mem k, cl_mem v, const uint64_t r[4][2],
                   fcl_buffer_use out[FCL_INPUT_USES]) {
  uint64_t m[3][2], sq[4][2];
  fcl_modifier_bytes(p, m[0], m[1], m[2]);
  fcl_sequence_bytes(p, sq);
  const fcl_buffer_use uses[FCL_INPUT_USES] = {{q, r[0][0], r[0][1], 0, "q"},
                                               {k, r[1][0], r[1][1], 0, "k"},
                                               {v, r[2][0], r[2][1], 0, "v"},
                                               {p->alibi, m[0][0], m[0][1], 0, "desc->alibi_slopes"},
                                               {p->mask, m[1][0], m[1][1], 0, "desc->mask"},
                                               {p->sinks, m[2][0], m[2][1], 0, "desc->sinks"},
                                               {p->cu_q, sq[0][0], sq[0][1], 0, "desc->cu_seqlens_q"},
                                               {p->cu_k, sq[1][0], sq[1][1], 0, "desc->cu_seqlens_k"},
                                               {p->seqlens_k, sq[2][0], sq[2][1], 0, "desc->seqlens_k"},
                                               {p->block_table, sq[3][0], sq[3][1], 0, "desc->block_table"}};
  for (int i = 0; i < FCL_INPUT_USES; ++i) out[i] = uses[i];
  return FCL_INPUT_USES;
}

fcl_status fcl_set_problem_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p) {
  const int64_t *strides[4] = {p->q_stride, p->k_stride, p->v_stride, p->o_stride};
  const int64_t offsets[4] = {p->q_offset, p->k_offset, p->v_offset, p->o_offset};
  for (int i = 0; i < 4; ++i) {
    const cl_long vals[4] = {offsets[i], strides[i][0], strides[i][1], strides[i][2]};
    for (int j = 0; j < 4; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_long), &vals[j]));
  }
  const cl_int ints[4] = {(cl_int)p->heads, (cl_int)p->group, (cl_int)p->nq, (cl_int)p->nk};
  for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_int), &ints[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_float), &p->scale));
  fcl_status st = fcl_set_modifier_args(kernel, a, p);
  return st ? st : fcl_set_sequence_args(kernel, a, p);
}

fcl_status fcl_set_modifier_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p) {
  const cl_int window[2] = {(cl_int)p->wl, (cl_int)p->wr};
  for (int i = 0; i < 2; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_int), &window[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_float), &p->softcap));
  const cl_long alibi[2] = {p->alibi_offset, p->alibi_sb};
  const cl_long mask[4] = {p->mask_offset, p->mask_stride[0], p->mask_stride[1], p->mask_stride[2]};
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), p->alibi ? &p->alibi : NULL));
  for (int i = 0; i < 2; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_long), &alibi[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), p->mask ? &p->mask : NULL));
  for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_long), &mask[i]));
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), p->sinks ? &p->sinks : NULL));
  return FCL_SUCCESS;
}

fcl_status fcl_attention_bytes(const fcl_problem *p, uint64_t r[4][2]) {
  fcl_status st;
  if ((st = fcl_tensor_bytes(p, "q", p->q_counts, p->q_stride, p->q_offset, &r[0][0], &r[0][1])) ||
      (st = fcl_tensor_bytes(p, "k", p->kv_counts, p->k_stride, p->k_offset, &r[1][0], &r[1][1])) ||
      (st = fcl_tensor_bytes(p, "v", p->kv_counts, p->v_stride, p->v_offset, &r[2][0], &r[2][1])) ||
      (st = fcl_tensor_bytes(p, "o", p->q_counts, p->o_stride, p->o_offset, &r[3][0], &r[3][1])))
    return st;
  return FCL_SUCCESS;
}

fcl_status fcl_set_sequence_args(cl_kernel kernel, cl_uint *a, const fcl_problem *p) {
  const cl_mem bufs[4] = {p->cu_q, p->cu_k, p->seqlens_k, p->block_table};
  for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), bufs[i] ? &bufs[i] : NULL));
  const cl_long table_stride = p->table_stride;
  FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_long), &table_stride));
  const cl_int ints[4] = {(cl_int)p->block_size, (cl_int)p->num_blocks, (cl_int)p->total_q, (cl_int)p->total_k};
  for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_int), &ints[i]));
  return FCL_SUCCESS;
}
