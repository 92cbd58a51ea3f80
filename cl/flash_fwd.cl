/* Portable FlashAttention-2 forward.
 *
 * One work-group owns BR query rows of one (batch, head). It keeps its Q tile in local memory and its
 * O accumulator in registers, and streams K and V tiles of BC rows through one local buffer, with the
 * online softmax's running max and sum per row. Work-items form a TR x TC grid: work-item (tr, tc)
 * computes S for rows tr*RM.. and key columns tc, tc+TC, .., and O for the same rows and output
 * columns tc, tc+TC, .. (strided, so neighbouring work-items touch neighbouring addresses).
 * S = Q K^T reads Q and K rows four floats at a time; P V reads P rows four at a time.
 *
 * Defines (all from plan.c): D head_dim; DP, D padded to a multiple of TC and of 4; DS, the local row
 * stride of Q/K/V (a multiple of 4, and 4 mod 8 where room allows, so eight consecutive rows fall in
 * distinct banks); BR, BC, TR, TC, RM, RN, DN; KT: 1 keeps the K tile transposed ([DP][KS], keys
 * contiguous), so neighbouring work-items read neighbouring keys: what a CPU's work-item loop
 * vectorizes; 0 reads K rows as float4 along d, which suits GPUs' local memory. Tails beyond seqlen_q,
 * seqlen_k and D are zero-filled in local memory and never written back.
 * DIRECT (a CPU's blocks of few rows, where a tile element is reused too little to pay for its
 * trip through local memory): S reads K rows and P V reads V rows from global memory directly.
 * From common.cl: the modifiers (WINDOW, SOFTCAP, ALIBI, MASK, SINKS), the sequences (VARLEN_Q, KV,
 * SEQLENS_K: each work-group takes its sequence's lengths and rows), SPLIT (a chunk of the keys, partials
 * for the combine) and PACK (the tile's rows are (query row, head) pairs of one kv head's group).
 * SUBGROUP (plan.c; TC a power of two above 1): a row's TC work-items combine their maxima and sums by
 * butterfly shuffles where they are one aligned run of a sub-group, checked as the kernel starts; else, and
 * without SUBGROUP, through local memory (Rmax, Rsum). 1: OpenCL's sub-group shuffles (cl_intel_subgroups, or
 * cl_khr_subgroup_shuffle with sub-groups); 2: NVIDIA's warp shuffles through PTX (32 lanes, the work-group
 * whole warps). SUBGROUP_REQUIRED (a test switch): a work-group that cannot take the shuffles writes NaN, so
 * a test knows the shuffles ran.
 */
#define WG (TR * TC)
#ifndef DIRECT
#define DIRECT 0
#endif
#ifndef SUBGROUP
#define SUBGROUP 0
#endif
#ifndef SUBGROUP_REQUIRED
#define SUBGROUP_REQUIRED 0
#endif

