/* Kernels of the materialized reference path (src/reference.c): the row softmax over the N x N score
 * matrix, and the conversions between the descriptor's tensors and contiguous float32 scratch.
 *
 * Defines: DTYPE (common.cl) for the conversions; WG, a power of two, for the softmax work-group.
 */

#ifdef WG
/* One work-group per score row. s holds `rows` rows of nk scores (row r of head pair p at
 * (p * nq + r) * nk); each row is replaced by its probabilities P = softmax(scale * s) with the causal
 * mask aligned to the bottom-right corner (query row r sees keys j <= r + nk - nq; masked entries get
 * P = 0). lse (optional) receives ln(sum exp(scale * s)) of the visible keys at lse[lse_first + row],
 * -INFINITY for a row that sees no key (its P row is all zero). */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_softmax_rows(__global float *s, __global float *lse, long lse_first, int nq, int nk, int causal,
                      float scale, int write_lse) {
  __local float red_m[WG];
  __local float red_l[WG];
  const int lid = get_local_id(0);
  const long row = get_group_id(0);
  const int r = (int)(row % nq);
  __global float *srow = s + row * (long)nk;
  const int end = causal ? clamp(r + nk - nq + 1, 0, nk) : nk; /* keys j < end are visible */
  const float c = scale * FCL_LOG2E;                            /* scores in log2 units for exp2 */

  /* Per work-item online max and sum over its strided share of the row. */
  float m = -INFINITY, l = 0.0f;
  for (int j = lid; j < end; j += WG) {
    const float x = srow[j] * c;
    if (x > m) {
      l = l * exp2(m - x) + 1.0f;
      m = x;
    } else {
      l += exp2(x - m);
    }
  }
  red_m[lid] = m;
  red_l[lid] = l;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int span = WG / 2; span > 0; span >>= 1) {
    if (lid < span) {
      const float m1 = red_m[lid], m2 = red_m[lid + span];
      const float mx = fmax(m1, m2);
      red_l[lid] = mx == -INFINITY ? 0.0f : red_l[lid] * exp2(m1 - mx) + red_l[lid + span] * exp2(m2 - mx);
      red_m[lid] = mx;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float mx = red_m[0];
  const float inv = red_l[0] > 0.0f ? 1.0f / red_l[0] : 0.0f;
  for (int j = lid; j < nk; j += WG) srow[j] = j < end ? exp2(srow[j] * c - mx) * inv : 0.0f;
  if (write_lse && lid == 0) lse[lse_first + row] = end > 0 ? (mx + log2(red_l[0])) * FCL_LN2 : -INFINITY;
}
#endif

/* Copies `pairs` (batch, head) blocks of a [batch, heads, rows, d] tensor in the descriptor's storage
 * type and strides into contiguous float32 dst [pairs][rows][d]. Pair p is the linear (batch, head)
 * index first + p over `heads` heads; the source head is head / group (group > 1 maps query heads to
 * their shared K/V head). One work-item per element; the grid is rounded up and the excess masked. */
__kernel void fcl_gather_rows(__global const store_t *src, long off, long sb, long sh, long sn,
                              __global float *dst, long first, int heads, int group, int rows, int d,
                              long total) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % rows);
  const long i = first + pr / rows;
  const long b = i / heads, h = (i % heads) / group;
  dst[e] = LOAD(src + (off + b * sb + h * sh + r * sn + col), 0);
}

/* The inverse of fcl_gather_rows for an output tensor (group 1): contiguous float32 src
 * [pairs][rows][d] into dst in the descriptor's storage type and strides. */
__kernel void fcl_scatter_rows(__global const float *src, __global store_t *dst, long off, long sb, long sh,
                               long sn, long first, int heads, int rows, int d, long total) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % rows);
  const long i = first + pr / rows;
  const long b = i / heads, h = i % heads;
  STORE(dst + (off + b * sb + h * sh + r * sn + col), 0, src[e]);
}
