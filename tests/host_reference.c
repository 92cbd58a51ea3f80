#include "host_reference.h"

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct dims {
  long long B, H, Hkv, G, Nq, Nk, D;
  long long wl, wr; /* window; -1: unbounded */
  double scale, softcap;
} dims;

static dims get_dims(const fcl_attention_desc *desc) {
  dims s;
  s.B = desc->batch, s.H = desc->num_heads, s.Hkv = desc->num_kv_heads ? desc->num_kv_heads : desc->num_heads;
  s.G = s.H / s.Hkv;
  s.Nq = desc->seqlen_q, s.Nk = desc->seqlen_k, s.D = desc->head_dim;
  s.scale = desc->scale != 0.0f ? (double)desc->scale : 1.0 / sqrt((double)s.D);
  s.softcap = desc->softcap;
  s.wl = desc->window ? desc->window_left : -1;
  s.wr = desc->window ? desc->window_right : -1;
  if (desc->causal) s.wr = 0;
  return s;
}

/* The modified score of (b, h, i, j) from the raw q.k, or -INFINITY when the window hides j. */
static double score(const dims *s, const host_mods *m, double qk, long long b, long long h, long long i,
                    long long j, double *softcap_grad) {
  const long long p = i + s->Nk - s->Nq;
  if ((s->wl >= 0 && j < p - s->wl) || (s->wr >= 0 && j > p + s->wr)) return -INFINITY;
  double x = qk * s->scale, g = 1.0;
  if (s->softcap > 0) {
    const double t = tanh(x / s->softcap);
    x = s->softcap * t;
    g = 1.0 - t * t;
  }
  if (softcap_grad) *softcap_grad = g;
  if (m && m->slopes) x -= m->slopes[b * s->H + h] * (double)llabs(p - j);
  if (m && m->mask) { /* -inf hides the key, whatever the score holds (NaN included) */
    const double mv = m->mask[((b * s->H + h) * s->Nq + i) * s->Nk + j];
    x = mv == -INFINITY ? -INFINITY : x + mv;
  }
  return x;
}

