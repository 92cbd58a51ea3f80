/* One forward case checked end to end against the float64 host reference: fresh random inputs, outputs
 * poisoned with NaN, O and lse compared with the per-dtype bounds below. */
#ifndef FLASHCL_FORWARD_CHECK_H
#define FLASHCL_FORWARD_CHECK_H

#include "test_mods.h"
#include "test_util.h"

typedef struct fwd_case {
  long long b, h, hkv, nq, nk, d; /* hkv 0: = h */
  fcl_dtype dtype;
  int causal;
  int layout;  /* LAYOUT_* for q, k, v and o alike */
  float scale; /* 0: default */
  int with_lse;
  test_mods mods; /* score modifiers; zero: none */
  int plant;      /* PLANT_NONFINITE or PLANT_RISING (below); 0: plain random inputs */
} fwd_case;

/* Planted V (plant 1), in every (batch, kv head): row nk/3 holds +inf in column 0 and -inf in its last column,
   row 2nk/3 is NaN throughout. A hidden key must be excluded, not weighted by zero: an output element whose
   float64 reference (a sum over visible keys only) is NaN or +-inf must be exactly that, every other element
   finite and within the case's bound. */
#define PLANT_NONFINITE 1
#define PLANT_INF_ROW(nk) ((nk) / 3)
#define PLANT_NAN_ROW(nk) (2 * (nk) / 3)

/* Rising scores (plant 2): K row j scaled by 1 + 8 j / nk, so that each row's maximum climbs past its running
   maximum along the keys, by more than 2^8 at a time (the tensor-core kernel moves its reference maximum only
   then, and lets it lag by up to 2^8 in between); in f32 and bf16 with nk < 128, V is also scaled by 2^121:
   within 2^7 of float's range, so that p V summed against a lagging maximum may overflow (the kernel must then
   recompute the row), while an exact softmax's sum p |V| < nk 2^121 stays finite. */
#define PLANT_RISING 2
#define PLANT_RISING_K(j, nk) (1.0f + 8.0f * (float)(j) / (float)(nk))
#define PLANT_RISING_V 0x1p121f
#define PLANT_RISING_SCALES_V(nk, dtype) ((nk) < 128 && (dtype) != FCL_DTYPE_F16)

/* ||o - ref|| / ||ref|| bounds: float32 arithmetic, and the storage rounding of the output for f16/bf16. */
#define FWD_TOL_F32 1e-5
#define FWD_TOL_F16 2e-3
#define FWD_TOL_BF16 1.6e-2
/* lse is float32 whatever the dtype: max abs error bound; for rising scores (PLANT_RISING), whose lse reach the
   hundreds, a row's error is taken over max(1, |lse| / FWD_TOL_LSE_SPAN). */
#define FWD_TOL_LSE 1e-4
#define FWD_TOL_LSE_SPAN 16.0

double forward_tolerance(fcl_dtype t);
void describe_case(const fwd_case *c, char *out, size_t size);
/* The case's name in test listings, from every field: B2_H3_Nq127_Nk127_d64_f32_causal_bhnd_lse. */
void forward_case_name(const fwd_case *c, char *out, size_t size);

/* The descriptor of case c's shapes alone (dense strides): what fcl_describe_plan needs. */
void case_shape_desc(const fwd_case *c, fcl_attention_desc *desc);
/* The descriptor of case c over the tensors' layouts. */
void case_desc(const fwd_case *c, const test_tensor *q, const test_tensor *k, const test_tensor *v,
               const test_tensor *o, fcl_attention_desc *desc);

/* Runs the case through fn (fcl_attention_forward or fcl_attention_reference) and reports one check
   line. Returns 0 pass, 1 fail, 2 skipped because the device does not support it. */
typedef fcl_status (*fwd_fn)(fcl_context *, cl_command_queue, const fcl_attention_desc *, cl_mem, cl_mem, cl_mem,
                             cl_mem, cl_mem, cl_uint, const cl_event *, cl_event *);
int run_forward_case(test_env *env, cl_command_queue queue, const fwd_case *c, fwd_fn fn, const char *label);

#endif
