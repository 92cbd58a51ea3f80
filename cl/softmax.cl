/* Kernels of the materialized reference path (src/reference.c): the row softmax over the N x N score
 * matrix, the conversions between the descriptor's tensors and contiguous float32 scratch, and the exclusion
 * of hidden non-finite V values from O = P V.
 *
 * A GEMM weights every key, hidden ones by P = 0, and 0 times NaN or +-inf is NaN: a NaN in a V row that a
 * query row cannot see would still reach that row. So V reaches the GEMM as a float32 copy with its non-finite
 * elements replaced by 0 and each key row marked when it held any, each (batch, head) pair too when one of
 * its rows is (fcl_gather_clean_rows); in a marked pair the softmax flags the query rows that give a marked
 * key P != 0 (only they can see a non-finite value); fcl_nonfinite_fixup
 * then adds those rows' missing terms P V for the non-finite elements from the original V. A row that sees
 * none of them keeps the GEMM's exact result; one that does gets NaN or +-inf as IEEE arithmetic over its
 * visible keys gives.
 *
 * Defines: DTYPE (common.cl) for the conversions; WG, a power of two, for the softmax work-group.
 */

/* NaN or +-inf, from the bits: stays right under -cl-finite-math-only or -cl-fast-relaxed-math in the caller's
   build options, which let isfinite() fold to true. */
inline bool fcl_nonfinite(float x) { return (as_uint(x) & 0x7f800000u) == 0x7f800000u; }

#ifdef WG
/* One work-group per score row. s holds `rows` rows of nk raw scores q.k (row r of (batch, head) pair p at
 * (p * nq + r) * nk, pairs counted from the chunk's first); each row is replaced by its probabilities P =
 * softmax of the modified scores (common.cl's mask layer: window, softcap, ALiBi, mask, sinks), with
 * hidden entries P = 0. Row `row` of the chunk is row lse_first + row of [batch, num_heads, nq]. lse
 * (optional) receives ln of the row's sum of exp over its visible keys and sink, -INFINITY for a row
 * that sees nothing (its P row is all zero). hits[row] receives 1 when the row gives P != 0 to a key that
 * marks (fcl_gather_clean_rows: [pair][nk]) flags, else 0; marks is read only in a pair that marked_pairs
 * (over the call's pairs) flags, so the common case (all of V finite) costs one load a row. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_softmax_rows(__global float *s, __global float *lse, long lse_first, int num_heads, int nq, int nk,
                      float scale, int write_lse, __global const uchar *marks,
                      __global const int *marked_pairs, __global uchar *hits, FCL_MOD_ARGS) {
  __local float red_m[WG];
  __local float red_l[WG];
  __local int any_hit;
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
  if (lid == 0) any_hit = 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int span = WG / 2; span > 0; span >>= 1) {
    if (lid < span) {
      const float m1 = red_m[lid], m2 = red_m[lid + span];
      const float mx = fmax(m1, m2);
      /* Both maxima -inf: the sums are 0, or NaN from a NaN score (a NaN key: m stays -inf), which must reach
         the row's lse and P. */
      red_l[lid] = mx == -INFINITY ? red_l[lid] + red_l[lid + span]
                                   : red_l[lid] * exp2(m1 - mx) + red_l[lid + span] * exp2(m2 - mx);
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
  __global const uchar *row_marks = marks + (row / nq) * (long)nk;
  const bool marked = marked_pairs[pair] != 0;
  for (int j = lid; j < nk; j += WG) {
    const float x = j >= begin && j < end ? fcl_score(&mods, srow[j] * c, r, j, nq, nk) : -INFINITY;
    const float p = x == -INFINITY ? 0.0f : exp2(x - mx) * inv;
    srow[j] = p;
    if (marked && p != 0.0f && row_marks[j]) atomic_or(&any_hit, 1); /* NaN P counts too */
  }
  if (write_lse && lid == 0) lse[grow] = sum == 0.0f ? -INFINITY : (mx + log2(sum)) * FCL_LN2;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) hits[row] = any_hit != 0;
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

/* fcl_gather_rows for V, which the GEMM O = P V reads: non-finite elements are copied as 0, and the work-item
 * of each row's column 0 sets marks[pair * rows + r] (the chunk's [pairs][rows]) to 1 when any element of that
 * row is non-finite, else 0 (it reads the row's d elements itself, so no two write a mark), and then sets
 * marked_pairs[first + pair] (one flag per pair of the whole call, created 0). */
__kernel void fcl_gather_clean_rows(__global const store_t *src, long off, long sb, long sh, long sn,
                                    __global float *dst, __global uchar *marks, __global int *marked_pairs,
                                    long first, int heads, int group, int rows, int d, long total) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % rows);
  const long i = first + pr / rows;
  const long b = i / heads, h = (i % heads) / group;
  __global const store_t *row = src + (off + b * sb + h * sh + r * sn);
  const float x = LOAD(row, col);
  dst[e] = fcl_nonfinite(x) ? 0.0f : x;
  if (col == 0) {
    bool any = false;
    for (int c = 0; c < d; ++c) any |= fcl_nonfinite(LOAD(row, c));
    marks[pr] = any;
    if (any) atomic_or(&marked_pairs[i], 1);
  }
}

/* After O = P V on the cleaned V: one work-item per query row of the chunk ([pairs][nq]); a row that hits
 * (fcl_softmax_rows) gets, for each key j in [k0, k1) that is marked and that it gives P != 0, the terms
 * P V[j][c] of V's non-finite elements added to its O (float32 at o + o_off + pair * o_sp + i * o_sn): what
 * the GEMM missed, so O[i][c] becomes NaN or +-inf exactly where a visible non-finite value makes it so. V is
 * read where fcl_gather_clean_rows read it; keys beyond k1 are left to the next launch (the loop budget). */
__kernel void fcl_nonfinite_fixup(__global const float *p, __global const uchar *marks,
                                  __global const uchar *hits, __global const store_t *v, long off, long sb,
                                  long sh, long sn, long first, int heads, int group, __global float *o, long o_off,
                                  long o_sp, long o_sn, int nq, int nk, int d, int k0, int k1, long rows) {
  const long row = get_global_id(0);
  if (row >= rows || !hits[row]) return;
  const long pr = row / nq;
  const int i = (int)(row % nq);
  const long idx = first + pr;
  const long b = idx / heads, h = (idx % heads) / group;
  __global const float *prow = p + row * nk;
  __global const uchar *row_marks = marks + pr * nk;
  __global float *orow = o + (o_off + pr * o_sp + i * o_sn);
  for (int j = k0; j < k1; ++j) {
    const float pj = prow[j];
    if (!row_marks[j] || pj == 0.0f) continue; /* hidden (P = 0) or finite throughout */
    __global const store_t *vrow = v + (off + b * sb + h * sh + j * sn);
    for (int c = 0; c < d; ++c) {
      const float x = LOAD(vrow, c);
      if (fcl_nonfinite(x)) orow[c] += pj * x;
    }
  }
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
