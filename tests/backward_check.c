#include "backward_check.h"

#include "forward_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ||out - ref|| and ||x|| (Euclidean). */
static double diff_norm(const float *out, const double *ref, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
  return sqrt(s);
}
static double norm(const double *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += x[i] * x[i];
  return sqrt(s);
}

/* ||out - ref|| / ||terms|| when ref has cancelled (||ref|| <= BWD_CANCELLED ||terms||), else infinity (and
   where out has a non-finite value). */
static double terms_error(const float *out, const double *ref, const double *terms, size_t n) {
  const double nt = norm(terms, n);
  if (!(nt > 0) || norm(ref, n) > BWD_CANCELLED * nt) return INFINITY;
  const double e = diff_norm(out, ref, n);
  return isnan(e) || isinf(e) ? INFINITY : e / nt;
}

double backward_tolerance(fcl_dtype t) {
  return t == FCL_DTYPE_F32 ? BWD_TOL_F32 : t == FCL_DTYPE_F16 ? BWD_TOL_F16 : BWD_TOL_BF16;
}

static fwd_case as_forward_case(const bwd_case *c) {
  return (fwd_case){c->b, c->h, c->hkv, c->nq, c->nk, c->d, c->dtype, c->causal, c->layout, c->scale, 1, c->mods};
}

static void describe(const bwd_case *c, char *out, size_t size) {
  const fwd_case f = as_forward_case(c);
  describe_case(&f, out, size);
  if (c->from_forward) strncat(out, " o,lse from forward", size - strlen(out) - 1);
}

void backward_shape_desc(const bwd_case *c, fcl_attention_desc *desc) {
  const fwd_case f = as_forward_case(c);
  case_shape_desc(&f, desc);
}

