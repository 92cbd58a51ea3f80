/* The backward pass checked end to end against float64 host gradients: fresh random inputs, gradients
 * poisoned with NaN before each run, dQ, dK, dV compared with the per-dtype bounds below, a second run
 * compared bitwise with the first, and rows that see no key checked for exact zeros. */
#ifndef FLASHCL_BACKWARD_CHECK_H
#define FLASHCL_BACKWARD_CHECK_H

#include "test_util.h"

typedef struct bwd_case {
  long long b, h, hkv, nq, nk, d; /* hkv 0: = h */
  fcl_dtype dtype;
  int causal;
  int layout;       /* LAYOUT_* for every tensor */
  float scale;      /* 0: default */
  int from_forward; /* o and lse from fcl_attention_forward instead of the host reference */
} bwd_case;

/* ||grad - ref|| / ||ref|| bounds for each of dQ, dK, dV. The inputs are the same dtype-rounded values on
   both sides; what remains is float32 arithmetic, O stored in the dtype (it enters D = rowsum(dO * O)),
   and the gradients' own storage rounding. Measured maxima on PoCL (2026-11-29) are in test_backward.c. */
#define BWD_TOL_F32 5e-6
#define BWD_TOL_F16 1e-3
#define BWD_TOL_BF16 1.6e-2

double backward_tolerance(fcl_dtype t);

/* float64 forward from float64 inputs, logical [B,H,N,D] layouts: o and lse (-inf for rows with no key). */
void reference_forward_f64(const fcl_attention_desc *desc, const double *q, const double *k, const double *v,
                           double *o, double *lse);
/* float64 gradients of L = sum(O * dO) with respect to q, k, v (dk, dv summed over each kv head's group).
   o and lse (may be NULL) receive the forward's outputs. */
void reference_backward(const fcl_attention_desc *desc, const double *q, const double *k, const double *v,
                        const double *d_o, double *o, double *lse, double *dq, double *dk, double *dv);
/* Checks reference_backward against central finite differences of L on desc (a tiny shape) with random
   inputs; returns max |fd - analytic| / max(1, max |analytic|) over every element of q, k and v. */
double finite_difference_error(const fcl_attention_desc *desc);

/* Runs one case and reports its check lines. determinism: also run a second time and compare bitwise.
   Returns 0 pass, 1 fail, 2 skipped (unsupported on the device). */
int run_backward_case(test_env *env, cl_command_queue queue, const bwd_case *c, int determinism,
                      const char *label);

#endif
