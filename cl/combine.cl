/* Exact merge of partial attention results over disjoint key sets of the same query rows: split-KV's
 * chunks (float32 partials in scratch) and fcl_attention_merge's parts (the caller's tensors).
 *
 * For one row with parts p: M = max_p lse_p, w_p = exp(lse_p - M) (0 for a part that saw nothing),
 * L = sum_p w_p (+ exp(sink - M) with SINKS), O = sum_p w_p O_p / L, lse = M + ln L. A row with no part
 * that saw a key and no sink gets O = 0 and lse = -inf; a NaN in any part's lse reaches O and lse.
 *
 * One work-group of WG work-items per (batch, head, row); work-item c writes columns c, c + WG, ...
 * Defines: DTYPE (the output's storage type), PART (0: float32 partials, 1: partials in DTYPE), D, WG,
 * SINKS and VARLEN_Q (common.cl). */
#if PART == 0
typedef float part_t;
#define PART_LOAD(p, i) ((p)[i])
#else
typedef store_t part_t;
#define PART_LOAD(p, i) LOAD(p, i)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_combine(__global const part_t *part_o, long part_off, long part_sb, long part_sh, long part_sn,
                 long part_stride, __global const float *part_lse, long lse_off, int parts, __global store_t *o, long o_off,
                 long o_sb, long o_sh, long o_sn, __global float *lse, int num_heads, int nq,
                 __global const float *sinks, __global const int *cu_q, int total_q) {
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

  float mx = -INFINITY;
  bool nan = false;
  for (int p = 0; p < parts; ++p) {
    const float x = part_lse[p * rows + row_id];
    nan |= isnan(x);
    mx = fmax(mx, x);
  }
#if SINKS
  const float sink = sinks[h];
  mx = fmax(mx, sink);
#endif
  float sum = 0.0f;
  if (mx != -INFINITY)
    for (int p = 0; p < parts; ++p) {
      const float x = part_lse[p * rows + row_id];
      if (x != -INFINITY) sum += exp(x - mx);
    }
#if SINKS
  if (mx != -INFINITY) sum += exp(sink - mx);
#endif
  const float inv = nan ? NAN : sum == 0.0f ? 0.0f : 1.0f / sum;
  const long src = part_off + b * part_sb + h * part_sh + i * part_sn;
  __global store_t *dst = o + out_base + out_row * o_sn;
  for (int c = lid; c < D; c += WG) {
    float acc = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float x = part_lse[p * rows + row_id];
      /* A part that saw no key is left out, not weighted by zero. */
      if (x != -INFINITY && mx != -INFINITY) acc = fma(exp(x - mx), PART_LOAD(part_o, src + p * part_stride + c), acc);
    }
    STORE(dst, c, acc * inv);
  }
  if (lse && lid == 0) lse[lse_row] = nan ? NAN : sum == 0.0f ? -INFINITY : mx + log(sum);
}
