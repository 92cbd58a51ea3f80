/* fcl_attention_backward: validate, plan, set arguments, enqueue three kernels.
 *
 * 1. flash_bwd_pre:  Dvec = rowsum(dO * O) into the workspace (float32 [batch, heads, seqlen_q], or
 *                    [heads, total_q] with packed queries: laid out as lse).
 * 2. flash_bwd_dkdv: dK, dV per block of key rows, summed over the query heads of a kv head in order.
 * 3. flash_bwd_dq:   dQ per block of query rows, recomputing P and dS over the key blocks.
 * (4. flash_bwd_dsinks: d_sinks, when asked for.) 2 and 3 are the first backward variant of the table
 * (variants.c) that takes the problem and builds: on NVIDIA (compute capability 8.0 and up, f32/f16/bf16, head_dim
 * a multiple of 8 up to 128, 16-byte aligned rows) the tensor-core kernels of cl/nvidia/flash_bwd_mma.cl;
 * otherwise, or with FCL_FLAG_PORTABLE_ONLY / FLASHCL_PORTABLE_ONLY=1, the portable ones. Packed queries and
 * packed or dense keys with per-sequence lengths go through common.cl's sequence layer; paged K/V is refused.
 * No atomics anywhere, so the gradients are bitwise reproducible. The three are chained with events, so
 * the order holds on in-order and out-of-order queues alike. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* The pre-pass and the d_sinks reduction are in the portable backward's source whatever variant computes the
   gradients. */
static const fcl_variant *const backward_source = &fcl_variants[FCL_VARIANT_PORTABLE_BACKWARD];

/* The pre-pass's largest work-group (its local array of partial sums, flash_bwd.cl). */
#define PRE_MAX_WG 256

size_t fcl_attention_backward_workspace_size(fcl_context *ctx, const fcl_attention_desc *desc) {
  if (!ctx) {
    fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    return 0;
  }
  fcl_problem p;
  if (fcl_resolve_problem(desc, &p) != FCL_SUCCESS) return 0;
  size_t n = 0;
  if (fcl_row_count(&p, &n) != FCL_SUCCESS) return 0; /* Dvec: one float per query row */
  return n * sizeof(float);
}

static fcl_status validate_backward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                    cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o, cl_mem d_q,
                                    cl_mem d_k, cl_mem d_v, cl_mem workspace, cl_uint num_wait,
                                    const cl_event *wait, fcl_problem *p, size_t *ws_floats) {
  fcl_status st = fcl_check_forward_args(ctx, queue, desc, q, k, v, o, lse, NULL, num_wait, wait, 0, p);
  if (st) return st;
  if ((st = fcl_backward_supported(p))) return st;
  if (!lse)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                    "lse is NULL; the backward pass needs the forward's lse (float32 [batch, num_heads, seqlen_q], or "
                    "[num_heads, total_q] with cu_seqlens_q)");
  if ((st = fcl_check_tensor(ctx, d_o, "d_o", p, p->q_counts, p->o_stride, p->o_offset)) ||
      (st = fcl_check_tensor(ctx, d_q, "d_q", p, p->q_counts, p->q_stride, p->q_offset)) ||
      (st = fcl_check_tensor(ctx, d_k, "d_k", p, p->kv_counts, p->k_stride, p->k_offset)) ||
      (st = fcl_check_tensor(ctx, d_v, "d_v", p, p->kv_counts, p->v_stride, p->v_offset)) ||
      (st = fcl_check_no_overlap("d_q (laid out as q)", p, p->q_counts, p->q_stride, "q")) ||
      (st = fcl_check_no_overlap("d_k (laid out as k)", p, p->kv_counts, p->k_stride, "k")) ||
      (st = fcl_check_no_overlap("d_v (laid out as v)", p, p->kv_counts, p->v_stride, "v")) ||
      (st = fcl_row_count(p, ws_floats)) || (st = fcl_check_float_buffer(ctx, workspace, "workspace", *ws_floats)) ||
      (p->d_sinks && (st = fcl_check_float_buffer(ctx, p->d_sinks, "desc->d_sinks", (size_t)p->heads))))
    return st;

  /* The buffers written (gradients, workspace, d_sinks) must not share memory with any other; o and lse are
     read here, so they may share memory with the other inputs. */
  uint64_t r[4][2];
  size_t rows = 0;
  if ((st = fcl_row_count(p, &rows)) || (st = fcl_attention_bytes(p, r))) return st;
  fcl_buffer_use uses[FCL_INPUT_USES + 8];
  int n = fcl_input_uses(p, q, k, v, r, uses);
  const fcl_buffer_use rest[8] = {{o, r[3][0], r[3][1], 0, "o"},
                                  {lse, 0, (uint64_t)rows * sizeof(float), 0, "lse"},
                                  {d_o, r[3][0], r[3][1], 0, "d_o"},
                                  {d_q, r[0][0], r[0][1], 1, "d_q"},
                                  {d_k, r[1][0], r[1][1], 1, "d_k"},
                                  {d_v, r[2][0], r[2][1], 1, "d_v"},
                                  {workspace, 0, (uint64_t)*ws_floats * sizeof(float), 1, "workspace"},
                                  {p->d_sinks, 0, (uint64_t)p->heads * sizeof(float), 1, "desc->d_sinks"}};
  for (int i = 0; i < 8; ++i) uses[n++] = rest[i];
  return fcl_check_aliasing(uses, n);
}

