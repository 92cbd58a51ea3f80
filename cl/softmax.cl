/* Kernels of the materialized reference path (src/reference.c): the row softmax over the N x N score
 * matrix, and the conversions between the descriptor's tensors and contiguous float32 scratch.
 *
 * Defines: DTYPE (common.cl) for the conversions; WG, a power of two, for the softmax work-group.
 */

#ifdef WG
/* One work-group per score row. s holds `rows` rows of nk raw scores q.k (row r of (batch, head) pair p at
 * (p * nq + r) * nk, pairs counted from the chunk's first); each row is replaced by its probabilities P =
 * softmax of the modified scores (common.cl's mask layer: window, softcap, ALiBi, mask, sinks), with
 * hidden entries P = 0. Row `row` of the chunk is row lse_first + row of [batch, num_heads, nq]. lse
 * (optional) receives ln of the row's sum of exp over its visible keys and sink, -INFINITY for a row
 * that sees nothing (its P row is all zero). */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_softmax_rows(__global float *s, __global float *lse, long lse_first, int num_heads, int nq, int nk,
                      float scale, int write_lse, FCL_MOD_ARGS) {
  __local float red_m[WG];
  __local float red_l[WG];
  const int lid = get_local_id(0);
  const long row = get_group_id(0);
  const long grow = lse_first + row;
  const int r = (int)(grow % nq);
  const long pair = grow / nq;
  const int b = (int)(pair / num_heads), h = (int)(pair % num_heads);
  __global float *srow = s + row * (long)nk;
  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, nq, nk);
  const int begin = fcl_key_begin(&mods, r), end = fcl_key_end(&mods, r, nk); /* keys the row sees */
  const float c = scale * FCL_LOG2E; /* scores in log2 units for exp2 */

  /* Per work-item online max and sum over its strided share of the row. */
  float m = -INFINITY, l = 0.0f;
  for (int j = begin + lid; j < end; j += WG) {
    const float x = fcl_score(&mods, srow[j] * c, r, j, nq, nk);
    if (x == -INFINITY) continue; /* a key the mask hides */
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
  float mx = red_m[0], sum = red_l[0];
#if SINKS
  /* The sink joins the denominator once: sum' = sum 2^(mx - mx') + 2^(sink - mx'), mx' = max(mx, sink). */
  const float sink = FCL_SINK(h), mf = fmax(mx, sink);
  if (mf != -INFINITY) {
    sum = sum * exp2(mx - mf) + exp2(sink - mf);
    mx = mf;
  }
#endif
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  /* Every entry is read by the work-item that writes it, so no barrier separates the passes. */
  for (int j = lid; j < nk; j += WG) {
    const float x = j >= begin && j < end ? fcl_score(&mods, srow[j] * c, r, j, nq, nk) : -INFINITY;
    srow[j] = x == -INFINITY ? 0.0f : exp2(x - mx) * inv;
  }
  if (write_lse && lid == 0) lse[grow] = sum == 0.0f ? -INFINITY : (mx + log2(sum)) * FCL_LN2;
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
