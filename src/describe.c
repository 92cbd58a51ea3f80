/* fcl_describe_plan: what the forward or backward would run for a descriptor, without enqueuing anything. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

fcl_status fcl_describe_plan(fcl_context *ctx, fcl_operation op, const fcl_attention_desc *desc,
                             fcl_plan_info *out) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  if (!out) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  if (op != FCL_OP_FORWARD && op != FCL_OP_BACKWARD)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "op is %d; it must be FCL_OP_FORWARD or FCL_OP_BACKWARD", (int)op);
  fcl_problem p;
  fcl_status st = fcl_resolve_problem(desc, &p);
  if (st) return st;
  if (op == FCL_OP_BACKWARD) return fcl_describe_backward(ctx, &p, out);
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&ctx->lock);
  fcl_tile_plan plan;
  cl_kernel kernel;
  st = fcl_select_forward(ctx, &p, &plan, &kernel);
  pthread_mutex_unlock(&ctx->lock);
  if (st) return st;
  snprintf(out->kernel, sizeof out->kernel, "%s", fcl_variants[plan.variant].name);
  snprintf(out->reason, sizeof out->reason, "%s", plan.reason);
  out->block_q = plan.br;
  out->block_k = plan.bc;
  out->work_group_size = plan.wg;
  out->local_mem_bytes = plan.local_bytes;
  out->splits = plan.splits > 1 ? plan.splits : 1;
  out->work_groups = (size_t)fcl_forward_row_blocks(&p, &plan) * (size_t)out->splits *
                     (size_t)fcl_forward_grid_heads(&p, &plan) * (size_t)p.batch;
  if (out->splits > 1) {
    const size_t n = strlen(out->reason);
    snprintf(out->reason + n, sizeof out->reason - n, "; keys split into %d chunks, merged by a combine kernel",
             out->splits);
  }
  if (plan.subgroup) {
    const size_t n = strlen(out->reason);
    snprintf(out->reason + n, sizeof out->reason - n, "; row maxima and sums by %s shuffles where the layout allows",
             plan.subgroup == FCL_SG_NVIDIA_WARP ? "warp" : "sub-group");
  }
  return FCL_SUCCESS;
}

fcl_status fcl_describe_backward(fcl_context *ctx, const fcl_problem *p, fcl_plan_info *out) {
  memset(out, 0, sizeof *out);
  fcl_status st = fcl_backward_supported(p);
  if (st) return st;
  pthread_mutex_lock(&ctx->lock);
  fcl_tile_plan plans[2];
  cl_kernel kernels[4];
  size_t dsinks_wg = 0;
  st = fcl_select_backward(ctx, p, plans, kernels, &dsinks_wg);
  pthread_mutex_unlock(&ctx->lock);
  if (st) return st;
  const fcl_tile_plan *kv = &plans[FCL_BWD_DKDV], *qp = &plans[FCL_BWD_DQ];
  const fcl_variant *v = &fcl_variants[kv->variant];
  snprintf(out->kernel, sizeof out->kernel, "%s", v->name);
  if (v->vendor != FCL_VENDOR_OTHER) {
    /* The two plans' reasons, cut to fit (the return value is read so a cut is not a warning). */
    if (snprintf(out->reason, sizeof out->reason, "%s; %s", kv->reason, qp->reason) >= (int)sizeof out->reason)
      out->reason[sizeof out->reason - 1] = '\0';
  } else {
    /* Short, so that the reason a vendor variant was passed over (last) fits. */
    if (snprintf(out->reason, sizeof out->reason,
             "dK/dV %d keys x %d query rows a step, %dx%d work-items, %zu B; dQ %d query rows x %d keys a step, "
             "%dx%d work-items, %zu B%s%s",
             kv->bc, kv->br, kv->tr, kv->tc, kv->local_bytes, qp->br, qp->bc, qp->tr, qp->tc, qp->local_bytes,
             kv->reason[0] ? "; " : "", kv->reason) >= (int)sizeof out->reason)
      out->reason[sizeof out->reason - 1] = '\0'; /* cut to fit: the decline reason is the part that is cut */
  }
  out->block_q = qp->br;
  out->block_k = kv->bc;
  out->work_group_size = kv->wg > qp->wg ? kv->wg : qp->wg;
  out->local_mem_bytes = kv->local_bytes > qp->local_bytes ? kv->local_bytes : qp->local_bytes;
  out->work_groups = (size_t)((p->nk + kv->bc - 1) / kv->bc) * (size_t)p->kv_heads * (size_t)p->batch +
                     (size_t)((p->nq + qp->br - 1) / qp->br) * (size_t)p->heads * (size_t)p->batch;
  return FCL_SUCCESS;
}