fcl_status fcl_backward_supported(const fcl_problem *p) {
  if (p->block_table)
    return fcl_fail(FCL_ERROR_UNSUPPORTED,
                    "the backward does not take paged K/V (desc->block_table is set); packed sequences "
                    "(cu_seqlens_q, cu_seqlens_k, seqlens_k) are supported");
  return FCL_SUCCESS;
}

/* Work-items of the d_sinks reduction: a power of two the device and kernel admit. It walks the sequences, so
   it is built with their defines. */
static fcl_status dsinks_kernel(fcl_context *ctx, const fcl_problem *p, cl_kernel *kernel, size_t *wg_out) {
  char defines[128] = "-DBWD_KIND=3 -DDTYPE=0";
  const size_t n = strlen(defines);
  fcl_sequence_defines(p, defines + n, sizeof defines - n);
  return fcl_get_kernel_wg(ctx, backward_source->files, backward_source->num_files, "flash_bwd_dsinks", defines, 256,
                           kernel, wg_out);
}

fcl_status fcl_select_backward(fcl_context *ctx, const fcl_problem *p, fcl_tile_plan plans[2], cl_kernel kernels[4],
                               size_t *dsinks_wg) {
  char defines[128], mods[160], why[sizeof plans[0].reason];
  fcl_modifier_defines(p, mods, sizeof mods);
  snprintf(defines, sizeof defines, "-DBWD_KIND=0 -DDTYPE=%d -DD=%d -DPRE_MAX_WG=%d", (int)p->dtype, (int)p->d,
           PRE_MAX_WG);
  fcl_status st =
      fcl_get_kernel(ctx, backward_source->files, backward_source->num_files, "flash_bwd_pre", defines, &kernels[0]);
  if (st) return st;
  const fcl_variant *v;
  if ((st = fcl_select_variant(ctx, FCL_OP_BACKWARD, p, mods, &v, plans, &kernels[1], why, sizeof why))) return st;
  /* The portable kernels: the dK/dV plan's reason says why the vendor kernel was not taken where one exists for
     the platform (fcl_describe_plan reports it). */
  if (v->vendor == FCL_VENDOR_OTHER) snprintf(plans[FCL_BWD_DKDV].reason, sizeof plans[FCL_BWD_DKDV].reason, "%s", why);
  kernels[3] = NULL;
  *dsinks_wg = 0;
  if (p->d_sinks && (st = dsinks_kernel(ctx, p, &kernels[3], dsinks_wg))) return st;
  return FCL_SUCCESS;
}

