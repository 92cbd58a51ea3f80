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
 * Packed and paged sequences (common.cl's VARLEN_Q, KV, SEQLENS_K; every kernel here takes FCL_SEQ_ARGS): the
 * gathers copy each sequence into the padded [pair][rows][d] scratch through fcl_seq, with zeros past its own
 * lengths and NaN for the keys of a block outside the pool; the softmax takes each sequence's own nq_b, nk_b
 * for positions and visibility and gives a sequence with bad key indices NaN; the scatters write back only a
 * sequence's own rows, none of one whose cu_seqlens_q entries do not fit. The results are the forward's
 * (docs/api.md, "Untrusted indices"). Without those defines fcl_seq is the dense [batch] layout.
 *
 * Defines: DTYPE (common.cl) for the conversions; WG, a power of two, for the softmax work-group.
 */

/* Element offset of query row i < s->nq of sequence b, head h, in q or o (offset and strides of that tensor). */
inline long fcl_ref_query_offset(const fcl_seq *s, long b, long h, int i, long off, long sb, long sh, long sn) {
  return fcl_query_base(s, b, h, off, sb, sh, sn) + (long)i * sn;
}
/* Element offset of key j < s->nk of sequence b, kv head hk, in k or v, as flash_fwd.cl addresses it; -1 for a
   key of a block outside the pool (it reads as NaN). */
inline long fcl_ref_key_offset(const fcl_seq *s, long b, long hk, int j, long off, long sb, long sh, long sn) {
  const long at = KV == 2 ? fcl_block_offset(fcl_key_block(s, j), sb, sn) : (long)j * sn;
  return at < 0 ? -1L : fcl_key_base(s, b, hk, off, sb, sh, sn) + at;
}

#ifdef WG
/* One work-group per score row. s holds `rows` rows of nk raw scores q.k (row r of (batch, head) pair p at
 * (p * nq + r) * nk, pairs counted from the chunk's first; nq, nk the padded lengths); each row is replaced
 * by its probabilities P = softmax of the modified scores (common.cl's mask layer: window, softcap, ALiBi,
 * mask, sinks, with the sequence's own lengths), with hidden entries P = 0: rows and keys past the sequence's
 * own see and are seen by nothing. A sequence whose key indices did not fit gets P and lse NaN (so O too). Row `row` of the chunk is row lse_first + row of [batch, num_heads, nq]. lse
 * (optional) receives ln of the row's sum of exp over its visible keys and sink, -INFINITY for a row
 * that sees nothing (its P row is all zero). hits[row] receives 1 when the row gives P != 0 to a key that
 * marks (fcl_gather_clean_rows: [pair][nk]) flags, else 0; marks is read only in a pair that marked_pairs
 * (over the call's pairs) flags, so the common case (all of V finite) costs one load a row. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_softmax_rows(__global float *s, __global float *lse, long lse_first, int num_heads, int nq, int nk,
                      float scale, int write_lse, __global const uchar *marks,
                      __global const int *marked_pairs, __global uchar *hits, FCL_MOD_ARGS, FCL_SEQ_ARGS) {
  __local float red_m[WG];
  __local float red_l[WG];
  __local int any_hit, any_nan;
  const int lid = get_local_id(0);
  const long row = get_group_id(0);
  const long grow = lse_first + row;
  const int r = (int)(grow % nq);
  const long pair = grow / nq;
  const int b = (int)(pair / num_heads), h = (int)(pair % num_heads);
  __global float *srow = s + row * (long)nk;
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq, nk);
  const int snq = seq.nq, snk = seq.nk; /* the sequence's own lengths: its positions and keys */
  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, snq, snk);
  const int begin = fcl_key_begin(&mods, r), end = fcl_key_end(&mods, r, snk); /* keys the row sees */
  const float c = scale * FCL_LOG2E; /* scores in log2 units for exp2 */

  /* Per work-item online max and sum over its strided share of the row: keys j with j % WG == lid, the ones it
     writes in the second pass (begin + lid would give another work-item's keys to it under a window: a race). */
  float m = -INFINITY, l = 0.0f;
  bool nan = false; /* a visible score is NaN (from q or k): the row's P and lse are NaN, as IEEE gives */
  for (int j = begin + (lid - begin % WG + WG) % WG; j < end; j += WG) {
    const float x = fcl_score(&mods, srow[j] * c, r, j, snq, snk);
    if (x == -INFINITY) continue; /* a key the mask hides */
    if (fcl_nonfinite(x) && x != INFINITY) {
      nan = true;
      continue;
    }
    if (x > m) {
      l = l * exp2(m - x) + 1.0f;
      m = x;
    } else {
      l += exp2(x - m);
    }
  }
  red_m[lid] = m;
  red_l[lid] = l;
  if (lid == 0) any_hit = 0, any_nan = 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (nan) atomic_or(&any_nan, 1);
  for (int span = WG / 2; span > 0; span >>= 1) {
    if (lid < span) {
      const float m1 = red_m[lid], m2 = red_m[lid + span];
      const float mx = fmax(m1, m2);
      /* Both maxima -inf: both sums are 0 (NaN scores never enter them: any_nan carries those). */
      red_l[lid] = mx == -INFINITY ? 0.0f : red_l[lid] * exp2(m1 - mx) + red_l[lid + span] * exp2(m2 - mx);
      red_m[lid] = mx;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float mx = red_m[0], sum = red_l[0];
  if (any_nan) mx = sum = NAN; /* read after the reduction's barriers */
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
    const float x = j >= begin && j < end ? fcl_score(&mods, srow[j] * c, r, j, snq, snk) : -INFINITY;
    const float p = seq.bad ? NAN : x == -INFINITY ? 0.0f : exp2(x - mx) * inv;
    srow[j] = p;
    if (marked && p != 0.0f && row_marks[j]) atomic_or(&any_hit, 1); /* NaN P counts too */
  }
  if (write_lse && lid == 0) lse[grow] = seq.bad ? NAN : sum == 0.0f ? -INFINITY : (mx + log2(sum)) * FCL_LN2;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) hits[row] = any_hit != 0;
}
#endif

