/* Exact merge of partial attention results over disjoint key sets of the same query rows: split-KV's
 * chunks (float32 partials in scratch) and fcl_attention_merge's parts (the caller's tensors).
 *
 * For one row with parts p: M = max_p lse_p, w_p = exp(lse_p - M) (0 for a part that saw nothing),
 * L = sum_p w_p (+ exp(sink - M) with SINKS), O = sum_p w_p O_p / L, lse = M + ln L. A row with no part
 * that saw a key and no sink gets O = 0 and lse = -inf; a NaN in any part's lse reaches O and lse.
 *
 * One work-group of WG work-items per (batch, head, row): the lse reductions run over the parts in parallel,
 * and work-item c sums columns c, c + WG, ... over the parts, each part's weight computed once.
 * Defines: DTYPE (the output's storage type), PART (0: float32 partials, 1: partials in DTYPE), D, WG,
 * SINKS and VARLEN_Q (common.cl). */
#if PART == 0
typedef float part_t;
#define PART_LOAD(p, i) ((p)[i])
#else
typedef store_t part_t;
#define PART_LOAD(p, i) LOAD(p, i)
#endif

#define COLS ((D + WG - 1) / WG) /* columns of O a work-item writes */

/* x reduced over the work-group (WG a power of two) by fmax (sum 0) or + (sum 1), in a fixed order, so the
   result's bits do not depend on timing; every work-item gets it. */
inline float fcl_combine_reduce(float x, int sum, __local float *red, int lid) {
  red[lid] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = sum ? red[lid] + red[lid + s] : fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  x = red[0];
  barrier(CLK_LOCAL_MEM_FENCE); /* red is free again */
  return x;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_combine(__global const part_t *part_o, long part_off, long part_sb, long part_sh, long part_sn,
                 long part_stride, __global const float *part_lse, long lse_off, int parts, __global store_t *o, long o_off,
                 long o_sb, long o_sh, long o_sn, __global float *lse, int num_heads, int nq,
                 __global const float *sinks, __global const int *cu_q, int total_q) {
  __local float red[WG], wt[WG];
  const int lid = get_local_id(0);
  const long row_id = get_group_id(0); /* (b * num_heads + h) * nq + i */
  const int i = (int)(row_id % nq);
  const long bh = row_id / nq;
  const int h = (int)(bh % num_heads);
  const long b = bh / num_heads;
  const long rows = get_num_groups(0); /* batch * num_heads * nq */
  part_lse += lse_off; /* part p's lse of this row: part_lse[p * rows + row_id] */
  /* Where the row goes: row i of (b, h), or with VARLEN_Q row i of sequence b's packed rows (rows past the
     sequence's end, or of a sequence whose cu_q entries do not fit, are not written). */
#if VARLEN_Q
  const int2 seq = fcl_packed_range(cu_q, (int)b, total_q, nq);
  if (i >= seq.y) return;
  const long out_row = (long)seq.x + i, lse_row = (long)h * total_q + out_row, out_base = o_off + h * o_sh;
#else
  (void)cu_q, (void)total_q;
  const long out_row = i, lse_row = row_id, out_base = o_off + b * o_sb + h * o_sh;
#endif

  /* The row's largest lse and whether any is NaN: each work-item over parts lid, lid + WG, ..., then a tree. */
  float mx = -INFINITY, nan = 0.0f;
  for (int p = lid; p < parts; p += WG) {
    const float x = part_lse[p * rows + row_id];
    nan = isnan(x) ? 1.0f : nan;
    mx = fmax(mx, x);
  }
  mx = fcl_combine_reduce(mx, 0, red, lid);
  nan = fcl_combine_reduce(nan, 0, red, lid);
#if SINKS
  const float sink = sinks[h];
  mx = fmax(mx, sink);
#endif
  float sum = 0.0f;
  if (mx != -INFINITY)
    for (int p = lid; p < parts; p += WG) {
      const float x = part_lse[p * rows + row_id];
      if (x != -INFINITY) sum += exp(x - mx);
    }
  sum = fcl_combine_reduce(sum, 1, red, lid);
#if SINKS
  if (mx != -INFINITY) sum += exp(sink - mx);
#endif
  const float inv = nan != 0.0f ? NAN : sum == 0.0f ? 0.0f : 1.0f / sum;

  /* O: the parts in chunks of WG; a chunk's weights exp(lse_p - M) once into local memory (-1: a part that
     saw no key, left out rather than weighted by zero), then every work-item sums its columns over the chunk
     in part order. The part loads do not depend on each other, so the unrolled loop keeps several in
     flight. */
  const long src = part_off + b * part_sb + h * part_sh + i * part_sn;
  float acc[COLS];
#pragma unroll
  for (int k = 0; k < COLS; ++k) acc[k] = 0.0f;
  for (int p0 = 0; p0 < parts; p0 += WG) {
    const int n = min(WG, parts - p0);
    if (lid < n) {
      const float x = part_lse[(p0 + lid) * rows + row_id];
      wt[lid] = x != -INFINITY && mx != -INFINITY ? exp(x - mx) : -1.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int k = 0; k < COLS; ++k) {
      const int c = lid + k * WG;
      if (c < D) {
        __global const part_t *col = part_o + src + p0 * part_stride + c;
#pragma unroll 8
        for (int p = 0; p < n; ++p) {
          const float x = PART_LOAD(col, p * part_stride), w = wt[p]; /* loaded either way: no branch to wait on */
          if (w >= 0.0f) acc[k] = fma(w, x, acc[k]);
        }
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* every work-item is done with this chunk's weights */
  }
  __global store_t *dst = o + out_base + out_row * o_sn;
#pragma unroll
  for (int k = 0; k < COLS; ++k)
    if (lid + k * WG < D) STORE(dst, lid + k * WG, acc[k] * inv);
  if (lse && lid == 0) lse[lse_row] = nan != 0.0f ? NAN : sum == 0.0f ? -INFINITY : mx + log(sum);
}
