#include "backward_check.h"

#include "forward_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double backward_tolerance(fcl_dtype t) {
  return t == FCL_DTYPE_F32 ? BWD_TOL_F32 : t == FCL_DTYPE_F16 ? BWD_TOL_F16 : BWD_TOL_BF16;
}

typedef struct dims {
  long long B, H, Hkv, G, Nq, Nk, D;
  double scale;
  int causal;
} dims;

static dims get_dims(const fcl_attention_desc *desc) {
  dims s;
  s.B = desc->batch, s.H = desc->num_heads, s.Hkv = desc->num_kv_heads ? desc->num_kv_heads : desc->num_heads;
  s.G = s.H / s.Hkv;
  s.Nq = desc->seqlen_q, s.Nk = desc->seqlen_k, s.D = desc->head_dim;
  s.scale = desc->scale != 0.0f ? (double)desc->scale : 1.0 / sqrt((double)s.D);
  s.causal = desc->causal;
  return s;
}

/* The last key query row i sees (-1: none). */
static long long last_key(const dims *s, long long i) {
  long long last = s->causal ? i + s->Nk - s->Nq : s->Nk - 1;
  return last < s->Nk - 1 ? last : s->Nk - 1;
}

void reference_forward_f64(const fcl_attention_desc *desc, const double *q, const double *k, const double *v,
                           double *o, double *lse) {
  const dims s = get_dims(desc);
  double *p = malloc((size_t)s.Nk * sizeof(double));
  for (long long b = 0; b < s.B; ++b)
    for (long long h = 0; h < s.H; ++h) {
      const long long hk = h / s.G;
      const double *qh = q + (size_t)((b * s.H + h) * s.Nq * s.D);
      const double *kh = k + (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      const double *vh = v + (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      for (long long i = 0; i < s.Nq; ++i) {
        double *oi = o + (size_t)(((b * s.H + h) * s.Nq + i) * s.D);
        const long long last = last_key(&s, i);
        double m = -INFINITY;
        for (long long j = 0; j <= last; ++j) {
          double acc = 0;
          for (long long d = 0; d < s.D; ++d) acc += qh[i * s.D + d] * kh[j * s.D + d];
          p[j] = acc * s.scale;
          if (p[j] > m) m = p[j];
        }
        for (long long d = 0; d < s.D; ++d) oi[d] = 0;
        if (last < 0) {
          lse[(b * s.H + h) * s.Nq + i] = -INFINITY;
          continue;
        }
        double l = 0;
        for (long long j = 0; j <= last; ++j) l += (p[j] = exp(p[j] - m));
        for (long long j = 0; j <= last; ++j)
          for (long long d = 0; d < s.D; ++d) oi[d] += p[j] / l * vh[j * s.D + d];
        lse[(b * s.H + h) * s.Nq + i] = m + log(l);
      }
    }
  free(p);
}

void reference_backward(const fcl_attention_desc *desc, const double *q, const double *k, const double *v,
                        const double *d_o, double *o_out, double *lse_out, double *dq, double *dk, double *dv) {
  const dims s = get_dims(desc);
  const size_t nq_elems = (size_t)(s.B * s.H * s.Nq * s.D), nk_elems = (size_t)(s.B * s.Hkv * s.Nk * s.D);
  double *o = o_out ? o_out : malloc(nq_elems * sizeof(double));
  double *lse = lse_out ? lse_out : malloc((size_t)(s.B * s.H * s.Nq) * sizeof(double));
  reference_forward_f64(desc, q, k, v, o, lse);
  memset(dq, 0, nq_elems * sizeof(double));
  memset(dk, 0, nk_elems * sizeof(double));
  memset(dv, 0, nk_elems * sizeof(double));
  for (long long b = 0; b < s.B; ++b)
    for (long long h = 0; h < s.H; ++h) {
      const long long hk = h / s.G;
      const size_t qo = (size_t)((b * s.H + h) * s.Nq * s.D), ko = (size_t)((b * s.Hkv + hk) * s.Nk * s.D);
      for (long long i = 0; i < s.Nq; ++i) {
        const double l = lse[(b * s.H + h) * s.Nq + i];
        const long long last = last_key(&s, i);
        const double *qi = q + qo + (size_t)(i * s.D), *doi = d_o + qo + (size_t)(i * s.D);
        const double *oi = o + qo + (size_t)(i * s.D);
        double *dqi = dq + qo + (size_t)(i * s.D);
        double Di = 0;
        for (long long d = 0; d < s.D; ++d) Di += doi[d] * oi[d];
        for (long long j = 0; j <= last; ++j) {
          const double *kj = k + ko + (size_t)(j * s.D), *vj = v + ko + (size_t)(j * s.D);
          double sc = 0, dp = 0;
          for (long long d = 0; d < s.D; ++d) {
            sc += qi[d] * kj[d];
            dp += doi[d] * vj[d];
          }
          const double p = exp(sc * s.scale - l);
          const double ds = p * (dp - Di);
          double *dkj = dk + ko + (size_t)(j * s.D), *dvj = dv + ko + (size_t)(j * s.D);
          for (long long d = 0; d < s.D; ++d) {
            dvj[d] += p * doi[d];
            dkj[d] += s.scale * ds * qi[d];
            dqi[d] += s.scale * ds * kj[d];
          }
        }
      }
    }
  if (!o_out) free(o);
  if (!lse_out) free(lse);
}

static double loss(const fcl_attention_desc *desc, const double *q, const double *k, const double *v,
                   const double *d_o, double *o, double *lse, size_t nq_elems) {
  reference_forward_f64(desc, q, k, v, o, lse);
  double acc = 0;
  for (size_t i = 0; i < nq_elems; ++i) acc += o[i] * d_o[i];
  return acc;
}

double finite_difference_error(const fcl_attention_desc *desc) {
  const dims s = get_dims(desc);
  const size_t nq_elems = (size_t)(s.B * s.H * s.Nq * s.D), nk_elems = (size_t)(s.B * s.Hkv * s.Nk * s.D);
  double *q = malloc(nq_elems * sizeof(double)), *d_o = malloc(nq_elems * sizeof(double));
  double *k = malloc(nk_elems * sizeof(double)), *v = malloc(nk_elems * sizeof(double));
  double *dq = malloc(nq_elems * sizeof(double)), *dk = malloc(nk_elems * sizeof(double));
  double *dv = malloc(nk_elems * sizeof(double)), *o = malloc(nq_elems * sizeof(double));
  double *lse = malloc((size_t)(s.B * s.H * s.Nq) * sizeof(double));
  for (size_t i = 0; i < nq_elems; ++i) q[i] = test_uniform(), d_o[i] = test_uniform();
  for (size_t i = 0; i < nk_elems; ++i) k[i] = test_uniform(), v[i] = test_uniform();
  reference_backward(desc, q, k, v, d_o, NULL, NULL, dq, dk, dv);
  double *inputs[3] = {q, k, v};
  const double *grads[3] = {dq, dk, dv};
  const size_t counts[3] = {nq_elems, nk_elems, nk_elems};
  const double eps = 1e-5;
  double worst = 0, scale = 1;
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < counts[t]; ++i)
      if (fabs(grads[t][i]) > scale) scale = fabs(grads[t][i]);
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < counts[t]; ++i) {
      const double x = inputs[t][i];
      inputs[t][i] = x + eps;
      const double up = loss(desc, q, k, v, d_o, o, lse, nq_elems);
      inputs[t][i] = x - eps;
      const double down = loss(desc, q, k, v, d_o, o, lse, nq_elems);
      inputs[t][i] = x;
      const double e = fabs((up - down) / (2 * eps) - grads[t][i]) / scale;
      if (!(e <= worst)) worst = e; /* NaN propagates */
    }
  free(q), free(k), free(v), free(d_o), free(dq), free(dk), free(dv), free(o), free(lse);
  return worst;
}