void backward_case_name(const bwd_case *c, int determinism, char *out, size_t size) {
  fwd_case f = as_forward_case(c);
  f.with_lse = 0;
  forward_case_name(&f, out, size);
  const size_t n = strlen(out);
  if (n + 1 < size)
    snprintf(out + n, size - n, "%s%s", c->from_forward ? "_fromfwd" : "", determinism ? "_twice" : "");
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
  mod_buffers mb;
  memset(&mb, 0, sizeof mb);
  cl_mem d_sinks = NULL;
  double *rq = NULL, *rk = NULL, *rv = NULL, *ro = NULL, *rlse = NULL, *gq = NULL, *gk = NULL, *gv = NULL,
         *rdo = NULL, *tq = NULL, *tk = NULL, *tv = NULL;
  float *first[3] = {NULL, NULL, NULL}, *lse_host = NULL;
  if (setup || !lse) {
    check(0, "%s %s: could not allocate test buffers", label, what);
    goto out;
  }
  fcl_attention_desc desc;
  const fwd_case fc = as_forward_case(c);
  case_desc(&fc, &q, &k, &v, &o, &desc);
  if (mods_create(env, &c->mods, &desc, &mb) ||
      (c->mods.sinks && !(d_sinks = create_float_buffer(env, (size_t)c->h, NAN)))) {
    check(0, "%s %s: could not allocate the modifiers' buffers", label, what);
    goto out;
  }
  desc.d_sinks = d_sinks;
  double ref_dsinks[64];

  /* float64 reference from the dtype-rounded inputs. */
  rq = to_double(q.host, nq_elems), rk = to_double(k.host, nk_elems), rv = to_double(v.host, nk_elems);
  rdo = to_double(d_o.host, nq_elems);
  ro = malloc(nq_elems * sizeof(double)), rlse = malloc(nrows * sizeof(double));
  gq = malloc(nq_elems * sizeof(double)), gk = malloc(nk_elems * sizeof(double)), gv = malloc(nk_elems * sizeof(double));
  reference_backward(&desc, &mb.host, rq, rk, rv, rdo, ro, rlse, REF_STORED_O, gq, gk, gv, d_sinks ? ref_dsinks : NULL);

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

  /* d_sinks[h] = -sum over (b, i) of exp(sink - lse) * D_i, D_i = dO_i . O_i: the terms' signs cancel, so the
     error is measured against the sum of their magnitudes, which is what O's storage rounding scales with. */
  double es = 0;
  if (d_sinks) {
    float got[64];
    es = read_floats(env, d_sinks, got, (size_t)c->h) == 0 ? 0 : INFINITY;
    for (long long h = 0; h < c->h && es < INFINITY; ++h) {
      double magnitude = 0;
      for (long long b = 0; b < c->b; ++b)
        for (long long i = 0; i < c->nq; ++i) {
          const size_t r = (size_t)((b * c->h + h) * c->nq + i);
          if (rlse[r] == -INFINITY) continue;
          double m = 0;
          for (long long d = 0; d < c->d; ++d) m += fabs(rdo[r * (size_t)c->d + (size_t)d] * ro[r * (size_t)c->d + (size_t)d]);
          magnitude += exp(mb.host.sinks[h] - rlse[r]) * m;
        }
      const double e = fabs(got[h] - ref_dsinks[h]) / (magnitude > 0 ? magnitude : 1);
      es = e > es ? e : es;
    }
  }
  double mq, mk, mv;
  const double eq = rel_error(first[0], gq, nq_elems, &mq);
  const double ek = rel_error(first[1], gk, nk_elems, &mk);
  const double ev = rel_error(first[2], gv, nk_elems, &mv);
  const double tol = backward_tolerance(c->dtype);
  /* Where a gradient misses the relative bound: the errors against the norms of the terms' magnitudes, where it
     has cancelled (BWD_CANCELLED); infinite elsewhere, and where an error is. The magnitudes take a second pass
     of the float64 reference, so only such a case pays for it. */
  double tq_e = INFINITY, tk_e = INFINITY, tv_e = INFINITY;
  if (eq > tol || ek > tol || ev > tol) {
    tq = malloc(nq_elems * sizeof(double)), tk = malloc(nk_elems * sizeof(double)), tv = malloc(nk_elems * sizeof(double));
    reference_backward(&desc, &mb.host, rq, rk, rv, rdo, NULL, NULL, REF_STORED_O | REF_MAGNITUDE, tq, tk, tv, NULL);
    tq_e = terms_error(first[0], gq, tq, nq_elems);
    tk_e = terms_error(first[1], gk, tk, nk_elems);
    tv_e = terms_error(first[2], gv, tv, nk_elems);
  }
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
  /* Each O element is rounded to the storage type (relative 2^-11 in f16, 2^-8 in bf16) and D_i is summed in
     float32 over d terms: twice that is the bound, so an error in the kernel's sink term stands out. */
  const double unit = c->dtype == FCL_DTYPE_F16 ? 0x1p-11 : c->dtype == FCL_DTYPE_BF16 ? 0x1p-8 : 0x1p-24;
  const double tol_sinks = 2 * (unit + (double)c->d * 0x1p-24);
  const int ok = (eq <= tol || tq_e <= BWD_TOL_TERMS) && (ek <= tol || tk_e <= BWD_TOL_TERMS) &&
                 (ev <= tol || tv_e <= BWD_TOL_TERMS) && es <= tol_sinks && same && nonzero == 0;
  char sinks_text[96] = "";
  if (d_sinks) snprintf(sinks_text, sizeof sinks_text, ", d_sinks error / sum of |terms| %.2e (bound %.1e)", es, tol_sinks);
  char terms_text[128] = "";
  if (tq_e < INFINITY || tk_e < INFINITY || tv_e < INFINITY)
    snprintf(terms_text, sizeof terms_text, ", cancelled (inf: not) against the terms %.1e %.1e %.1e (bound %.0e)", tq_e,
             tk_e, tv_e, BWD_TOL_TERMS);
  check(ok, "%s %s: rel dq %.2e dk %.2e dv %.2e (bound %.0e)%s, max abs %.1e %.1e %.1e%s%s%s", label, what, eq, ek, ev,
        tol, terms_text, mq, mk, mv, sinks_text, determinism ? (same ? ", 2 runs bitwise equal" : ", RUNS DIFFER") : "",
        empty_rows ? (nonzero ? ", NONZERO dq in rows with no key" : ", rows with no key: dq = 0") : "");
  result = ok ? 0 : 1;
out:
  free(rq), free(rk), free(rv), free(rdo), free(ro), free(rlse), free(gq), free(gk), free(gv), free(lse_host);
  free(tq), free(tk), free(tv);
  for (int t = 0; t < 3; ++t) free(first[t]);
  tensor_release(&q), tensor_release(&k), tensor_release(&v), tensor_release(&o), tensor_release(&d_o);
  tensor_release(&dq), tensor_release(&dk), tensor_release(&dv);
  if (lse) clReleaseMemObject(lse);
  if (ws) clReleaseMemObject(ws);
  if (d_sinks) clReleaseMemObject(d_sinks);
  mods_release(&mb);
  return result;
}
