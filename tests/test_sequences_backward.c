/* The backward with packed queries (cu_seqlens_q) and packed or dense keys (cu_seqlens_k, seqlens_k): FA2's
 * flash_attn_varlen_func backward, against the float64 host reference's gradients of each sequence on its own
 * dense tensors (sequence_inputs.c, shared with the forward's test_sequences.c): sequences of lengths 1, 15,
 * 16, 17 and 1000 in one batch, whole prompts and queries shorter than keys (bottom-right causal, rows that see
 * no key), every dtype, GQA and MQA, every score modifier with sinks and d_sinks, o and lse from the host
 * reference or from fcl_attention_forward, bitwise reruns, and planted bad indices whose documented outcome
 * (docs/api.md, "Backward with packed sequences") is checked element by element. Paged K/V is refused.
 *
 * Gradients are poisoned with a finite sentinel rather than NaN before each run, so that "not written" (the
 * sentinel) and "NaN" are told apart; an unwritten element elsewhere is far outside every bound. dQ, dK and
 * dV are compared per sequence with backward_check.h's bounds, ||grad - ref|| over the larger of ||ref|| and
 * the sequence's ||dV ref||: a gradient that cancels to nothing (dQ and dK of a one-key causal row are 0 up to
 * O's rounding) is measured against the scale of one that does not. Rows beyond a sequence's seqlens_k must
 * be exactly 0 in dK and dV (dense [batch] keys, and packed ranges with spare rows past seqlens_k), rows that
 * see no key exactly 0 in dQ. d_sinks as backward_check.c checks it.
 * Usage: test_sequences_backward [--small] [--list | --case NAME]
 *   --small              a few small cases, for Oclgrind (which proves no access leaves a buffer)
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "backward_check.h"
#include "host_reference.h"
#include "sequence_inputs.h"
#include "test_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 12345.0f

typedef struct bwd_seq_case {
  seq_case s;
  int from_forward; /* o and lse from fcl_attention_forward; else the host reference's, rounded */
  int twice;        /* run again and compare every output bitwise */
} bwd_seq_case;

static void bwd_case_name(const bwd_seq_case *c, char *out, size_t size) {
  seq_case_name(&c->s, out, size);
  const size_t n = strlen(out);
  snprintf(out + n, size - n, "%s%s", c->from_forward ? "_fromfwd" : "", c->twice ? "_twice" : "");
}

static int poison(test_env *env, cl_mem buf, size_t n, fcl_dtype t) {
  const size_t es = dtype_size(t);
  unsigned char *bytes = malloc(n * es + 1);
  for (size_t i = 0; i < n; ++i) encode_dtype(SENTINEL, t, bytes + i * es);
  const int bad = clEnqueueWriteBuffer(env->queue, buf, CL_TRUE, 0, n * es, bytes, 0, NULL, NULL) != CL_SUCCESS;
  free(bytes);
  return bad;
}

/* Paged K/V: refused before anything runs, the message naming the block table. */
static void run_paged_refusal(test_env *env, const bwd_seq_case *c, const char *name) {
  seq_inputs in;
  const int setup = seq_inputs_create(env, &c->s, &in);
  const size_t rows = (size_t)in.total_q * c->s.h;
  cl_mem o = seq_dtype_buffer(env, NULL, in.q_elems, c->s.dtype, 0.0f), d_o = seq_dtype_buffer(env, NULL, in.q_elems, c->s.dtype, 0.0f);
  cl_mem dq = seq_dtype_buffer(env, NULL, in.q_elems, c->s.dtype, SENTINEL);
  cl_mem dk = seq_dtype_buffer(env, NULL, in.kv_elems, c->s.dtype, SENTINEL);
  cl_mem dv = seq_dtype_buffer(env, NULL, in.kv_elems, c->s.dtype, SENTINEL);
  cl_mem lse = create_float_buffer(env, rows, 0.0f), ws = create_float_buffer(env, rows, 0.0f);
  if (setup || !o || !d_o || !dq || !dk || !dv || !lse || !ws) {
    check(0, "%s: could not create the inputs", name);
  } else {
    cl_event ev = NULL;
    const fcl_status st = fcl_attention_backward(env->fcl, env->queue, &in.desc, in.q, in.k, in.v, o, lse, d_o, dq, dk,
                                                 dv, ws, 0, NULL, &ev);
    fcl_plan_info info;
    const fcl_status described = fcl_describe_plan(env->fcl, FCL_OP_BACKWARD, &in.desc, &info);
    check(st == FCL_ERROR_UNSUPPORTED && strstr(fcl_last_error(), "block_table") && ev == NULL &&
              described == FCL_ERROR_UNSUPPORTED,
          "%s: paged K/V refused by the backward (%s: %s) and by fcl_describe_plan (%s)", name, fcl_status_string(st),
          fcl_last_error(), fcl_status_string(described));
    if (ev) clReleaseEvent(ev);
  }
  cl_mem bufs[] = {o, d_o, dq, dk, dv, lse, ws};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  seq_inputs_release(&in);
}