static fwd_case as_forward_case(const bwd_case *c) {
  return (fwd_case){c->b, c->h, c->hkv, c->nq, c->nk, c->d, c->dtype, c->causal, c->layout, c->scale, 1};
}

static void describe(const bwd_case *c, char *out, size_t size) {
  const fwd_case f = as_forward_case(c);
  describe_case(&f, out, size);
  if (c->from_forward) strncat(out, " o,lse from forward", size - strlen(out) - 1);
}

static double *to_double(const float *x, size_t n) {
  double *y = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; ++i) y[i] = x[i];
  return y;
}

int run_backward_case(test_env *env, cl_command_queue queue, const bwd_case *c, int determinism,
                      const char *label) {
  char what[240];
  describe(c, what, sizeof what);
  const long long hkv = c->hkv ? c->hkv : c->h;
  test_tensor q, k, v, o, d_o, dq, dk, dv;
  memset(&q, 0, sizeof q), memset(&k, 0, sizeof k), memset(&v, 0, sizeof v), memset(&o, 0, sizeof o);
  memset(&d_o, 0, sizeof d_o), memset(&dq, 0, sizeof dq), memset(&dk, 0, sizeof dk), memset(&dv, 0, sizeof dv);
  int setup = tensor_create(env, &q, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &k, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &v, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &d_o, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &o, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 0) |
              tensor_create(env, &dq, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 0) |
              tensor_create(env, &dk, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 0) |
              tensor_create(env, &dv, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 0);
  const size_t nrows = (size_t)(c->b * c->h * c->nq);
  const size_t nq_elems = nrows * (size_t)c->d, nk_elems = (size_t)(c->b * hkv * c->nk * c->d);
  cl_mem lse = create_float_buffer(env, nrows, NAN), ws = NULL;
  int result = 1;
  double *rq = NULL, *rk = NULL, *rv = NULL, *ro = NULL, *rlse = NULL, *gq = NULL, *gk = NULL, *gv = NULL,
         *rdo = NULL;
  float *first[3] = {NULL, NULL, NULL}, *lse_host = NULL;
  if (setup || !lse) {
    check(0, "%s %s: could not allocate test buffers", label, what);
    goto out;
  }
  fcl_attention_desc desc;
  const fwd_case fc = as_forward_case(c);
  case_desc(&fc, &q, &k, &v, &o, &desc);

  /* float64 reference from the dtype-rounded inputs. */
  rq = to_double(q.host, nq_elems), rk = to_double(k.host, nk_elems), rv = to_double(v.host, nk_elems);
  rdo = to_double(d_o.host, nq_elems);
  ro = malloc(nq_elems * sizeof(double)), rlse = malloc(nrows * sizeof(double));
  gq = malloc(nq_elems * sizeof(double)), gk = malloc(nk_elems * sizeof(double)), gv = malloc(nk_elems * sizeof(double));
  reference_backward(&desc, rq, rk, rv, rdo, ro, rlse, gq, gk, gv);

  fcl_status st;
  if (c->from_forward) {
    cl_event fe = NULL;
    st = fcl_attention_forward(env->fcl, queue, &desc, q.buf, k.buf, v.buf, o.buf, lse, 0, NULL, &fe);
    if (st == FCL_SUCCESS) {
      clWaitForEvents(1, &fe);
      clReleaseEvent(fe);
    }
  } else {
    lse_host = malloc(nrows * sizeof(float));
    for (size_t i = 0; i < nrows; ++i) lse_host[i] = (float)rlse[i];
    for (size_t i = 0; i < nq_elems; ++i) o.host[i] = round_to_dtype((float)ro[i], c->dtype);
    st = tensor_upload(env, &o) == 0 &&
                 clEnqueueWriteBuffer(env->queue, lse, CL_TRUE, 0, nrows * sizeof(float), lse_host, 0, NULL, NULL) ==
                     CL_SUCCESS
             ? FCL_SUCCESS
             : FCL_ERROR_OPENCL;
  }
  if (st != FCL_SUCCESS) {
    check(0, "%s %s: producing o and lse: %s: %s", label, what, fcl_status_string(st), fcl_last_error());
    goto out;
  }

  const size_t ws_bytes = fcl_attention_backward_workspace_size(env->fcl, &desc);
  if (ws_bytes != nrows * sizeof(float)) {
    check(0, "%s %s: workspace size %zu, expected %zu", label, what, ws_bytes, nrows * sizeof(float));
    goto out;
  }
  ws = create_float_buffer(env, ws_bytes / sizeof(float), NAN);

  const int runs = determinism ? 2 : 1;
  cl_event prev = NULL;
  int same = 1;
  for (int run = 0; run < runs; ++run) {
    if (tensor_poison(env, &dq) || tensor_poison(env, &dk) || tensor_poison(env, &dv)) {
      check(0, "%s %s: poisoning failed", label, what);
      goto out;
    }
    cl_event ev = NULL;
    /* The second run waits on the first's (complete) event, exercising the wait list. */
    st = fcl_attention_backward(env->fcl, queue, &desc, q.buf, k.buf, v.buf, o.buf, lse, d_o.buf, dq.buf, dk.buf,
                                dv.buf, ws, prev ? 1 : 0, prev ? &prev : NULL, &ev);
    if (prev) clReleaseEvent(prev);
    prev = NULL;
    if (st == FCL_ERROR_UNSUPPORTED) {
      skip("%s %s: %s", label, what, fcl_last_error());
      result = 2;
      goto out;
    }
    if (st != FCL_SUCCESS) {
      check(0, "%s %s: %s: %s", label, what, fcl_status_string(st), fcl_last_error());
      goto out;
    }
    clWaitForEvents(1, &ev);
    cl_int exec = CL_COMPLETE;
    clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof exec, &exec, NULL);
    prev = ev;
    if (exec != CL_COMPLETE || tensor_read(env, &dq) || tensor_read(env, &dk) || tensor_read(env, &dv)) {
      check(0, "%s %s: the backward run or reading its results failed (event status %d)", label, what, (int)exec);
      goto out;
    }
    test_tensor *outs[3] = {&dq, &dk, &dv};
    for (int t = 0; t < 3; ++t) {
      const size_t n = t == 0 ? nq_elems : nk_elems;
      if (run == 0) {
        first[t] = malloc(n * sizeof(float));
        memcpy(first[t], outs[t]->host, n * sizeof(float));
      } else if (memcmp(first[t], outs[t]->host, n * sizeof(float)) != 0) {
        same = 0;
      }
    }
  }
  if (prev) clReleaseEvent(prev);

  double mq, mk, mv;
  const double eq = rel_error(first[0], gq, nq_elems, &mq);
  const double ek = rel_error(first[1], gk, nk_elems, &mk);
  const double ev = rel_error(first[2], gv, nk_elems, &mv);
  /* Rows that see no key (causal, Nq > Nk): exactly zero dQ. */
  long long empty_rows = 0, nonzero = 0;
  if (c->causal && c->nq > c->nk) {
    for (long long r = 0; r < (long long)nrows; ++r) {
      const long long i = r % c->nq;
      if (i + c->nk - c->nq >= 0) continue;
      ++empty_rows;
      for (long long d = 0; d < c->d; ++d)
        if (first[0][(size_t)(r * c->d + d)] != 0.0f) ++nonzero;
    }
  }
  const double tol = backward_tolerance(c->dtype);
  const int ok = eq <= tol && ek <= tol && ev <= tol && same && nonzero == 0;
  check(ok, "%s %s: rel dq %.2e dk %.2e dv %.2e (bound %.0e), max abs %.1e %.1e %.1e%s%s", label, what, eq, ek, ev,
        tol, mq, mk, mv, determinism ? (same ? ", 2 runs bitwise equal" : ", RUNS DIFFER") : "",
        empty_rows ? (nonzero ? ", NONZERO dq in rows with no key" : ", rows with no key: dq = 0") : "");
  result = ok ? 0 : 1;
out:
  free(rq), free(rk), free(rv), free(rdo), free(ro), free(rlse), free(gq), free(gk), free(gv), free(lse_host);
  for (int t = 0; t < 3; ++t) free(first[t]);
  tensor_release(&q), tensor_release(&k), tensor_release(&v), tensor_release(&o), tensor_release(&d_o);
  tensor_release(&dq), tensor_release(&dk), tensor_release(&dv);
  if (lse) clReleaseMemObject(lse);
  if (ws) clReleaseMemObject(ws);
  return result;
}