/* The shuffle the compiler offers for SUBGROUP (none: the local-memory reductions alone). */
#define ROW_SHUFFLES 0
#if (TC & (TC - 1)) == 0
#if SUBGROUP == 1 && defined(cl_intel_subgroups)
#undef ROW_SHUFFLES
#define ROW_SHUFFLES 1
#define SG_SHUFFLE_XOR(x, m) intel_sub_group_shuffle_xor((x), (uint)(m))
#define SG_SIZE() get_sub_group_size()
#elif SUBGROUP == 1 && defined(cl_khr_subgroup_shuffle) && (defined(cl_khr_subgroups) || defined(__opencl_c_subgroups))
#ifdef cl_khr_subgroups
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif
#undef ROW_SHUFFLES
#define ROW_SHUFFLES 1
#define SG_SHUFFLE_XOR(x, m) sub_group_shuffle_xor((x), (uint)(m))
#define SG_SIZE() get_sub_group_size()
#elif SUBGROUP == 2 && WG % 32 == 0
#undef ROW_SHUFFLES
#define ROW_SHUFFLES 1
inline float fcl_warp_shuffle_xor(float x, int m) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;\n" : "=f"(r) : "f"(x), "r"(m));
  return r;
}
#define SG_SHUFFLE_XOR(x, m) fcl_warp_shuffle_xor((x), (m))
#define SG_SIZE() 32u
#endif
#endif
#if !ROW_SHUFFLES
#define SG_SHUFFLE_XOR(x, m) (x) /* never reached: `shuffles` below is then false */
#endif
#define PS (BC + 4) /* P row stride: a multiple of 4 that staggers rows across banks */
#define KS (BC + 1) /* row stride of the transposed K tile */
#if KT && DP * KS > BC * DS
#define KV_FLOATS (DP * KS)
#else
#define KV_FLOATS (BC * DS)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_fwd(__global const store_t *q, __global const store_t *k, __global const store_t *v,
               __global store_t *o, __global float *lse,
               long q_off, long q_sb, long q_sh, long q_sn,
               long k_off, long k_sb, long k_sh, long k_sn,
               long v_off, long v_sb, long v_sh, long v_sn,
               long o_off, long o_sb, long o_sh, long o_sn,
               int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS,
               FCL_SPLIT_ARGS) {
  __local float4 Qs4[BR * DS / 4];
  __local float4 KVs4[(KV_FLOATS + 3) / 4];
  __local float4 Ps4[BR * PS / 4];
  __local float Rmax[BR * TC];
  __local float Rsum[BR * TC];
  __local int2 page[KV == 2 ? BC : 1]; /* paged keys: the current tile's blocks and rows (common.cl) */
  __local float *Qs = (__local float *)Qs4;
  __local float *KVs = (__local float *)KVs4;
  __local float *Ps = (__local float *)Ps4;

  const int lid = get_local_id(0);
  const int tc = lid % TC;
  const int tr = lid / TC;
  /* Last query block first (harmless without a window): under a causal mask it has the most keys, so the
     long blocks start early and the short ones fill in at the end. */
  const int blocks = get_num_groups(0) / splits;
  const int split = get_group_id(0) / blocks;
  const int q0 = (blocks - 1 - get_group_id(0) % blocks) * BR;
#if PACK
  const int hk = get_group_id(1), h = hk * group; /* h: the group's first head (common.cl's ROW_*) */
#else
  const int h = get_group_id(1), hk = h / group;
#endif
  const int b = get_group_id(2);

  /* This sequence's lengths and rows (common.cl); a block past its last row has nothing to do. */
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq_max, nk_max);
  const int nq = seq.nq, nk = seq.nk;
  const int nrows = PACK ? nq * group : nq; /* tile rows: query rows, or (query row, head) pairs */
  if (q0 >= nrows) return;
  FCL_SEQ_BASES(seq, b, h, hk);

#if ROW_SHUFFLES
  /* Which work-items form sub-groups is the implementation's choice: the shuffles serve only where, in every
     sub-group of the work-group, the partner at distance x < TC of each work-item is local id lid ^ x, that is
     the same row's work-item tc ^ x. Local ids below 2^24 are exact as floats. */
  __local int rows_in_subgroups;
  if (lid == 0) rows_in_subgroups = 1;
  barrier(CLK_LOCAL_MEM_FENCE);
  int fits = SG_SIZE() % TC == 0;
  for (int x = 1; x < TC; x <<= 1) fits &= SG_SHUFFLE_XOR((float)lid, x) == (float)(lid ^ x);
  if (!fits) atomic_and(&rows_in_subgroups, 0);
  barrier(CLK_LOCAL_MEM_FENCE);
  const bool shuffles = rows_in_subgroups != 0; /* the same in every work-item: the shuffles below stay uniform */
#else
  const bool shuffles = false;
#endif
#if SUBGROUP_REQUIRED
  if (!shuffles) seq.bad = true;
#endif

  /* Q tile, pre-scaled so that S comes out in log2 units for exp2. */
  for (int i_ = lid; i_ < BR * DP; i_ += WG) {
    const int r_ = i_ / DP, c_ = i_ % DP;
    Qs[r_ * DS + c_] = q0 + r_ < nrows && c_ < D ? LOAD(q, ROW_OFF(q0 + r_, q_sh, q_sn) + c_) * (scale * FCL_LOG2E) : 0.0f;
  }

  float m[RM], l[RM], acc[RM][DN];
  for (int i = 0; i < RM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (int n = 0; n < DN; ++n) acc[i][n] = 0.0f;
  }

  /* The keys the block's rows see: tiles outside the window are never loaded. The window does not depend on
     the head, so mods serves every packed row for it. */
  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, nq, nk);
  const int first_i = ROW_I(q0), last_i = ROW_I(min(q0 + BR, nrows) - 1);
#if PACK && (ALIBI || MASK != 0)
  /* Packed rows of different heads: each row's own ALiBi slope and mask. */
  fcl_mods rmods[RM];
  for (int i = 0; i < RM; ++i) FCL_MODS_INIT(rmods[i], b, ROW_HEAD(q0 + tr * RM + i), nq, nk);