/* Row r < rows (nq, or nk when keys) of linear (batch, head) pair i of a [batch, heads, rows, d] tensor with
 * `group` heads per source head (group > 1 maps query heads to their shared K/V head): its sequence, whether
 * the row is one of the sequence's own, and its element offset in the tensor (-1: a key of a block outside
 * the pool). The kernel defines first, heads, group, nq, nk, keys, and the tensor's off, sb, sh, sn. */
#define FCL_REF_ROW(seq, i, r, own, at)                                                              \
  const long b_ = (i) / heads, h_ = ((i) % heads) / group;                                           \
  fcl_seq seq;                                                                                       \
  FCL_SEQ_INIT(seq, b_, nq, nk);                                                                     \
  const bool own = (r) < (keys ? seq.nk : seq.nq);                                                   \
  const long at = !own ? -1L                                                                         \
                  : keys ? fcl_ref_key_offset(&seq, b_, h_, (r), off, sb, sh, sn)                     \
                         : fcl_ref_query_offset(&seq, b_, h_, (r), off, sb, sh, sn)

/* Copies `pairs` (batch, head) blocks of a [batch, heads, rows, d] tensor in the descriptor's storage type,
 * strides and sequence layout into contiguous float32 dst [pairs][rows][d] (rows = nq, or nk when keys): the
 * padded dense layout. Pair p is the linear (batch, head) index first + p over `heads` heads. Rows past the
 * sequence's own are 0, the keys of a block outside the pool NaN. One work-item per element; the grid is
 * rounded up and the excess masked. */
__kernel void fcl_gather_rows(__global const store_t *src, long off, long sb, long sh, long sn,
                              __global float *dst, long first, int heads, int group, int nq, int nk, int keys,
                              int d, long total, FCL_SEQ_ARGS) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int rows = keys ? nk : nq;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % rows);
  FCL_REF_ROW(seq, first + pr / rows, r, own, at);
  dst[e] = !own ? 0.0f : at < 0 ? NAN : LOAD(src, at + col);
}

/* fcl_gather_rows for V (keys), which the GEMM O = P V reads: non-finite elements are copied as 0, and the
 * work-item of each row's column 0 sets marks[pair * nk + r] (the chunk's [pairs][nk]) to 1 when any element of
 * that row is non-finite (a key of a block outside the pool: all of it), else 0 (it reads the row's d elements
 * itself, so no two write a mark), and then sets marked_pairs[first + pair] (one flag per pair of the whole
 * call, created 0). Rows past the sequence's own are 0 and unmarked. */
