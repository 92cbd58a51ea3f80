/* Inputs of the packed and paged sequence tests (test_sequences.c, test_sequences_backward.c): each sequence's
 * own dense host tensors, laid out on the device as packed rows (cu_seqlens), dense [batch] tensors with
 * per-sequence key counts, or paged pools (blocks in random order, optionally shared between the first two
 * sequences, garbage in unused table entries), with planted bad indices; and each sequence's own dense problem
 * for the float64 host reference. */
#ifndef FLASHCL_SEQUENCE_INPUTS_H
#define FLASHCL_SEQUENCE_INPUTS_H

#include "test_mods.h"

enum { KV_DENSE = 0, KV_PACKED = 1, KV_PAGED = 2 };
/* Planted bad indices. The order plants move the packed ranges of the last sequence (ORDER) or of the last two
   (ORDER_EARLY) down over earlier rows, each range valid on its own and the moved ones in order with each other:
   the range before them then decreases. NEGATIVE makes the array's first entry -1. */
enum {
  BAD_NONE = 0, BAD_BLOCK, BAD_SEQLEN, BAD_CU_Q, BAD_CU_K, BAD_CU_Q_ORDER, BAD_CU_K_ORDER, BAD_CU_Q_ORDER_EARLY,
  BAD_CU_K_ORDER_EARLY, BAD_CU_Q_NEGATIVE, BAD_CU_K_NEGATIVE
};
enum { MAX_SEQS = 8 };

typedef struct seq_case {
  int b, h, hkv, d;
  fcl_dtype dtype;
  int causal;
  int varlen_q;    /* 1: packed queries (cu_seqlens_q) */
  int kv;          /* KV_*: dense [batch] tensors with seqlens_k, packed (cu_seqlens_k) or paged */
  int block_size;  /* KV_PAGED */
  int shared;      /* KV_PAGED: the second sequence starts with the first one's blocks */
  int nq;          /* query rows of every sequence; 0: each sequence's whole prompt (nq_b = nk_b) */
  const int *lens; /* b key counts */
  int bad;         /* BAD_*: an index planted to be wrong, in the last sequence (the victim; seq_bad_for says
                      which sequences an order plant makes victims) */
  test_mods mods;
  int spare_k;     /* KV_PACKED: each sequence's cu_seqlens_k range holds spare_k rows (NaN) past the keys it
                      attends to, which seqlens_k gives (FA2's seqused_k); seqlen_k counts them */
} seq_case;

/* The case's name: heads, dtype, causal, query rows, K/V layout, lengths, modifiers, planted index. */
void seq_case_name(const seq_case *c, char *out, size_t size);

typedef struct seq_inputs {
  const seq_case *c;
  int nq[MAX_SEQS], nk[MAX_SEQS], nq_max, nk_max, total_q, total_k; /* nk: the keys attended to; nk_max:
                                                                        seqlen_k, spare rows included */
  int cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1]; /* the true offsets (the device's copies may hold a planted one) */
  float *sq[MAX_SEQS], *sk[MAX_SEQS], *sv[MAX_SEQS]; /* sequence b's [H or Hkv][n][D], rounded to the dtype */
  int bs, table_stride, num_blocks, *table;         /* KV_PAGED (table as uploaded, planted entry included) */
  int bad_block_entry;                              /* BAD_BLOCK: the victim's logical block outside the pool */
  size_t q_elems, kv_elems;                         /* elements of q (and o) and of k (and v) on the device */
  fcl_attention_desc desc;                          /* every field set but o's, lse's and the gradients' */
  mod_buffers mb;
  cl_mem q, k, v, cuq, cuk, lens, tab;
} seq_inputs;

/* What sequence b of case c must give under its plant: BAD_NONE (its exact result), BAD_BLOCK, BAD_SEQLEN,
   BAD_CU_Q or BAD_CU_K (docs/api.md, "Untrusted indices"). Every sequence from the one whose range decreases on
   (all of them under NEGATIVE) is BAD_CU_Q (BAD_CU_K), though the moved ranges are valid on their own. */
int seq_bad_for(const seq_case *c, int b);

/* Draws the case's tensors and modifiers and creates its device buffers and descriptor. 0 on success;
   release with seq_inputs_release either way. */
int seq_inputs_create(test_env *env, const seq_case *c, seq_inputs *in);
void seq_inputs_release(seq_inputs *in);

/* The first element, on the device, of query row i of head h of sequence b (q, o, d_o, d_q alike); of its lse
   (and Dvec) entry; of key row j of kv head g (k, v, d_k, d_v alike). */
size_t seq_q_at(const seq_inputs *in, int b, int h, int i);
size_t seq_lse_at(const seq_inputs *in, int b, int h, int i);
size_t seq_kv_at(const seq_inputs *in, int b, int g, int j);

/* Per-sequence host tensors ([H][nq_b][D] each, or [Hkv][nk_b][D] with kv_side) laid out as on the device,
   NaN elsewhere (malloc'd, q_elems or kv_elems floats). */
float *seq_layout(const seq_inputs *in, float *const *per_seq, int kv_side);

/* A read-only int32 device buffer holding values (NULL when it cannot be created). */
cl_mem seq_int_buffer(test_env *env, const int *values, size_t count);
/* A device buffer of n elements of dtype t holding host (already rounded), or `fill` everywhere when host is
   NULL; reading one back as floats. */
cl_mem seq_dtype_buffer(test_env *env, const float *host, size_t n, fcl_dtype t, float fill);
int seq_read_dtype(test_env *env, cl_mem buf, float *out, size_t n, fcl_dtype t);

/* Sequence b as its own dense problem for the host reference: batch 1 with its lengths and no sequence
   fields, its modifiers (slopes of batch b, its rows and columns of the mask) and float64 copies of its
   tensors, keys and values NaN where a planted bad block hides them. */
typedef struct seq_reference {
  fcl_attention_desc desc;
  host_mods mods;
  double *q, *k, *v, *mask;
} seq_reference;
void seq_reference_make(const seq_inputs *in, int b, seq_reference *r);
void seq_reference_free(seq_reference *r);

#endif