#define ROW_MODS(i) (&rmods[i])
#else
#define ROW_MODS(i) (&mods)
#endif
  /* Split-KV: this work-group's chunk of them (all of them without SPLIT). */
  const int2 keys = fcl_split_keys(fcl_key_begin(&mods, first_i), fcl_key_end(&mods, last_i, nk), BC, split, splits);
  const int kv_begin = keys.x, kv_end = seq.bad ? keys.x : keys.y;

  for (int k0 = kv_begin; k0 < kv_end; k0 += BC) {
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's P.V is done with KVs, Ps and page */
#if KV == 2
    FCL_PAGE_ROWS(page, seq, k0, BC);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
#if DIRECT
    /* S reads K from global memory below. */
#elif KT
    for (int i = lid; i < BC * DP; i += WG) {
      const int r = i / DP, c = i % DP;
      const long off = FCL_KEY_ROW(page, r, k0 + r, nk, k_sb, k_sn);
      KVs[c * KS + r] = c < D ? FCL_KEY_LOAD(k, off, c) : 0.0f;
    }
#else
    LOAD_KEY_TILE(KVs, k, k_sb, k_sn, seq, page, k0, BC);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) s[i][j] = 0.0f;
#if DIRECT
    {
      long koff[RN]; /* each key's row (FCL_KEY_ROW) */
      for (int j = 0; j < RN; ++j) koff[j] = FCL_KEY_ROW(page, tc + j * TC, k0 + tc + j * TC, nk, k_sb, k_sn);
      for (int d = 0; d < D; ++d) {
        float kd[RN];
        for (int j = 0; j < RN; ++j) kd[j] = FCL_KEY_LOAD(k, koff[j], d);
        for (int i = 0; i < RM; ++i) {
          const float qd = Qs[(tr * RM + i) * DS + d];
          for (int j = 0; j < RN; ++j) s[i][j] = fma(qd, kd[j], s[i][j]);
        }
      }
    }
#elif KT
    for (int d = 0; d < DP; ++d) {
      float kd[RN];
      for (int j = 0; j < RN; ++j) kd[j] = KVs[d * KS + tc + j * TC];
      for (int i = 0; i < RM; ++i) {
        const float qd = Qs[(tr * RM + i) * DS + d];
        for (int j = 0; j < RN; ++j) s[i][j] = fma(qd, kd[j], s[i][j]);
      }
    }
#else
    for (int d4 = 0; d4 < DP / 4; ++d4) {
      float4 kd[RN];
      for (int j = 0; j < RN; ++j) kd[j] = KVs4[(tc + j * TC) * (DS / 4) + d4];
      for (int i = 0; i < RM; ++i) {
        const float4 qd = Qs4[(tr * RM + i) * (DS / 4) + d4];
        for (int j = 0; j < RN; ++j) {
          s[i][j] = fma(qd.x, kd[j].x, s[i][j]);
          s[i][j] = fma(qd.y, kd[j].y, s[i][j]);
          s[i][j] = fma(qd.z, kd[j].z, s[i][j]);
          s[i][j] = fma(qd.w, kd[j].w, s[i][j]);
        }
      }
    }