__kernel void fcl_gather_clean_rows(__global const store_t *src, long off, long sb, long sh, long sn,
                                    __global float *dst, __global uchar *marks, __global int *marked_pairs,
                                    long first, int heads, int group, int nq, int nk, int d, long total,
                                    FCL_SEQ_ARGS) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int keys = 1;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % nk);
  const long i = first + pr / nk;
  FCL_REF_ROW(seq, i, r, own, at);
  const float x = !own ? 0.0f : at < 0 ? NAN : LOAD(src, at + col);
  dst[e] = fcl_nonfinite(x) ? 0.0f : x;
  if (col == 0) {
    bool any = own && at < 0;
    if (own && at >= 0)
      for (int c = 0; c < d; ++c) any |= fcl_nonfinite(LOAD(src, at + c));
    marks[pr] = any;
    if (any) atomic_or(&marked_pairs[i], 1);
  }
}

/* After O = P V on the cleaned V: one work-item per query row of the chunk ([pairs][nq]); a row that hits
 * (fcl_softmax_rows) gets, for each key j in [k0, k1) that is marked and that it gives P != 0, the terms
 * P V[j][c] of V's non-finite elements added to its O (float32 at o + o_off + pair * o_sp + i * o_sn): what
 * the GEMM missed, so O[i][c] becomes NaN or +-inf exactly where a visible non-finite value makes it so. V is
 * read where fcl_gather_clean_rows read it (a block outside the pool: NaN); keys beyond k1 are left to the
 * next launch (the loop budget). */
__kernel void fcl_nonfinite_fixup(__global const float *p, __global const uchar *marks,
                                  __global const uchar *hits, __global const store_t *v, long off, long sb,
                                  long sh, long sn, long first, int heads, int group, __global float *o, long o_off,
                                  long o_sp, long o_sn, int nq, int nk, int d, int k0, int k1, long rows,
                                  FCL_SEQ_ARGS) {
  const long row = get_global_id(0);
  if (row >= rows || !hits[row]) return;
  const long pr = row / nq;
  const int i = (int)(row % nq);
  const long idx = first + pr;
  const long b = idx / heads, h = (idx % heads) / group;
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq, nk);
  __global const float *prow = p + row * nk;
  __global const uchar *row_marks = marks + pr * nk;
  __global float *orow = o + (o_off + pr * o_sp + i * o_sn);
  for (int j = k0; j < k1; ++j) {
    const float pj = prow[j];
    if (!row_marks[j] || pj == 0.0f) continue; /* hidden (P = 0) or finite throughout; marked keys are own */
    const long at = fcl_ref_key_offset(&seq, b, h, j, off, sb, sh, sn);
    for (int c = 0; c < d; ++c) {
      const float x = at < 0 ? NAN : LOAD(v, at + c);
      if (fcl_nonfinite(x)) orow[c] += pj * x;
    }
  }
}

/* The inverse of fcl_gather_rows for the output o (group 1, query rows): contiguous float32 src [pairs][nq][d]
 * into dst in the descriptor's storage type, strides and sequence layout. Only a sequence's own rows are
 * written: none of one whose cu_seqlens_q entries do not fit (fcl_seq gives it no rows). */
__kernel void fcl_scatter_rows(__global const float *src, __global store_t *dst, long off, long sb, long sh,
                               long sn, long first, int heads, int nq, int nk, int d, long total, FCL_SEQ_ARGS) {
  const long e = get_global_id(0);
  if (e >= total) return;
  const int group = 1, keys = 0;
  const int col = (int)(e % d);
  const long pr = e / d;
  const int r = (int)(pr % nq);
  FCL_REF_ROW(seq, first + pr / nq, r, own, at);
  if (own) STORE(dst, at + col, src[e]);
}

/* With VARLEN_Q: lse from the padded [batch, heads, nq] scratch src into the caller's [heads, total_q], a
 * sequence's own rows only (as fcl_scatter_rows). One work-item per padded row, `rows` of them. */
__kernel void fcl_scatter_lse(__global const float *src, __global float *dst, int heads, int nq, int nk, long rows,
                              FCL_SEQ_ARGS) {
  const long row = get_global_id(0);
  if (row >= rows) return;
  const int i = (int)(row % nq);
  const long bh = row / nq;
  fcl_seq seq;
  FCL_SEQ_INIT(seq, bh / heads, nq, nk);
  if (i < seq.nq) dst[(bh % heads) * total_q + seq.q_row + i] = src[row];
}
