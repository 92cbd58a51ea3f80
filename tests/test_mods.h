/* Score modifiers of a test case: device buffers with random contents and their float64 host copies
 * for the host reference. */
#ifndef FLASHCL_TEST_MODS_H
#define FLASHCL_TEST_MODS_H

#include "host_reference.h"
#include "test_util.h"

enum { MASK_NONE = 0, MASK_FULL_F32, MASK_GGML_F16, MASK_HEAD_BF16 };

/* Zero-initialised: no modifier. */
typedef struct test_mods {
  float softcap;
  int alibi;     /* 0 off; 1 one [num_heads] row for every batch; 2 [batch, num_heads] after an offset */
  int mask;      /* MASK_*: f32 [B,H,Nq,Nk] with padded rows; f16 [Nq, Nk] broadcast over batch and heads
                    (ggml's layout); bf16 [H, Nq, Nk] broadcast over batch. About 15% of entries -inf. */
  int hide_rows; /* with a mask: every 5th query row hidden whole */
  int window;
  long long left, right;
  int sinks;
} test_mods;

typedef struct mod_buffers {
  cl_mem slopes, mask, sinks;
  double *slope_values, *mask_values, *sink_values;
  host_mods host;
} mod_buffers;

/* Creates the buffers of m for a problem of desc's sizes and points desc's modifier fields at them.
   Returns 0 on success. */
int mods_create(test_env *env, const test_mods *m, fcl_attention_desc *desc, mod_buffers *out);
void mods_release(mod_buffers *b);
/* Appends a short description of m ("" for none) to out. */
void mods_describe(const test_mods *m, char *out, size_t size);
/* Appends m's part of a case name ("" for none): _window5_3 (_inf: unbounded side), _softcap0.5, _alibi-h,
   _alibi-bh, _mask-f32, _mask-ggml-f16, _mask-head-bf16, _hidden-rows, _sinks. */
void mods_name(const test_mods *m, char *out, size_t size);

#endif