#endif

    /* A tile every row sees whole needs no per-element mask (rows beyond nq are never written); others
       exclude hidden entries from P V (a NaN in a hidden V row must not reach the output), as does a mask,
       which may hide any key. */
    const bool whole = !fcl_tile_masked(&mods, first_i, last_i, k0, BC, nk);
    const bool score_mods = (SOFTCAP | ALIBI | MASK) != 0; /* a variable: `|| !whole` is then no constant test */
    const bool guard = (MASK != 0) | !whole;
    float row_max[RM], row_sum[RM]; /* with shuffles: the row's maximum and sum over the tile */
    for (int i = 0; i < RM; ++i) {
      const int row = q0 + tr * RM + i;
      float tile_max = -INFINITY;
      for (int j = 0; j < RN; ++j) {
        const int col = k0 + tc + j * TC;
        if (score_mods || !whole) s[i][j] = fcl_score(ROW_MODS(i), s[i][j], ROW_I(row), col, nq, nk);
        tile_max = fmax(tile_max, s[i][j]);
      }
      if (shuffles) {
        for (int x = 1; x < TC; x <<= 1) tile_max = fmax(tile_max, SG_SHUFFLE_XOR(tile_max, x));
        row_max[i] = tile_max;
      } else {
        Rmax[(tr * RM + i) * TC + tc] = tile_max;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* row maxima are complete; every S is computed, so K may go */

    float alpha[RM];
    for (int i = 0; i < RM; ++i) {
      const int r = tr * RM + i;
      float m_new = m[i];
      if (shuffles) m_new = fmax(m_new, row_max[i]);
      else
        for (int t = 0; t < TC; ++t) m_new = fmax(m_new, Rmax[r * TC + t]);
      /* A row that has seen no visible key yet keeps m = -inf; subtract 0 instead so no NaN appears. */
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[i] = exp2(m[i] - m_use);
      m[i] = m_new;
      float part = 0.0f;
      for (int j = 0; j < RN; ++j) {
        const float p = exp2(s[i][j] - m_use);
        Ps[r * PS + tc + j * TC] = p;
        part += p;
      }
      /* A butterfly: every work-item of the row ends with the same sum, the additions paired alike. */
      if (shuffles) {
        for (int x = 1; x < TC; x <<= 1) part += SG_SHUFFLE_XOR(part, x);
        row_sum[i] = part;
      } else {
        Rsum[r * TC + tc] = part;
      }
    }
#if !DIRECT
    LOAD_KEY_TILE(KVs, v, v_sb, v_sn, seq, page, k0, BC);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int i = 0; i < RM; ++i) {
      const int r = tr * RM + i;
      float sum = 0.0f;
      if (shuffles) sum = row_sum[i];
      else
        for (int t = 0; t < TC; ++t) sum += Rsum[r * TC + t];
      l[i] = l[i] * alpha[i] + sum;
      for (int n = 0; n < DN; ++n) acc[i][n] *= alpha[i];
    }
    for (int c4 = 0; c4 < BC / 4; ++c4) {
      float4 p4[RM];
      for (int i = 0; i < RM; ++i) p4[i] = Ps4[(tr * RM + i) * (PS / 4) + c4];
      for (int cc = 0; cc < 4; ++cc) {
        const int c = c4 * 4 + cc;
        float vc[DN];
#if DIRECT
        {
          const long off = FCL_KEY_ROW(page, c, k0 + c, nk, v_sb, v_sn);
          for (int n = 0; n < DN; ++n) vc[n] = tc + n * TC < D ? FCL_KEY_LOAD(v, off, tc + n * TC) : 0.0f;
        }
#else
        for (int n = 0; n < DN; ++n) vc[n] = KVs[c * DS + tc + n * TC];
#endif
        for (int i = 0; i < RM; ++i) {
          const float p = cc == 0 ? p4[i].x : cc == 1 ? p4[i].y : cc == 2 ? p4[i].z : p4[i].w;
          if (!guard || p != 0.0f)
            for (int n = 0; n < DN; ++n) acc[i][n] = fma(p, vc[n], acc[i][n]);
        }
      }
    }
  }

  for (int i = 0; i < RM; ++i) {
    const int row = q0 + tr * RM + i;
    if (row >= nrows) continue;
    const int hr = ROW_HEAD(row), qi = ROW_I(row); /* the row's head and query row */
#if SPLIT
    /* A chunk's partial result, in rows padded to nq_max; the combine adds the sink and normalises across
       chunks. */
    const long prow = (((long)split * get_num_groups(2) + b) * num_heads + hr) * nq_max + qi;
    const float pinv = seq.bad ? NAN : l[i] == 0.0f ? 0.0f : 1.0f / l[i];
    for (int n = 0; n < DN; ++n) {
      const int c = tc + n * TC;
      if (c < D) part_o[prow * D + c] = acc[i][n] * pinv;
    }
    if (tc == 0) part_o[part_lse_off + prow] = seq.bad ? NAN : l[i] == 0.0f ? -INFINITY : (m[i] + log2(l[i])) * FCL_LN2;
    continue;
#endif
#if SINKS
    /* The sink joins the denominator once: l' = l 2^(m - m') + 2^(sink - m'), m' = max(m, sink). */
    const float sink = FCL_SINK(hr), mf = fmax(m[i], sink);
    if (mf != -INFINITY) {
      const float c = exp2(m[i] - mf);
      l[i] = l[i] * c + exp2(sink - mf);
      for (int n = 0; n < DN; ++n) acc[i][n] *= c;
      m[i] = mf;
    }
#endif
    /* l is 0 only for a row that saw nothing (O = 0, lse = -inf); NaN inputs stay NaN in O and lse, and a
       sequence whose key indices did not fit gets NaN. */
    const float inv = seq.bad ? NAN : l[i] == 0.0f ? 0.0f : 1.0f / l[i];
    for (int n = 0; n < DN; ++n) {
      const int c = tc + n * TC;
      if (c < D) STORE(o, ROW_OFF(row, o_sh, o_sn) + c, acc[i][n] * inv);
    }
    const long lse_row = fcl_lse_base(&seq, b, hr, num_heads, nq_max, total_q);
    if (lse && tc == 0)
      lse[lse_row + qi] = seq.bad ? NAN : l[i] == 0.0f ? -INFINITY : (m[i] + log2(l[i])) * FCL_LN2;
  }
}