/* One sequence's float64 reference: o, lse and the gradients of its own dense problem. */
typedef struct seq_grads {
  double *o, *lse, *dq, *dk, *dv, *d_o, d_sinks[64];
} seq_grads;

static void grads_free(seq_grads *g) { free(g->o), free(g->lse), free(g->dq), free(g->dk), free(g->dv), free(g->d_o); }

/* ||got - ref|| and ||ref|| over n elements of row `at` of the device layout against ref. */
static void accumulate(const float *got, size_t at, const double *ref, int n, double *err2, double *ref2) {
  for (int d = 0; d < n; ++d) {
    const double e = isnan(got[at + d]) ? INFINITY : got[at + d] - ref[d];
    *err2 += e * e, *ref2 += ref[d] * ref[d];
  }
}

static void run_case(test_env *env, const void *arg) {
  const bwd_seq_case *bc = arg;
  const seq_case *c = &bc->s;
  char name[TEST_CASE_NAME_MAX];
  bwd_case_name(bc, name, sizeof name);
  if (c->kv == KV_PAGED) {
    run_paged_refusal(env, bc, name);
    return;
  }
  const int B = c->b, H = c->h, Hkv = c->hkv, D = c->d;
  seq_inputs in;
  int setup = seq_inputs_create(env, c, &in);
  const size_t q_elems = in.q_elems, kv_elems = in.kv_elems, rows = (size_t)in.total_q * H;

  /* dO of each sequence, then each sequence's reference gradients. */
  float *sdo[MAX_SEQS] = {NULL};
  seq_grads g[MAX_SEQS];
  memset(g, 0, sizeof g);
  for (int b = 0; b < B; ++b) {
    const size_t n = (size_t)H * in.nq[b] * D;
    sdo[b] = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; ++i) sdo[b][i] = round_to_dtype((float)test_uniform(), c->dtype);
  }
  for (int b = 0; b < B; ++b) {
    seq_reference r;
    seq_reference_make(&in, b, &r);
    const size_t nq = (size_t)H * in.nq[b] * D, nk = (size_t)Hkv * in.nk[b] * D;
    g[b].d_o = to_double(sdo[b], nq);
    g[b].o = malloc(nq * sizeof(double) + 1), g[b].lse = malloc((size_t)H * in.nq[b] * sizeof(double) + 1);
    g[b].dq = malloc(nq * sizeof(double) + 1), g[b].dk = malloc(nk * sizeof(double) + 1);
    g[b].dv = malloc(nk * sizeof(double) + 1);
    reference_backward(&r.desc, &r.mods, r.q, r.k, r.v, g[b].d_o, g[b].o, g[b].lse, REF_STORED_O, g[b].dq, g[b].dk, g[b].dv,
                       c->mods.sinks ? g[b].d_sinks : NULL);
    seq_reference_free(&r);
  }

  /* o and lse: the reference's (o rounded to the dtype) in the device layout, or the library's forward. */
  float *so[MAX_SEQS] = {NULL}, *lse_host = malloc(rows * sizeof(float) + 1);
  for (size_t i = 0; i < rows; ++i) lse_host[i] = NAN;
  for (int b = 0; b < B; ++b) {
    const size_t n = (size_t)H * in.nq[b] * D;
    so[b] = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; ++i) so[b][i] = round_to_dtype((float)g[b].o[i], c->dtype);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < in.nq[b]; ++i) lse_host[seq_lse_at(&in, b, h, i)] = (float)g[b].lse[(size_t)h * in.nq[b] + i];
  }
  float *ho = seq_layout(&in, so, 0), *hdo = seq_layout(&in, sdo, 0);
  cl_mem o = seq_dtype_buffer(env, bc->from_forward ? NULL : ho, q_elems, c->dtype, NAN);
  cl_mem d_o = seq_dtype_buffer(env, hdo, q_elems, c->dtype, NAN);
  cl_mem dq = seq_dtype_buffer(env, NULL, q_elems, c->dtype, SENTINEL);
  cl_mem dk = seq_dtype_buffer(env, NULL, kv_elems, c->dtype, SENTINEL);
  cl_mem dv = seq_dtype_buffer(env, NULL, kv_elems, c->dtype, SENTINEL);
  cl_mem lse = create_float_buffer(env, rows, NAN), d_sinks = NULL, ws = NULL;
  free(ho), free(hdo);
  setup |= !o || !d_o || !dq || !dk || !dv || !lse;
  if (c->mods.sinks) setup |= !(d_sinks = create_float_buffer(env, (size_t)H, NAN));
  in.desc.d_sinks = d_sinks;
  const size_t ws_bytes = fcl_attention_backward_workspace_size(env->fcl, &in.desc);
  if (!setup) setup |= !(ws = create_float_buffer(env, ws_bytes / sizeof(float) + 1, NAN));

  fcl_status st = setup ? FCL_ERROR_OPENCL : FCL_SUCCESS;
  if (!st && bc->from_forward) {
    cl_event ev = NULL;
    st = fcl_attention_forward(env->fcl, env->queue, &in.desc, in.q, in.k, in.v, o, lse, 0, NULL, &ev);
    if (!st) clWaitForEvents(1, &ev), clReleaseEvent(ev);
  } else if (!st) {
    st = clEnqueueWriteBuffer(env->queue, lse, CL_TRUE, 0, rows * sizeof(float), lse_host, 0, NULL, NULL) ? FCL_ERROR_OPENCL
                                                                                                            : FCL_SUCCESS;
  }

  /* Run (twice: compared bitwise), poisoned before each run. */
  float *got[3] = {malloc(q_elems * sizeof(float) + 1), malloc(kv_elems * sizeof(float) + 1),
                   malloc(kv_elems * sizeof(float) + 1)};
  float *again[3] = {malloc(q_elems * sizeof(float) + 1), malloc(kv_elems * sizeof(float) + 1),
                     malloc(kv_elems * sizeof(float) + 1)};
  float got_sinks[2][64];
  const size_t elems[3] = {q_elems, kv_elems, kv_elems};
  cl_mem outs[3] = {dq, dk, dv};
  int same = 1;
  for (int run = 0; run < (bc->twice ? 2 : 1) && !st; ++run) {
    float **dst = run ? again : got;
    if (poison(env, dq, q_elems, c->dtype) || poison(env, dk, kv_elems, c->dtype) || poison(env, dv, kv_elems, c->dtype)) {
      st = FCL_ERROR_OPENCL;
      break;
    }
    cl_event ev = NULL;
    st = fcl_attention_backward(env->fcl, env->queue, &in.desc, in.q, in.k, in.v, o, lse, d_o, dq, dk, dv, ws, 0, NULL,
                                &ev);
    if (st) break;
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    for (int t = 0; t < 3 && !st; ++t)
      if (seq_read_dtype(env, outs[t], dst[t], elems[t], c->dtype)) st = FCL_ERROR_OPENCL;
    if (d_sinks && read_floats(env, d_sinks, got_sinks[run], (size_t)H)) st = FCL_ERROR_OPENCL;
    if (run)
      for (int t = 0; t < 3; ++t) same &= memcmp(got[t], again[t], elems[t] * sizeof(float)) == 0;
    if (run && d_sinks) same &= memcmp(got_sinks[0], got_sinks[1], (size_t)H * sizeof(float)) == 0;
  }

  if (st == FCL_ERROR_UNSUPPORTED) {
    skip("%s: %s", name, fcl_last_error());
  } else if (st) {
    check(0, "%s: %s: %s", name, fcl_status_string(st), fcl_last_error());
  } else {
    /* What each planted index must give (docs/api.md; seq_bad_for names the victims): a victim's dQ rows not
       written (bad cu_q) or NaN (bad cu_k or seqlens_k); its dK, dV rows not written (bad cu_k) or NaN (bad cu_q
       or seqlens_k); d_sinks NaN. */
    const float sentinel = round_to_dtype(SENTINEL, c->dtype);
    const int bad = c->bad != BAD_NONE;
    long wrong = 0, zeros = 0;
    double worst[3] = {0, 0, 0};
    for (int b = 0; b < B; ++b) {
      const int nq = in.nq[b], nk = in.nk[b], plant = seq_bad_for(c, b);
      const int q_expect = !plant ? 0 : plant == BAD_CU_Q ? 1 : 2;  /* 0 compare, 1 sentinel, 2 NaN */
      const int kv_expect = !plant ? 0 : plant == BAD_CU_K ? 1 : 2;
      /* The key rows this sequence owns: its packed range, or its batch's seqlen_k rows when dense. */
      const int k_rows = c->kv == KV_DENSE ? in.nk_max : in.cu_k[b + 1] - in.cu_k[b];
      double e2[3] = {0, 0, 0}, r2[3] = {0, 0, 0};
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < nq; ++i) {
          const size_t at = seq_q_at(&in, b, h, i);
          const double *ref = g[b].dq + ((size_t)h * nq + i) * D;
          for (int d = 0; d < D; ++d) {
            const float x = got[0][at + d];
            if (q_expect == 1) wrong += x != sentinel;
            else if (q_expect == 2) wrong += !isnan(x);
            else if (g[b].lse[(size_t)h * nq + i] == -INFINITY) zeros += x != 0.0f; /* sees no key */
          }
          if (q_expect == 0) accumulate(got[0], at, ref, D, &e2[0], &r2[0]);
        }
      for (int hk = 0; hk < Hkv; ++hk)
        for (int j = 0; j < k_rows; ++j) {
          const size_t at = seq_kv_at(&in, b, hk, j);
          for (int t = 1; t < 3; ++t) {
            for (int d = 0; d < D; ++d) {
              const float x = got[t][at + d];
              if (kv_expect == 1) wrong += x != sentinel;
              else if (kv_expect == 2) wrong += !isnan(x);
              else if (j >= nk) zeros += x != 0.0f; /* beyond seqlens_k: no gradient */
            }
            if (kv_expect == 0 && j < nk)
              accumulate(got[t], at, (t == 1 ? g[b].dk : g[b].dv) + ((size_t)hk * nk + j) * D, D, &e2[t], &r2[t]);
          }
        }
      if (q_expect || kv_expect) continue;
      const double scale = fmax(sqrt(r2[2]), 1e-30);
      for (int t = 0; t < 3; ++t) worst[t] = fmax(worst[t], sqrt(e2[t]) / fmax(sqrt(r2[t]), scale));
    }

    /* d_sinks[h] = -sum over every sequence's rows of exp(sink - lse) D_i, measured against the sum of the
       terms' magnitudes (backward_check.c). */
    double es = 0;
    const double unit = c->dtype == FCL_DTYPE_F16 ? 0x1p-11 : c->dtype == FCL_DTYPE_BF16 ? 0x1p-8 : 0x1p-24;
    const double tol_sinks = 2 * (unit + (double)D * 0x1p-24);
    for (int h = 0; h < H && d_sinks; ++h) {
      if (bad) {
        wrong += !isnan(got_sinks[0][h]);
        continue;
      }
      double ref = 0, magnitude = 0;
      for (int b = 0; b < B; ++b) {
        ref += g[b].d_sinks[h];
        for (int i = 0; i < in.nq[b]; ++i) {
          const double l = g[b].lse[(size_t)h * in.nq[b] + i];
          if (l == -INFINITY) continue;
          double m = 0;
          for (int d = 0; d < D; ++d) {
            const size_t e = ((size_t)h * in.nq[b] + i) * D + d;
            m += fabs(g[b].d_o[e] * g[b].o[e]);
          }
          magnitude += exp(in.mb.host.sinks[h] - l) * m;
        }
      }
      const double e = isnan(got_sinks[0][h]) ? INFINITY : fabs(got_sinks[0][h] - ref) / (magnitude > 0 ? magnitude : 1);
      es = fmax(es, e);
    }
    const double tol = backward_tolerance(c->dtype);
    const int ok = worst[0] <= tol && worst[1] <= tol && worst[2] <= tol && es <= tol_sinks && wrong == 0 &&
                   zeros == 0 && same && ws_bytes == rows * sizeof(float);
    char sinks_text[96] = "";
    if (d_sinks && !bad) snprintf(sinks_text, sizeof sinks_text, ", d_sinks error / sum of |terms| %.2e (bound %.1e)", es, tol_sinks);
    check(ok,
          "%s: worst sequence's rel dq %.2e dk %.2e dv %.2e (bound %.0e)%s; %ld elements off the planted index's "
          "outcome, %ld nonzero where the gradient is 0; workspace %zu B (expected %zu)%s",
          name, worst[0], worst[1], worst[2], tol, sinks_text, wrong, zeros, ws_bytes, rows * sizeof(float),
          bc->twice ? (same ? ", 2 runs bitwise equal" : ", RUNS DIFFER") : "");
  }

  for (int t = 0; t < 3; ++t) free(got[t]), free(again[t]);
  for (int b = 0; b < B; ++b) free(sdo[b]), free(so[b]), grads_free(&g[b]);
  free(lse_host);
  cl_mem bufs[] = {o, d_o, dq, dk, dv, lse, d_sinks, ws};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]) clReleaseMemObject(bufs[i]);
  seq_inputs_release(&in);
}