static double dot(const double *a, const double *b, long long n) {
  double acc = 0;
  for (long long d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

void reference_forward(const fcl_attention_desc *desc, const host_mods *m, const double *q, const double *k,
                       const double *v, double *o, double *lse) {
  const dims s = get_dims(desc);
  double *x = malloc((size_t)s.Nk * sizeof(double));
  for (long long b = 0; b < s.B; ++b)
    for (long long h = 0; h < s.H; ++h) {
      const long long hk = h / s.G;
      const double *qh = q + (size_t)((b * s.H + h) * s.Nq * s.D);
      const double *kh = k + (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      const double *vh = v + (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      const double sink = m && m->sinks ? m->sinks[h] : -INFINITY;
      for (long long i = 0; i < s.Nq; ++i) {
        double *oi = o + (size_t)(((b * s.H + h) * s.Nq + i) * s.D);
        double mx = sink;
        for (long long j = 0; j < s.Nk; ++j) {
          x[j] = score(&s, m, dot(qh + i * s.D, kh + j * s.D, s.D), b, h, i, j, NULL);
          if (x[j] > mx) mx = x[j];
        }
        for (long long d = 0; d < s.D; ++d) oi[d] = 0;
        if (mx == -INFINITY) { /* nothing visible, no sink */
          lse[(b * s.H + h) * s.Nq + i] = -INFINITY;
          continue;
        }
        double l = exp(sink - mx);
        for (long long j = 0; j < s.Nk; ++j) {
          if (x[j] == -INFINITY) continue;
          const double p = exp(x[j] - mx);
          l += p;
          for (long long d = 0; d < s.D; ++d) oi[d] += p * vh[j * s.D + d];
        }
        for (long long d = 0; d < s.D; ++d) oi[d] /= l;
        lse[(b * s.H + h) * s.Nq + i] = mx + log(l);
      }
    }
  free(x);
}

void reference_backward(const fcl_attention_desc *desc, const host_mods *m, const double *q, const double *k,
                        const double *v, const double *d_o, double *o_out, double *lse_out, unsigned flags,
                        double *dq, double *dk, double *dv, double *d_sinks) {
  const int stored_o = (flags & REF_STORED_O) != 0, mag = (flags & REF_MAGNITUDE) != 0;
  /* x, or its magnitude in REF_MAGNITUDE */
#define TERM(x) (mag ? fabs(x) : (x))
  const dims s = get_dims(desc);
  const size_t nq_elems = (size_t)(s.B * s.H * s.Nq * s.D), nk_elems = (size_t)(s.B * s.Hkv * s.Nk * s.D);
  double *o = o_out ? o_out : malloc(nq_elems * sizeof(double));
  double *lse = lse_out ? lse_out : malloc((size_t)(s.B * s.H * s.Nq) * sizeof(double));
  reference_forward(desc, m, q, k, v, o, lse);
  memset(dq, 0, nq_elems * sizeof(double));
  memset(dk, 0, nk_elems * sizeof(double));
  memset(dv, 0, nk_elems * sizeof(double));
  if (d_sinks) memset(d_sinks, 0, (size_t)s.H * sizeof(double));
  for (long long b = 0; b < s.B; ++b)
    for (long long h = 0; h < s.H; ++h) {
      const long long hk = h / s.G;
      const size_t qo = (size_t)((b * s.H + h) * s.Nq * s.D), ko = (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      for (long long i = 0; i < s.Nq; ++i) {
        const double l = lse[(b * s.H + h) * s.Nq + i];
        if (l == -INFINITY) continue; /* the row saw nothing: no gradient */
        const double *qi = q + qo + (size_t)(i * s.D), *doi = d_o + qo + (size_t)(i * s.D);
        double *dqi = dq + qo + (size_t)(i * s.D);
        const double *oi = o + qo + (size_t)(i * s.D);
        double Di = 0;
        for (long long d = 0; d < s.D; ++d)
          Di += TERM(doi[d] * (stored_o ? (double)round_to_dtype((float)oi[d], desc->dtype) : oi[d]));
        /* L depends on the sink through the denominator only: dL/dsink = -D_i exp(sink - lse_i). */
        if (d_sinks && m && m->sinks && !mag) d_sinks[h] -= Di * exp(m->sinks[h] - l);
        for (long long j = 0; j < s.Nk; ++j) {
          const double *kj = k + ko + (size_t)(j * s.D), *vj = v + ko + (size_t)(j * s.D);
          double g = 1.0;
          const double x = score(&s, m, dot(qi, kj, s.D), b, h, i, j, &g);
          if (x == -INFINITY) continue;
          const double p = exp(x - l);
          double dp = 0;
          for (long long d = 0; d < s.D; ++d) dp += TERM(doi[d] * vj[d]);
          const double ds = mag ? p * (dp + Di) * fabs(g) : p * (dp - Di) * g;
          double *dkj = dk + ko + (size_t)(j * s.D), *dvj = dv + ko + (size_t)(j * s.D);
          for (long long d = 0; d < s.D; ++d) {
            dvj[d] += p * TERM(doi[d]);
            dkj[d] += s.scale * ds * TERM(qi[d]);
            dqi[d] += s.scale * ds * TERM(kj[d]);
          }
        }
      }
    }
  if (!o_out) free(o);
  if (!lse_out) free(lse);
#undef TERM
}

static double loss(const fcl_attention_desc *desc, const host_mods *m, const double *q, const double *k,
                   const double *v, const double *d_o, double *o, double *lse, size_t nq_elems) {
  reference_forward(desc, m, q, k, v, o, lse);
  double acc = 0;
  for (size_t i = 0; i < nq_elems; ++i) acc += o[i] * d_o[i];
  return acc;
}

double finite_difference_error(const fcl_attention_desc *desc, const host_mods *mods, int with_sinks) {
  const dims s = get_dims(desc);
  const size_t nq_elems = (size_t)(s.B * s.H * s.Nq * s.D), nk_elems = (size_t)(s.B * s.Hkv * s.Nk * s.D);
  double *q = malloc(nq_elems * sizeof(double)), *d_o = malloc(nq_elems * sizeof(double));
  double *k = malloc(nk_elems * sizeof(double)), *v = malloc(nk_elems * sizeof(double));
  double *dq = malloc(nq_elems * sizeof(double)), *dk = malloc(nk_elems * sizeof(double));
  double *dv = malloc(nk_elems * sizeof(double)), *o = malloc(nq_elems * sizeof(double));
  double *lse = malloc((size_t)(s.B * s.H * s.Nq) * sizeof(double));
  double *sinks = malloc((size_t)s.H * sizeof(double)), *dsinks = malloc((size_t)s.H * sizeof(double));
  for (size_t i = 0; i < nq_elems; ++i) q[i] = test_uniform(), d_o[i] = test_uniform();
  for (size_t i = 0; i < nk_elems; ++i) k[i] = test_uniform(), v[i] = test_uniform();
  for (long long h = 0; h < s.H; ++h) sinks[h] = test_uniform();
  host_mods m = mods ? *mods : (host_mods){NULL, NULL, NULL};
  if (with_sinks) m.sinks = sinks;
  reference_backward(desc, &m, q, k, v, d_o, NULL, NULL, 0, dq, dk, dv, with_sinks ? dsinks : NULL);
  double *inputs[4] = {q, k, v, sinks};
  const double *grads[4] = {dq, dk, dv, dsinks};
  const size_t counts[4] = {nq_elems, nk_elems, nk_elems, with_sinks ? (size_t)s.H : 0};
  const double eps = 1e-5;
  double worst = 0, scale = 1;
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < counts[t]; ++i)
      if (fabs(grads[t][i]) > scale) scale = fabs(grads[t][i]);
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < counts[t]; ++i) {
      const double x = inputs[t][i];
      inputs[t][i] = x + eps;
      const double up = loss(desc, &m, q, k, v, d_o, o, lse, nq_elems);
      inputs[t][i] = x - eps;
      const double down = loss(desc, &m, q, k, v, d_o, o, lse, nq_elems);
      inputs[t][i] = x;
      const double e = fabs((up - down) / (2 * eps) - grads[t][i]) / scale;
      if (!(e <= worst)) worst = e; /* NaN propagates */
    }
  free(q), free(k), free(v), free(d_o), free(dq), free(dk), free(dv), free(o), free(lse), free(sinks), free(dsinks);
  return worst;
}
