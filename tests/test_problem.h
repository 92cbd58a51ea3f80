/* A resolved problem for the planner tests, which call the planners (internal.h) over made-up devices, and no
   overrides. */
#ifndef FLASHCL_TEST_PROBLEM_H
#define FLASHCL_TEST_PROBLEM_H

#include "internal.h"

#include <string.h>

/* No development overrides (fcl_plan_overrides all zero): the planners' own plans. */
static const fcl_plan_overrides no_overrides;

/* Contiguous q, k, v, o of 2 batches x 4 heads x seqlen rows of head_dim d (offset elements into each buffer).
   A head_dim the descriptor refuses leaves a zeroed problem with d set, for planners that must decline it. */
static inline fcl_problem test_problem(int64_t d, fcl_dtype dtype, int64_t seqlen, int64_t offset) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = 2;
  desc.num_heads = 4;
  desc.seqlen_q = desc.seqlen_k = seqlen;
  desc.head_dim = d;
  desc.dtype = dtype;
  desc.q_offset = desc.k_offset = desc.v_offset = desc.o_offset = offset;
  fcl_problem p;
  memset(&p, 0, sizeof p);
  if (fcl_resolve_problem(&desc, &p) != FCL_SUCCESS) {
    fcl_clear_error();
    p.d = d, p.dtype = dtype, p.nq = p.nk = seqlen;
  }
  return p;
}

#endif /* FLASHCL_TEST_PROBLEM_H */
