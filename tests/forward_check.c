#include "forward_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double forward_tolerance(fcl_dtype t) {
  return t == FCL_DTYPE_F32 ? FWD_TOL_F32 : t == FCL_DTYPE_F16 ? FWD_TOL_F16 : FWD_TOL_BF16;
}

static const char *layouts[] = {"bhnd", "bnhd", "padded"};

void describe_case(const fwd_case *c, char *out, size_t size) {
  snprintf(out, size, "B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld d=%lld %s%s %s%s", c->b, c->h, c->hkv ? c->hkv : c->h,
           c->nq, c->nk, c->d, dtype_name(c->dtype), c->causal ? " causal" : "", layouts[c->layout],
           c->scale != 0.0f ? " scale" : "");
  mods_describe(&c->mods, out, size);
  const size_t n = strlen(out);
  if (c->plant && n < size)
    snprintf(out + n, size - n, c->plant != PLANT_RISING               ? " NaN/inf planted in V"
                                : PLANT_RISING_SCALES_V(c->nk, c->dtype) ? " rising scores, V near float's range"
                                                                         : " rising scores");
}

void forward_case_name(const fwd_case *c, char *out, size_t size) {
  char hkv[32] = "", scale[32] = "";
  if (c->hkv) snprintf(hkv, sizeof hkv, "_Hkv%lld", c->hkv);
  if (c->scale != 0.0f) snprintf(scale, sizeof scale, "_scale%g", (double)c->scale);
  snprintf(out, size, "B%lld_H%lld%s_Nq%lld_Nk%lld_d%lld_%s%s_%s%s%s", c->b, c->h, hkv, c->nq, c->nk, c->d,
           dtype_name(c->dtype), c->causal ? "_causal" : "", layouts[c->layout], scale, c->with_lse ? "_lse" : "");
  mods_name(&c->mods, out, size);
  const size_t n = strlen(out);
  if (c->plant && n < size) snprintf(out + n, size - n, c->plant == PLANT_RISING ? "_rising" : "_nonfinite-v");
}

void case_shape_desc(const fwd_case *c, fcl_attention_desc *desc) {
  memset(desc, 0, sizeof *desc);
  desc->batch = c->b, desc->num_heads = c->h, desc->num_kv_heads = c->hkv;
  desc->seqlen_q = c->nq, desc->seqlen_k = c->nk, desc->head_dim = c->d;
  desc->dtype = c->dtype, desc->scale = c->scale, desc->causal = c->causal;
}

void case_desc(const fwd_case *c, const test_tensor *q, const test_tensor *k, const test_tensor *v,
               const test_tensor *o, fcl_attention_desc *desc) {
  case_shape_desc(c, desc);
  tensor_to_desc(q, desc->q_stride, &desc->q_offset);
  tensor_to_desc(k, desc->k_stride, &desc->k_offset);
  tensor_to_desc(v, desc->v_stride, &desc->v_offset);
  tensor_to_desc(o, desc->o_stride, &desc->o_offset);
}

/* Writes the planted values (PLANT_*_ROW) into v's host copy, logical [b][h][n][d], and a NaN into key
   PLANT_NAN_ROW's k row (its score is NaN: rows that an additive mask of -inf hides it from must still come
   out exact). */
static void plant_nonfinite(test_tensor *k, test_tensor *v) {
  for (long long bh = 0; bh < k->b * k->h; ++bh) k->host[(size_t)((bh * k->n + PLANT_NAN_ROW(k->n)) * k->d)] = NAN;
  for (long long bh = 0; bh < v->b * v->h; ++bh) {
    float *inf_row = v->host + (size_t)((bh * v->n + PLANT_INF_ROW(v->n)) * v->d);
    float *nan_row = v->host + (size_t)((bh * v->n + PLANT_NAN_ROW(v->n)) * v->d);
    inf_row[0] = INFINITY;
    inf_row[v->d - 1] = -INFINITY;
    for (long long c = 0; c < v->d; ++c) nan_row[c] = NAN;
  }
}

