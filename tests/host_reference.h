/* The float64 host reference of attention: forward, gradients and a finite-difference check of them. It
 * mirrors common.cl's mask layer (window, softcap, ALiBi, additive mask, sinks) from the descriptor's
 * fields, with the contents of the modifiers' buffers given on the host. */
#ifndef FLASHCL_HOST_REFERENCE_H
#define FLASHCL_HOST_REFERENCE_H

#include <flashcl.h>

/* Host copies of the modifier buffers the descriptor names (each NULL when that modifier is off). */
typedef struct host_mods {
  const double *slopes; /* [batch, num_heads]: the slope each (batch, head) uses */
  const double *mask;   /* [batch, num_heads, seqlen_q, seqlen_k]: the value each score gets added */
  const double *sinks;  /* [num_heads] */
} host_mods;

/* o [B,H,Nq,D] and lse [B,H,Nq] (natural log; -inf for rows that see nothing) from logical [B,H,N,D]
   inputs. m may be NULL (no buffer modifiers); the window and softcap come from desc. */
void reference_forward(const fcl_attention_desc *desc, const host_mods *m, const double *q, const double *k,
                       const double *v, double *o, double *lse);
/* Gradients of L = sum(O * dO) with respect to q, k, v (dk, dv summed over each kv head's group) and, when
   d_sinks is not NULL, the sinks. o and lse (may be NULL) receive the forward's outputs (o exact). flags:
   REF_STORED_O: D_i = dO_i . O_i is formed from O rounded to desc's dtype, the O that the library's backward
   is given: where dS = P (dP - D) cancels, that rounding would otherwise dominate a small gradient's error.
   REF_MAGNITUDE: every sum is taken over the magnitudes of its terms instead (dP_ij and D_i as sums of
   |products|, dS_ij = P_ij (|dP_ij| + |D_i|) |softcap derivative|, then |q|, |k|, |dO|): the size of what
   float arithmetic rounds on the way to each gradient, which a gradient that cancels to nearly nothing
   (dP_ij = D_i: one visible key) does not show. */
#define REF_STORED_O 1u
#define REF_MAGNITUDE 2u
void reference_backward(const fcl_attention_desc *desc, const host_mods *m, const double *q, const double *k,
                        const double *v, const double *d_o, double *o, double *lse, unsigned flags, double *dq,
                        double *dk, double *dv, double *d_sinks);
/* Checks reference_backward against central finite differences of L on desc (a tiny shape) with random
   inputs (and random sinks when with_sinks); returns max |fd - analytic| / max(1, max |analytic|) over
   every element of q, k, v (and the sinks). */
double finite_difference_error(const fcl_attention_desc *desc, const host_mods *m, int with_sinks);

#endif
