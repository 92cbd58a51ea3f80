/* fcl_attention_forward: validate, plan, set arguments, enqueue. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The split-KV build of the portable kernel for plan, or splits back to 1 when it admits fewer work-items. */
static fcl_status split_kernel(fcl_context *ctx, const fcl_variant *v, const fcl_problem *p, const char *mods,
                               fcl_tile_plan *plan, cl_kernel *kernel) {
  cl_kernel k;
  size_t wg = 0;
  fcl_status st = fcl_variant_kernel(ctx, v, p, plan, 0, mods, &k, &wg);
  if (st) return st;
  if (wg >= (size_t)plan->wg) *kernel = k;
  else plan->splits = 1;
  return FCL_SUCCESS;
}

fcl_status fcl_select_forward(fcl_context *ctx, const fcl_problem *p, fcl_tile_plan *plan, cl_kernel *kernel) {
  char mods[176], why[sizeof plan->reason];
  fcl_modifier_defines(p, mods, sizeof mods);
  const fcl_variant *v;
  fcl_status st = fcl_select_variant(ctx, FCL_OP_FORWARD, p, mods, &v, plan, kernel, why, sizeof why);
  if (st || v->vendor != FCL_VENDOR_OTHER) return st; /* a vendor plan comes with its split count */
  /* The portable kernel: its reason says why the vendor kernel was not taken where one exists for the
     platform, and its split count is decided on the plan its compiled kernel admits. */
  if (why[0]) snprintf(plan->reason + strlen(plan->reason), sizeof plan->reason - strlen(plan->reason), "; %s", why);
  plan->splits = fcl_plan_splits(&ctx->caps, &ctx->overrides, p, plan);
  /* A device with a loop budget (docs/testing.md) gets enough chunks that no launch exceeds it. */
  const int budget_splits = fcl_forward_budget_splits(&ctx->caps, p, plan);
  if (plan->splits < budget_splits) plan->splits = budget_splits;
  return plan->splits > 1 ? split_kernel(ctx, v, p, mods, plan, kernel) : FCL_SUCCESS;
}

/* Bytes of float32 partials (O and lse) of a split-KV call; 0 on overflow. */
static size_t split_bytes(const fcl_problem *p, int splits) {
  size_t rows = 0;
  if (fcl_padded_rows(p, &rows) != FCL_SUCCESS) return 0;
  const double bytes = (double)splits * (double)rows * (double)(p->d + 1) * sizeof(float);
  return bytes > (double)(SIZE_MAX / 2) ? 0 : (size_t)bytes;
}


/* Sets the arguments shared by flash_fwd and flash_fwd_mma and enqueues blocks of t->br rows (query rows, or
   packed (query row, head) pairs per kv head), times t->splits chunks of keys; with splits > 1 the partials go to part (float32 O, then lse at part_lse_off). */
static fcl_status enqueue_launch(cl_command_queue queue, const fcl_problem *p, const fcl_tile_plan *t, cl_kernel kernel,
                                 cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem part, cl_long part_lse_off,
                                 cl_uint num_wait, const cl_event *wait, cl_event *event) {
  cl_uint a = 0;
  const cl_mem bufs[5] = {q, k, v, o, lse};
  for (int i = 0; i < 5; ++i) FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), bufs[i] ? &bufs[i] : NULL));
  fcl_status st = fcl_set_problem_args(kernel, &a, p);
  if (st) return st;
  const cl_int splits = t->splits > 1 ? t->splits : 1;
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_int), &splits));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_mem), part ? &part : NULL));
  FCL_CL_CHECK(clSetKernelArg(kernel, a++, sizeof(cl_long), &part_lse_off));
  const size_t blocks = (size_t)fcl_forward_row_blocks(p, t) * (size_t)splits;
  const size_t global[3] = {blocks * (size_t)t->wg, (size_t)fcl_forward_grid_heads(p, t), (size_t)p->batch};
  const size_t local[3] = {(size_t)t->wg, 1, 1};
  FCL_CL_CHECK(clEnqueueNDRangeKernel(queue, kernel, 3, NULL, global, local, num_wait, wait, event));
  return FCL_SUCCESS;
}

fcl_status fcl_enqueue_forward(cl_command_queue queue, const fcl_problem *p, const fcl_tile_plan *t, cl_kernel kernel,
                               cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait,
                               const cl_event *wait, cl_event *event) {
  fcl_tile_plan one = *t;
  one.splits = 1;
  return enqueue_launch(queue, p, &one, kernel, q, k, v, o, lse, NULL, 0, num_wait, wait, event);
}

/* Split-KV: the partials into the workspace (or the context's scratch for queue), then their combine into o
   and lse. The partials wait for the caller's list and for the scratch's previous use. Caller holds
   ctx->lock. */