static fcl_status set_layout_args(cl_kernel kernel, cl_uint *a, int64_t offset, const int64_t stride[3]) {
  const cl_long vals[4] = {offset, stride[0], stride[1], stride[2]};
  for (int j = 0; j < 4; ++j) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_long), &vals[j]));
  return FCL_SUCCESS;
}

static fcl_status set_buffers(cl_kernel kernel, cl_uint *a, const cl_mem *bufs, int n) {
  for (int i = 0; i < n; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), &bufs[i]));
  return FCL_SUCCESS;
}

/* Sets every argument of the kernels (nothing is enqueued if one fails), then enqueues them as an event
   chain: pre waits on the caller's list, dK/dV on pre, dQ on dK/dV, d_sinks (when asked for) on dQ; the
   last one's event is the caller's. Only a failing clEnqueueNDRangeKernel after the first (an OpenCL
   failure, not a bad argument) can leave part of the chain enqueued; it then still runs in order and
   writes only the buffers named as outputs. */
static fcl_status enqueue_backward(fcl_context *ctx, cl_command_queue queue, const fcl_problem *p,
                                   const fcl_tile_plan plans[2], cl_kernel kernels[4], size_t dsinks_wg, cl_mem q, cl_mem k,
                                   cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o, cl_mem d_q, cl_mem d_k,
                                   cl_mem d_v, cl_mem workspace, cl_uint num_wait, const cl_event *wait,
                                   cl_event *event) {
  fcl_status st;
  cl_uint a = 0;
  const cl_mem pre_bufs[3] = {o, d_o, workspace};
  if ((st = set_buffers(kernels[0], &a, pre_bufs, 3)) ||
      (st = set_layout_args(kernels[0], &a, p->o_offset, p->o_stride)))
    return st;
  /* Packed queries: the pre-pass runs over the total_q rows as one batch, which lays Dvec out as lse. */
  const int64_t pre_rows = p->cu_q ? p->total_q : p->nq, pre_batch = p->cu_q ? 1 : p->batch;
  /* The pre-pass: work-groups of up to PRE_MAX_WG work-items (a power of two), `lanes` of them a query row: up to
     16, at most head_dim. */
  size_t pre_wg = 0;
  FCL_CL_CHECK(clGetKernelWorkGroupInfo(kernels[0], ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof pre_wg, &pre_wg,
                                        NULL));
  const size_t pre_limit = fcl_work_group_limit(&ctx->caps, pre_wg);
  size_t pre_local = PRE_MAX_WG;
  while (pre_local > 1 && pre_local > pre_limit) pre_local /= 2;
  size_t lanes = 16;
  while (lanes > 1 && (lanes > pre_local || (int64_t)lanes > p->d)) lanes /= 2;
  const size_t pre_row_groups = ((size_t)pre_rows + pre_local / lanes - 1) / (pre_local / lanes);
  const cl_int pre_ints[3] = {(cl_int)p->heads, (cl_int)pre_rows, (cl_int)lanes};
  for (int i = 0; i < 3; ++i) FCL_CL_CHECK(clSetKernelArg(kernels[0], a++, sizeof(cl_int), &pre_ints[i]));
  a = 0;
  const cl_mem dkdv_bufs[8] = {q, k, v, d_o, lse, workspace, d_k, d_v};
  if ((st = set_buffers(kernels[1], &a, dkdv_bufs, 8)) || (st = fcl_set_problem_args(kernels[1], &a, p))) return st;
  a = 0;
  const cl_mem dq_bufs[7] = {q, k, v, d_o, lse, workspace, d_q};
  if ((st = set_buffers(kernels[2], &a, dq_bufs, 7)) || (st = fcl_set_problem_args(kernels[2], &a, p))) return st;
  if (kernels[3]) {
    a = 0;
    const cl_mem ds_bufs[4] = {lse, workspace, p->sinks, p->d_sinks};
    if ((st = set_buffers(kernels[3], &a, ds_bufs, 4))) return st;
    const cl_int ds_ints[4] = {(cl_int)p->heads, (cl_int)p->batch, (cl_int)p->nq, (cl_int)p->nk};
    for (int i = 0; i < 4; ++i) FCL_CL_CHECK(clSetKernelArg(kernels[3], a++, sizeof(cl_int), &ds_ints[i]));
    if ((st = fcl_set_sequence_args(kernels[3], &a, p))) return st;
  }

  const size_t pre_global[3] = {pre_row_groups * pre_local, (size_t)p->heads, (size_t)pre_batch};
  const size_t pre_lsize[3] = {pre_local, 1, 1};

  const fcl_tile_plan *kv = &plans[FCL_BWD_DKDV], *qp = &plans[FCL_BWD_DQ];
  const size_t kv_global[3] = {(size_t)((p->nk + kv->bc - 1) / kv->bc) * (size_t)kv->wg, (size_t)p->kv_heads,
                               (size_t)p->batch};
  const size_t kv_local[3] = {(size_t)kv->wg, 1, 1};
  const size_t q_global[3] = {(size_t)((p->nq + qp->br - 1) / qp->br) * (size_t)qp->wg, (size_t)p->heads,
                              (size_t)p->batch};
  const size_t q_local[3] = {(size_t)qp->wg, 1, 1};

  /* Through an event chain: the intermediate events must outlive the commands that depend on them. d_sinks
     reads Dvec and lse only; it runs last so one event covers every output. */
  static const char *const names[4] = {"clEnqueueNDRangeKernel(flash_bwd_pre)", "clEnqueueNDRangeKernel(flash_bwd_dkdv)",
                                       "clEnqueueNDRangeKernel(flash_bwd_dq)",
                                       "clEnqueueNDRangeKernel(flash_bwd_dsinks)"};
  const size_t ds_global[3] = {(size_t)p->heads * dsinks_wg, 1, 1}, ds_local[3] = {dsinks_wg, 1, 1};
  const size_t *globals[4] = {pre_global, kv_global, q_global, ds_global};
  const size_t *locals[4] = {pre_lsize, kv_local, q_local, ds_local};
  const cl_uint dims[4] = {3, 3, 3, 1};
  fcl_chain chain;
  st = FCL_SUCCESS;
  fcl_chain_begin(&chain, queue, num_wait, wait);
  const int steps = kernels[3] ? 4 : 3;
  for (int i = 0; i < steps && !st; ++i) {
    cl_uint nw;
    const cl_event *w;
    cl_event *ev;
    if ((st = fcl_chain_next(&chain, i == steps - 1, &nw, &w, &ev))) break;
    cl_int err = clEnqueueNDRangeKernel(queue, kernels[i], dims[i], NULL, globals[i], locals[i], nw, w, ev);
    fcl_chain_push(&chain);
    if (err != CL_SUCCESS) st = fcl_cl_failure(names[i], err);
  }
  const fcl_status end = fcl_chain_end(&chain, st ? NULL : event);
  return st ? st : end;
}

fcl_status fcl_attention_backward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                  cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o, cl_mem d_q,
                                  cl_mem d_k, cl_mem d_v, cl_mem workspace, cl_uint num_wait,
                                  const cl_event *wait, cl_event *event) {
  fcl_problem p;
  size_t ws_floats = 0;
  fcl_status st = validate_backward(ctx, queue, desc, q, k, v, o, lse, d_o, d_q, d_k, d_v, workspace, num_wait,
                                    wait, &p, &ws_floats);
  if (st) return st;
  pthread_mutex_lock(&ctx->lock);
  fcl_tile_plan plans[2];
  cl_kernel kernels[4];
  size_t dsinks_wg = 0;
  st = fcl_select_backward(ctx, &p, plans, kernels, &dsinks_wg);
  if (!st) st = fcl_backward_within_budget(&ctx->caps, &p, plans, dsinks_wg);
  if (!st)
    st = enqueue_backward(ctx, queue, &p, plans, kernels, dsinks_wg, q, k, v, o, lse, d_o, d_q, d_k, d_v, workspace,
                          num_wait, wait, event);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}