/* Rising scores (PLANT_RISING) in the host copies of k and v, logical [b][h][n][d]. */
static void plant_rising(test_tensor *k, test_tensor *v, fcl_dtype dtype) {
  for (long long bh = 0; bh < k->b * k->h; ++bh)
    for (long long j = 0; j < k->n; ++j) {
      float *kr = k->host + (size_t)((bh * k->n + j) * k->d), *vr = v->host + (size_t)((bh * v->n + j) * v->d);
      for (long long c = 0; c < k->d; ++c) {
        kr[c] = round_to_dtype(kr[c] * PLANT_RISING_K(j, k->n), dtype);
        if (PLANT_RISING_SCALES_V(k->n, dtype)) vr[c] *= PLANT_RISING_V; /* a power of two: exact in the dtype */
      }
    }
}

/* lse's error for rising scores, row by row over max(1, |lse| / FWD_TOL_LSE_SPAN): their lse reach the hundreds,
   and float32 scores' errors grow with them. A non-finite lse must equal the reference's. */
static double rising_lse_error(const float *got, const double *ref, size_t rows) {
  double worst = 0;
  for (size_t r = 0; r < rows; ++r) {
    const double e = (double)got[r] == ref[r] ? 0 : fabs((double)got[r] - ref[r]) / fmax(1.0, fabs(ref[r]) / FWD_TOL_LSE_SPAN);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  return worst;
}

typedef struct planted_counts {
  size_t nan, inf;  /* elements whose reference is NaN, +-inf */
  size_t mismatched;/* of those, elements that are not exactly that */
  size_t clean_rows;/* rows whose reference is finite throughout: rows that see no planted value */
} planted_counts;

/* rel_error over the elements whose reference is finite; the others are counted into *n and must match
   exactly (NaN for NaN, the same infinity). */
static double planted_error(const float *got, const double *ref, size_t rows, size_t d, double *max_abs,
                            planted_counts *n) {
  memset(n, 0, sizeof *n);
  float *fg = malloc(rows * d * sizeof(float));
  double *fr = malloc(rows * d * sizeof(double));
  if (!fg || !fr) {
    free(fg), free(fr);
    return INFINITY;
  }
  size_t m = 0;
  for (size_t r = 0; r < rows; ++r) {
    int clean = 1;
    for (size_t c = r * d; c < (r + 1) * d; ++c) {
      if (isfinite(ref[c])) {
        fg[m] = got[c], fr[m++] = ref[c];
        continue;
      }
      clean = 0;
      if (isnan(ref[c])) n->nan++, n->mismatched += !isnan(got[c]);
      else n->inf++, n->mismatched += !((double)got[c] == ref[c]);
    }
    n->clean_rows += clean;
  }
  const double rel = rel_error(fg, fr, m, max_abs);
  free(fg), free(fr);
  return rel;
}

int run_forward_case(test_env *env, cl_command_queue queue, const fwd_case *c, fwd_fn fn, const char *label) {
  char what[200];
  describe_case(c, what, sizeof what);
  const long long hkv = c->hkv ? c->hkv : c->h;
  test_tensor q, k, v, o;
  int setup = tensor_create(env, &q, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &k, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &v, c->b, hkv, c->nk, c->d, c->layout, c->dtype, 1) |
              tensor_create(env, &o, c->b, c->h, c->nq, c->d, c->layout, c->dtype, 0);
  const size_t nrows = (size_t)(c->b * c->h * c->nq);
  if (c->plant && !setup) {
    if (c->plant == PLANT_RISING) plant_rising(&k, &v, c->dtype);
    else plant_nonfinite(&k, &v);
    setup = tensor_upload(env, &k) | tensor_upload(env, &v);
  }
  cl_mem lse = c->with_lse ? create_float_buffer(env, nrows, NAN) : NULL;
  int result = 1;
  mod_buffers mb;
  fcl_attention_desc desc;
  case_desc(c, &q, &k, &v, &o, &desc);
  if (mods_create(env, &c->mods, &desc, &mb) || setup || (c->with_lse && !lse)) {
    check(0, "%s %s: could not allocate test buffers", label, what);
    goto out;
  }

  cl_event ev = NULL;
  fcl_status st = fn(env->fcl, queue, &desc, q.buf, k.buf, v.buf, o.buf, lse, 0, NULL, &ev);
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
  clReleaseEvent(ev);
  double *ref_o = malloc(nrows * (size_t)c->d * sizeof(double));
  double *ref_lse = malloc(nrows * sizeof(double));
  float *got_lse = malloc(nrows * sizeof(float));
  const size_t kv_elems = (size_t)(c->b * hkv * c->nk * c->d);
  double *dq_in = to_double(q.host, nrows * (size_t)c->d), *dk_in = to_double(k.host, kv_elems),
         *dv_in = to_double(v.host, kv_elems);
  reference_forward(&desc, &mb.host, dq_in, dk_in, dv_in, ref_o, ref_lse);
  free(dq_in), free(dk_in), free(dv_in);
  int read_ok = tensor_read(env, &o) == 0 && (!lse || read_floats(env, lse, got_lse, nrows) == 0);
  double max_abs = 0, lse_max = 0;
  planted_counts pc = {0, 0, 0, 0};
  double rel = !read_ok  ? INFINITY
               : c->plant == PLANT_NONFINITE ? planted_error(o.host, ref_o, nrows, (size_t)c->d, &max_abs, &pc)
                          : rel_error(o.host, ref_o, nrows * (size_t)c->d, &max_abs);
  planted_counts pl = {0, 0, 0, 0}; /* lse: NaN exactly where the reference's is (rows that see a NaN score) */
  if (lse && read_ok) {
    if (c->plant == PLANT_NONFINITE) planted_error(got_lse, ref_lse, nrows, 1, &lse_max, &pl);
    else if (c->plant == PLANT_RISING) lse_max = rising_lse_error(got_lse, ref_lse, nrows);
    else rel_error(got_lse, ref_lse, nrows, &lse_max);
  }
  const double tol = forward_tolerance(c->dtype);
  const int gaps_ok = tensor_gaps_untouched(env, &o);
  if (!gaps_ok) printf("     o: an element outside the tensor (padding or offset) was written\n");
  /* A planted case tests nothing unless some rows see the planted values and some do not. */
  const int planted_ok = c->plant != PLANT_NONFINITE || (pc.mismatched == 0 && pc.nan > 0 && pc.inf > 0 && pc.clean_rows > 0);
  if (c->plant == PLANT_NONFINITE)
    printf("     planted: %zu NaN and %zu +-inf elements expected, %zu not so; %zu rows see none of them; lse: %zu NaN "
           "expected, %zu not so\n",
           pc.nan, pc.inf, pc.mismatched, pc.clean_rows, pl.nan, pl.mismatched);
  const int ok = read_ok && gaps_ok && planted_ok && rel <= tol && (!lse || (lse_max <= FWD_TOL_LSE && pl.mismatched == 0));
  if (lse)
    check(ok, "%s %s: rel %.2e (bound %.1e) max abs %.2e, lse max abs %.2e%s (bound %.0e)", label, what, rel, tol,
          max_abs, lse_max, c->plant == PLANT_RISING ? " over max(1, |lse| / 16)" : "", FWD_TOL_LSE);
  else
    check(ok, "%s %s: rel %.2e (bound %.1e) max abs %.2e", label, what, rel, tol, max_abs);
  result = ok ? 0 : 1;
  free(ref_o);
  free(ref_lse);
  free(got_lse);
out:
  mods_release(&mb);
  tensor_release(&q);
  tensor_release(&k);
  tensor_release(&v);
  tensor_release(&o);
  if (lse) clReleaseMemObject(lse);
  return result;
}