static fcl_status enqueue_split(fcl_context *ctx, cl_command_queue queue, const fcl_problem *p, const fcl_tile_plan *t,
                                cl_kernel kernel, cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                cl_uint num_wait, const cl_event *wait, cl_event *event) {
  size_t rows = 0;
  fcl_status st = fcl_padded_rows(p, &rows);
  if (st) return st;
  const size_t bytes = split_bytes(p, t->splits);
  if (!bytes) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "split-KV partials of %d chunks are too large", t->splits);
  /* The combine is built and checked first, so a refusal leaves nothing enqueued. */
  fcl_combine combine;
  if ((st = fcl_prepare_combine(ctx, p, 0, (cl_uint)t->splits, &combine))) return st;
  cl_mem part = workspace;
  cl_event last = NULL;
  if (workspace) {
    size_t have = 0;
    FCL_CL_CHECK(clGetMemObjectInfo(workspace, CL_MEM_SIZE, sizeof have, &have, NULL));
    if (have < bytes)
      return fcl_fail(FCL_ERROR_INVALID_ARGUMENT,
                      "workspace holds %zu bytes; this call splits the keys into %d chunks and needs %zu "
                      "(fcl_attention_forward_workspace_size)",
                      have, t->splits, bytes);
  } else if ((st = fcl_scratch_get(ctx, queue, bytes, &part, &last))) {
    return st;
  }
  /* The caller's wait list and the scratch's previous use (kept on out-of-order queues only, scratch.c). */
  cl_event waits_small[8], *waits = waits_small;
  if (num_wait + 1 > 8 && !(waits = malloc((num_wait + 1) * sizeof *waits)))
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  cl_uint n = 0;
  for (cl_uint i = 0; i < num_wait; ++i) waits[n++] = wait[i];
  if (last) waits[n++] = last;
  const cl_long lse_off = (cl_long)((size_t)t->splits * rows * (size_t)p->d);
  const fcl_merge_parts parts = {part, 0, {(int64_t)(p->heads * p->nq * p->d), p->nq * p->d, p->d},
                                 (int64_t)(rows * (size_t)p->d), part, lse_off, (cl_uint)t->splits, 0};
  /* Partials, then their combine, as one chain (its events live until the combine completes). */
  fcl_chain ch;
  fcl_chain_begin(&ch, queue, n, n ? waits : NULL);
  cl_uint nw;
  const cl_event *w;
  cl_event *ev, done = NULL;
  if (!(st = fcl_chain_next(&ch, 0, &nw, &w, &ev))) {
    st = enqueue_launch(queue, p, t, kernel, q, k, v, NULL, NULL, part, lse_off, nw, w, ev);
    fcl_chain_push(&ch);
  }
  if (!st && !(st = fcl_chain_next(&ch, 1, &nw, &w, &ev))) {
    st = fcl_enqueue_combine(queue, p, &combine, &parts, o, lse, nw, w, ev);
    fcl_chain_push(&ch);
  }
  /* The scratch's use ends with the chain's last command, also when the combine was refused after the partials
     were enqueued: they still write the buffer, and the next call must not overwrite it before they are done. */
  if (!workspace && ch.count) fcl_scratch_used(ctx, queue, ch.events[ch.count - 1]);
  const fcl_status end = fcl_chain_end(&ch, st ? NULL : &done);
  if (waits != waits_small) free(waits);
  if (st || end) return st ? st : end;
  if (event) *event = done;
  else clReleaseEvent(done);
  return FCL_SUCCESS;
}

/* The forward on a validated problem: select, then one launch or the split-KV pair. */
static fcl_status run_forward(fcl_context *ctx, cl_command_queue queue, const fcl_problem *p, cl_mem q, cl_mem k,
                              cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace, cl_uint num_wait, const cl_event *wait,
                              cl_event *event) {
  pthread_mutex_lock(&ctx->lock);
  fcl_tile_plan plan;
  cl_kernel kernel;
  fcl_status st = fcl_select_forward(ctx, p, &plan, &kernel);
  if (!st) st = fcl_forward_within_budget(&ctx->caps, p, &plan);
  if (!st)
    st = plan.splits > 1 ? enqueue_split(ctx, queue, p, &plan, kernel, q, k, v, o, lse, workspace, num_wait, wait, event)
                         : enqueue_launch(queue, p, &plan, kernel, q, k, v, o, lse, NULL, 0, num_wait, wait, event);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fcl_status fcl_attention_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                 cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait,
                                 const cl_event *wait, cl_event *event) {
  fcl_problem p;
  fcl_status st = fcl_validate_forward(ctx, queue, desc, q, k, v, o, lse, NULL, num_wait, wait, &p);
  return st ? st : run_forward(ctx, queue, &p, q, k, v, o, lse, NULL, num_wait, wait, event);
}

size_t fcl_attention_forward_workspace_size(fcl_context *ctx, const fcl_attention_desc *desc) {
  if (!ctx) {
    fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    return 0;
  }
  fcl_problem p;
  if (fcl_resolve_problem(desc, &p) != FCL_SUCCESS) return 0;
  pthread_mutex_lock(&ctx->lock);
  fcl_tile_plan plan;
  cl_kernel kernel;
  const fcl_status st = fcl_select_forward(ctx, &p, &plan, &kernel);
  pthread_mutex_unlock(&ctx->lock);
  return st || plan.splits <= 1 ? 0 : split_bytes(&p, plan.splits);
}

fcl_status fcl_attention_forward_with_workspace(fcl_context *ctx, cl_command_queue queue,
                                                const fcl_attention_desc *desc, cl_mem q, cl_mem k, cl_mem v,
                                                cl_mem o, cl_mem lse, cl_mem workspace, cl_uint num_wait,
                                                const cl_event *wait, cl_event *event) {
  fcl_problem p;
  /* The workspace's size depends on the plan and is checked when the call splits. */
  fcl_status st = fcl_validate_forward(ctx, queue, desc, q, k, v, o, lse, workspace, num_wait, wait, &p);
  if (st) return st;
  return run_forward(ctx, queue, &p, q, k, v, o, lse, workspace, num_wait, wait, event);
}
