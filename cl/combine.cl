/* Exact merge of partial attention results over disjoint key sets of the same query rows: split-KV's
 * chunks (float32 partials in scratch) and fcl_attention_merge's parts (the caller's tensors).
 *
 * For one row with parts p: M = max_p lse_p, w_p = exp(lse_p - M) (0 for a part that saw nothing),
 * L = sum_p w_p (+ exp(sink - M) with SINKS), O = sum_p w_p O_p / L, lse = M + ln L. A row with no part
 * that saw a key and no sink gets O = 0 and lse = -inf; a NaN in any part's lse reaches O and lse.
 *
 * One work-group of WG work-items per (batch, head, row) and slice of CV column groups (VW adjacent columns
 * each), in one pass over the parts: work-item (lane pl, column group cv) keeps a running (M, L, A) over parts
 * pl, pl + LANES, ... for its column group, rescaling as M grows (the online softmax's merge), so its part
 * loads do not wait on each other; the lanes' states are then merged in lane order through local memory. More
 * lanes put more of a row's loads in flight at once, at the cost of a longer lane merge, and slices spread a
 * row over more compute units (src/merge.c picks PL). The order of every sum is fixed, so the result's bits
 * do not depend on timing.
 * Defines: DTYPE (the output's storage type), PART (0: float32 partials, 1: partials in DTYPE), D, WG, PL (part
 * lanes asked for, a power of two), SINKS and VARLEN_Q (common.cl). Grid: (rows x WG, slices);
 * fcl_combine_layout_of (src/merge.c) computes CV and the slices as this file does. */
#if PART == 0
typedef float part_t;
#define PART_LOAD(p, i) ((p)[i])
#else
typedef store_t part_t;
#define PART_LOAD(p, i) LOAD(p, i)
#endif

#define VW (D % 4 == 0 ? 4 : 1) /* adjacent columns a work-item takes together */
#define NV (D / VW)             /* column groups in a row */
#define LANES (PL < WG ? PL : WG)        /* part lanes */
#define CV (NV < WG / LANES ? NV : WG / LANES) /* column groups of a slice */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_combine(__global const part_t *part_o, long part_off, long part_sb, long part_sh, long part_sn,
                 long part_stride, __global const float *part_lse, long lse_off, int parts, __global store_t *o, long o_off,
                 long o_sb, long o_sh, long o_sn, __global float *lse, int num_heads, int nq,
                 __global const float *sinks, __global const int *cu_q, int total_q) {
  const int lid = get_local_id(0);
  const long row_id = get_group_id(0); /* (b * num_heads + h) * nq + i */
  const int col0 = get_group_id(1) * CV; /* the slice's first column group */
  const int i = (int)(row_id % nq);
  const long bh = row_id / nq;
  const int h = (int)(bh % num_heads);
  const long b = bh / num_heads;
  const long rows = get_num_groups(0); /* batch * num_heads * nq */
  part_lse += lse_off; /* part p's lse of this row: part_lse[p * rows + row_id] */
  /* Where the row goes: row i of (b, h), or with VARLEN_Q row i of sequence b's packed rows (rows past the
     sequence's end, or of a sequence whose cu_q entries do not fit, are not written). */
#if VARLEN_Q
  const int2 seq = fcl_packed_range(cu_q, (int)b, total_q, nq, true);
  if (i >= seq.y) return;
  const long out_row = (long)seq.x + i, lse_row = (long)h * total_q + out_row, out_base = o_off + h * o_sh;
#else
  (void)cu_q, (void)total_q;
  const long out_row = i, lse_row = row_id, out_base = o_off + b * o_sb + h * o_sh;
#endif

  const int pl = lid / CV, cv = lid % CV, j = col0 + cv; /* j: the work-item's column group */
  const long src = part_off + b * part_sb + h * part_sh + i * part_sn;
  /* This lane's running state over its parts: maximum M, sum L and weighted sum A of O, in M's units. A
     part with lse -inf saw no key and is left out (not weighted by zero); a NaN lse marks the row NaN. */
  float m = -INFINITY, l = 0.0f, a[VW];
  int nan = 0;
#pragma unroll
  for (int e = 0; e < VW; ++e) a[e] = 0.0f;
  if (pl < LANES && j < NV) {
#pragma unroll 4
    for (int p = pl; p < parts; p += LANES) {
      const float x = part_lse[p * rows + row_id];
      __global const part_t *op = part_o + src + p * part_stride + j * VW;
      float y[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) y[e] = PART_LOAD(op, e);
      nan |= isnan(x);
      const int take = x != -INFINITY && !isnan(x);
      const float mn = take ? fmax(m, x) : m;
      const float c = take ? exp(m - mn) : 1.0f, w = take ? exp(x - mn) : 0.0f;
      l = fma(l, c, w);
#pragma unroll
      for (int e = 0; e < VW; ++e) a[e] = take ? fma(a[e], c, w * y[e]) : a[e];
      m = mn;
    }
  }
  /* The lanes' states, merged in lane order by the work-items of lane 0. */
  __local float sm[LANES * CV], sl[LANES * CV], sa[VW * LANES * CV];
  __local int snan[LANES * CV];
  if (pl < LANES) {
    sm[lid] = m, sl[lid] = l, snan[lid] = nan;
#pragma unroll
    for (int e = 0; e < VW; ++e) sa[e * LANES * CV + lid] = a[e];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (pl != 0 || j >= NV) return;
  float mx = -INFINITY;
  for (int q = 0; q < LANES; ++q) {
    mx = fmax(mx, sm[q * CV + cv]);
    nan |= snan[q * CV + cv];
  }
#if SINKS
  const float sink = sinks[h];
  mx = fmax(mx, sink);
#endif
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < VW; ++e) a[e] = 0.0f;
  if (mx != -INFINITY)
    for (int q = 0; q < LANES; ++q) {
      const int w_ = q * CV + cv;
      if (sm[w_] == -INFINITY) continue; /* a lane that saw no part with keys */
      const float c = exp(sm[w_] - mx);
      sum = fma(sl[w_], c, sum);
#pragma unroll
      for (int e = 0; e < VW; ++e) a[e] = fma(sa[e * LANES * CV + w_], c, a[e]);
    }
#if SINKS
  if (mx != -INFINITY) sum += exp(sink - mx);
#endif
  const float inv = nan ? NAN : sum == 0.0f ? 0.0f : 1.0f / sum;
  __global store_t *dst = o + out_base + out_row * o_sn;
#pragma unroll
  for (int e = 0; e < VW; ++e) STORE(dst, j * VW + e, a[e] * inv);
  if (lse && j == 0) lse[lse_row] = nan ? NAN : sum == 0.0f ? -INFINITY : mx + log(sum);
}