/* ---- the case lists ---- */

static const int lens_mixed[5] = {1, 15, 16, 17, 1000};
static const int lens_short[3] = {5, 1, 17};
static const int lens_two[2] = {40, 33};

static int add(bwd_seq_case *list, int n, seq_case s, int from_forward, int twice) {
  list[n] = (bwd_seq_case){s, from_forward, twice};
  return n + 1;
}

static int small_cases(bwd_seq_case *list) {
  int n = 0;
  const test_mods none = {0}, sinks = {0, 0, 0, 0, 0, 0, 0, 1}, all = {0.7f, 2, MASK_GGML_F16, 1, 1, 6, 2, 1};
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_NONE, sinks}, 0, 1);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 2, lens_short, BAD_NONE, all}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 1, 0, KV_DENSE, 0, 0, 3, lens_short, BAD_NONE, none}, 1, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 2, lens_short, BAD_CU_Q, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_BF16, 0, 0, KV_DENSE, 0, 0, 1, lens_short, BAD_SEQLEN, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_SEQLEN, sinks, 2}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F32, 1, 1, KV_PAGED, 4, 0, 0, lens_short, BAD_NONE, none}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_Q_ORDER, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K_ORDER, none}, 0, 0);
  return n;
}

static int full_cases(bwd_seq_case *list) {
  int n = 0;
  const test_mods none = {0}, sinks = {0, 0, 0, 0, 0, 0, 0, 1};
  static const fcl_dtype dt[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  /* Varlen prefill: packed queries and keys, whole prompts of mixed lengths, every dtype; odd head_dim. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (seq_case){5, 4, 2, 64, dt[t], 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, none}, 0, t == 1);
    n = add(list, n, (seq_case){3, 2, 2, 33, dt[t], 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, none}, 0, 0);
  }
  /* Queries shorter than keys (bottom-right causal; the one-key sequence has rows that see nothing). */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 5, lens_mixed, 0, none}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 4, 40, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 17, lens_mixed, 0, none}, 0, 0);
  /* Packed keys with dense queries; dense [batch] keys with per-sequence counts and packed keys with spare
     rows past them (FA2's seqused_k): rows past the counts get 0. */
  const test_mods window_sinks = {0, 0, 0, 0, 1, 6, 0, 1};
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, sinks, 3}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 1, 40, FCL_DTYPE_BF16, 0, 1, KV_PACKED, 0, 0, 2, lens_short, 0, window_sinks, 5}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F32, 1, 0, KV_PACKED, 0, 0, 4, lens_short, 0, none}, 0, 0);
  n = add(list, n, (seq_case){5, 8, 1, 128, FCL_DTYPE_F16, 1, 0, KV_DENSE, 0, 0, 3, lens_mixed, 0, none}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 2, 32, FCL_DTYPE_F32, 0, 1, KV_DENSE, 0, 0, 0, lens_short, 0, sinks}, 0, 0);
  /* o and lse from the library's forward, GQA and MQA. */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, sinks}, 1, 0);
  n = add(list, n, (seq_case){2, 4, 1, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_two, 0, none}, 1, 1);
  /* Every modifier with sinks and d_sinks, with each layout; a window without causal over the long sequence. */
  const test_mods all = {1.5f, 2, MASK_FULL_F32, 0, 1, 9, 2, 1}, ggml = {0, 1, MASK_GGML_F16, 1, 0, 0, 0, 1};
  const test_mods window = {0, 0, 0, 0, 1, 40, 7, 1}, softcap = {0.8f, 1, 0, 0, 0, 0, 0, 1};
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, 0, all}, 0, 1);
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F16, 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, ggml}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 4, 32, FCL_DTYPE_BF16, 1, 0, KV_DENSE, 0, 0, 3, lens_short, 0, all}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 2, 48, FCL_DTYPE_F32, 1, 0, KV_PACKED, 0, 0, 6, lens_short, 0, ggml}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, window}, 0, 0);
  n = add(list, n, (seq_case){5, 2, 1, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, all}, 1, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, softcap}, 0, 0);
  /* Planted bad indices, with sinks (d_sinks must be NaN). */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q, sinks}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K, sinks}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 0, KV_DENSE, 0, 0, 4, lens_mixed, BAD_SEQLEN, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K, none}, 1, 0);
  n = add(list, n, (seq_case){3, 4, 2, 32, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_SEQLEN, sinks, 2}, 0, 0);
  /* Packed offsets that decrease once: the sequences from there on, each valid alone, overlap earlier rows. */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q_ORDER, sinks}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K_ORDER, sinks}, 0, 0);
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q_ORDER_EARLY, sinks}, 0, 0);
  n = add(list, n, (seq_case){3, 4, 2, 32, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K_NEGATIVE, sinks}, 0, 0);
  /* Paged K/V is refused. */
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F16, 1, 1, KV_PAGED, 16, 0, 0, lens_short, 0, none}, 0, 0);
  return n;
}

int main(int argc, char **argv) {
  test_cli cli = {0, NULL, 0};
  if (test_cli_parse(&cli, argc, argv)) return 2;
  enum { MAX = 64 };
  static bwd_seq_case cases[MAX];
  static test_case list[MAX];
  const int count = cli.small ? small_cases(cases) : full_cases(cases);
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    bwd_case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, run_case, &cases[i]);
  }
  return test_cases_main("test_sequences_backward", &cli, list, n);
}
