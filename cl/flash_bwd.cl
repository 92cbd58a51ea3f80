/* Portable FlashAttention-2 backward: three kernels, one built per program (BWD_KIND selects it).
 *
 *   BWD_KIND 0  flash_bwd_pre   Dvec[row] = rowsum(dO * O), float32, `lanes` work-items per query row.
 *   BWD_KIND 1  flash_bwd_dkdv  one work-group owns BM = TR*RM key rows of one (batch, kv head) and keeps
 *                               K, V in local memory and dK, dV in registers; for each query head of the
 *                               kv head's group in order, it streams BN = TC*RN query rows of Q and dO,
 *                               recomputes P = exp(scale QK^T - lse), and accumulates dV += P^T dO and
 *                               dK += scale dS^T Q with dS = P * (dO V^T - Dvec). dK and dV are written once.
 *   BWD_KIND 2  flash_bwd_dq    one work-group owns BM = TR*RM query rows of one (batch, head) and keeps Q,
 *                               dO in local memory and dQ in registers; it streams BN = TC*RN key rows of
 *                               K and V, recomputes P and dS, and accumulates dQ += scale dS K.
 *   BWD_KIND 3  flash_bwd_dsinks d_sinks[h] = -sum over batches and rows of Dvec * exp(sink[h] - lse), one
 *                               work-group of WG (a power of two) work-items per head, in a fixed order.
 *
 * No atomics: every gradient element is summed by one work-item in a fixed order, so results are
 * bitwise reproducible. Work-item (tr, tc) of the TR x TC grid computes S and dP for owned rows tr*RM..
 * and streamed columns tc, tc+TC, .., and accumulates owned rows tr*RM.. at head_dim columns tc, tc+TC, ..
 * (DN of them). Hidden entries (beyond the lengths, outside the window) get P = 0 and are left out of the
 * sums (so a NaN in a row they hide cannot reach a gradient), and a query row that sees no key
 * (lse = -inf) contributes nothing and gets dQ = 0. Score modifiers come from common.cl's mask layer; a
 * softcap multiplies dS by its derivative 1 - tanh^2.
 *
 * S and dP read Q, dO, K, V rows four floats at a time; the accumulation reads P and dS rows four at a time.
 *
 * Sequences (common.cl's FCL_SEQ_INIT: packed queries, packed or dense keys, per-sequence key counts): each
 * work-group takes its sequence's lengths, rows and alignment. Untrusted indices follow the forward's rules
 * (docs/api.md): a sequence with bad cu_q entries writes no dQ (its rows are unknown), one with bad cu_k or
 * seqlens_k entries gets NaN dQ; the dK, dV rows a sequence owns get NaN when any of its indices is bad, and
 * are not written when its own cu_k entries are (unknown rows); d_sinks is NaN when any sequence is bad.
 * The pre-pass needs none of it: with VARLEN_Q the host runs it over the total_q packed rows as one batch.
 *
 * Defines (plan_backward.c): D head_dim; DP, D padded to a multiple of TC and of 4; DS, the local row
 * stride (a multiple of 4, and 4 mod 8 where room allows, so consecutive rows' float4s fall in distinct
 * banks); TR, TC, RM, RN, DN; BN = TC*RN is a multiple of 4. Tails are zero-filled in local memory and
 * never written back.
 */
#ifndef BWD_KIND
#error "BWD_KIND must be defined"
#endif

#if BWD_KIND == 0

/* A row's `lanes` work-items (a power of two dividing the work-group of at most PRE_MAX_WG, a host define) read
   neighbouring elements, so that a warp's loads cover whole rows rather than one element of 32 rows, and each sums
   the columns c = lane (mod lanes); the row's first adds those partial sums in lane order, so Dvec is
   reproducible. */
__kernel void flash_bwd_pre(__global const store_t *o, __global const store_t *d_o, __global float *dvec,
                            long o_off, long o_sb, long o_sh, long o_sn, int num_heads, int nq, int lanes) {
  __local float part[PRE_MAX_WG];
  const int lid = get_local_id(0), lane = lid % lanes;
  const int row = get_group_id(0) * ((int)get_local_size(0) / lanes) + lid / lanes;
  const int h = get_global_id(1);
  const int b = get_global_id(2);
  float acc = 0.0f;
  if (row < nq) {
    const long base = o_off + b * o_sb + h * o_sh + row * o_sn;
    for (int c = lane; c < D; c += lanes) acc = fma(LOAD(o, base + c), LOAD(d_o, base + c), acc);
  }
  part[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lane == 0 && row < nq) {
    float sum = part[lid];
    for (int i = 1; i < lanes; ++i) sum += part[lid + i];
    dvec[((long)b * num_heads + h) * nq + row] = sum;
  }
}

#elif BWD_KIND == 3

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_bwd_dsinks(__global const float *lse, __global const float *dvec, __global const float *sinks,
                      __global float *d_sinks, int num_heads, int batch, int nq_max, int nk_max, FCL_SEQ_ARGS) {
  __local float part[WG];
  const int lid = get_local_id(0);
  const int h = get_group_id(0);
  const float sink = sinks[h];
  float acc = 0.0f;
  /* Packed offsets that ever decrease leave some sequence untrusted (FCL_SEQ_INIT): checked once here. */
  bool bad = (VARLEN_Q && !fcl_sorted_prefix(cu_q, batch)) || (KV == 1 && !fcl_sorted_prefix(cu_k, batch));
  for (int b = 0; b < batch; ++b) {
    fcl_seq seq;
    FCL_SEQ_INIT_FROM(seq, b, nq_max, nk_max, false);
    /* A sequence whose indices did not fit has an unknown share of the sum. */
    bad |= seq.bad || seq.skip;
    const long base = fcl_lse_base(&seq, b, h, num_heads, nq_max, total_q);
    for (int r = lid; r < (seq.bad ? 0 : seq.nq); r += WG) {
      const float l = lse[base + r];
      /* A row whose lse is -inf saw no key and no finite sink: it contributes nothing. */
      if (l != -INFINITY) acc = fma(dvec[base + r], exp(sink - l), acc);
    }
  }
  part[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int span = WG / 2; span > 0; span >>= 1) {
    if (lid < span) part[lid] += part[lid + span];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) d_sinks[h] = bad ? NAN : -part[0];
}

#else

#define WG (TR * TC)
#define BM (TR * RM) /* rows a work-group owns */
#define BN (TC * RN) /* rows streamed per step */
#define PS (BN + 4)  /* row stride of the P / dS tiles: a multiple of 4 that staggers rows across banks */
#define DS4 (DS / 4)
#define PS4 (PS / 4)

/* s += a . b over four floats. */
#define DOT4(s, a, b) (s) = fma((a).w, (b).w, fma((a).z, (b).z, fma((a).y, (b).y, fma((a).x, (b).x, (s)))))
#define LANE(v, cc) ((cc) == 0 ? (v).x : (cc) == 1 ? (v).y : (cc) == 2 ? (v).z : (v).w)

/* P and dS of one (row, key) through the mask layer (common.cl's FCL_P_DS). The kernel defines mods, qk_scale,
   nq and nk. */
#define BWD_P_DS(p_out, ds_out, s, dp, row, key, L, D) FCL_P_DS(p_out, ds_out, &mods, s, dp, row, key, L, D, exp2)

#if BWD_KIND == 1

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_bwd_dkdv(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                    __global const store_t *d_o, __global const float *lse, __global const float *dvec,
                    __global store_t *d_k, __global store_t *d_v,
                    long q_off, long q_sb, long q_sh, long q_sn,
                    long k_off, long k_sb, long k_sh, long k_sn,
                    long v_off, long v_sb, long v_sh, long v_sn,
                    long o_off, long o_sb, long o_sh, long o_sn,
                    int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS) {
  __local float4 Ks4[BM * DS4];
  __local float4 Vs4[BM * DS4];
  __local float4 Qs4[BN * DS4];
  __local float4 dOs4[BN * DS4];
  __local float4 Pt4[BM * PS4];  /* P^T: [key][query] */
  __local float4 dSt4[BM * PS4]; /* dS^T */
  __local float Ls[BN];          /* lse * log2(e) of the streamed rows */
  __local float Ds[BN];          /* Dvec of the streamed rows */
  __local float *Ks = (__local float *)Ks4;
  __local float *Vs = (__local float *)Vs4;
  __local float *Qs = (__local float *)Qs4;
  __local float *dOs = (__local float *)dOs4;
  __local float *Pt = (__local float *)Pt4;
  __local float *dSt = (__local float *)dSt4;

  const int lid = get_local_id(0);
  const int tc = lid % TC;
  const int tr = lid / TC;
  const int k0 = get_group_id(0) * BM; /* causal: the first key blocks are seen by the most queries */
  const int hk = get_group_id(1);
  const int b = get_group_id(2);

  /* This sequence's lengths and rows (common.cl); a block past the key rows it owns has nothing to write.
     Its rows from nk to k_rows (beyond seqlens_k) get zero gradients. */
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq_max, nk_max);
  if (k0 >= seq.k_rows) return;
  const int nq = seq.nq, nk = seq.nk;
  /* Any bad index of the sequence: its dK, dV rows are NaN, and nothing is computed. */
  const bool poisoned = seq.bad || seq.skip;
  const long kbase = fcl_key_base(&seq, b, hk, k_off, k_sb, k_sh, k_sn);
  const long vbase = fcl_key_base(&seq, b, hk, v_off, v_sb, v_sh, v_sn);
  LOAD_TILE(Ks, k + kbase, k_sn, k0, BM, nk, 1.0f);
  LOAD_TILE(Vs, v + vbase, v_sn, k0, BM, nk, 1.0f);

  float dk[RM][DN], dv[RM][DN];
  for (int i = 0; i < RM; ++i)
    for (int n = 0; n < DN; ++n) dk[i][n] = dv[i][n] = 0.0f;

  const float qk_scale = scale * FCL_LOG2E;

  for (int g = 0; g < (poisoned || k0 >= nk ? 0 : group); ++g) {
    const int h = hk * group + g;
    /* The query rows that see some key of the block: the rest of the rows are never loaded. */
    fcl_mods mods;
    FCL_MODS_INIT(mods, b, h, nq, nk);
    const int q_begin = fcl_row_begin(&mods, k0), q_end = fcl_row_end(&mods, min(k0 + BM, nk) - 1, nq);
    __global const store_t *qh = q + fcl_query_base(&seq, b, h, q_off, q_sb, q_sh, q_sn);
    __global const store_t *doh = d_o + fcl_query_base(&seq, b, h, o_off, o_sb, o_sh, o_sn);
    const long lbase = fcl_lse_base(&seq, b, h, num_heads, nq_max, total_q);
    for (int q0 = q_begin; q0 < q_end; q0 += BN) {
      barrier(CLK_LOCAL_MEM_FENCE); /* the previous step is done with Qs, dOs, Pt, dSt */
      LOAD_TILE(Qs, qh, q_sn, q0, BN, nq, 1.0f);
      LOAD_TILE(dOs, doh, o_sn, q0, BN, nq, 1.0f);
      for (int r = lid; r < BN; r += WG) {
        const bool in = q0 + r < nq;
        Ls[r] = in ? lse[lbase + q0 + r] * FCL_LOG2E : 0.0f;
        Ds[r] = in ? dvec[lbase + q0 + r] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE);

      /* S^T = K Q^T and dP^T = V dO^T for this work-item's keys and queries. */
      float s[RM][RN], dp[RM][RN];
      for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) s[i][j] = dp[i][j] = 0.0f;
      for (int d4 = 0; d4 < DP / 4; ++d4) {
        float4 qd[RN], od[RN];
        for (int j = 0; j < RN; ++j) {
          qd[j] = Qs4[(tc + j * TC) * DS4 + d4];
          od[j] = dOs4[(tc + j * TC) * DS4 + d4];
        }
        for (int i = 0; i < RM; ++i) {
          const float4 kd = Ks4[(tr * RM + i) * DS4 + d4];
          const float4 vd = Vs4[(tr * RM + i) * DS4 + d4];
          for (int j = 0; j < RN; ++j) {
            DOT4(s[i][j], kd, qd[j]);
            DOT4(dp[i][j], vd, od[j]);
          }
        }
      }
      for (int i = 0; i < RM; ++i) {
        const int key = k0 + tr * RM + i;
        for (int j = 0; j < RN; ++j) {
          const int c = tc + j * TC;
          const int row = q0 + c;
          BWD_P_DS(Pt[(tr * RM + i) * PS + c], dSt[(tr * RM + i) * PS + c], s[i][j], dp[i][j], row, key, Ls[c], Ds[c]);
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);

      /* dV += P^T dO, dK += dS^T Q (scale applied once at the end). */
      for (int c4 = 0; c4 < BN / 4; ++c4) {
        float4 p4[RM], ds4[RM];
        for (int i = 0; i < RM; ++i) {
          p4[i] = Pt4[(tr * RM + i) * PS4 + c4];
          ds4[i] = dSt4[(tr * RM + i) * PS4 + c4];
        }
        for (int cc = 0; cc < 4; ++cc) {
          const int c = c4 * 4 + cc;
          float qc[DN], oc[DN];
          for (int n = 0; n < DN; ++n) {
            qc[n] = Qs[c * DS + tc + n * TC];
            oc[n] = dOs[c * DS + tc + n * TC];
          }
          for (int i = 0; i < RM; ++i) {
            const float p = LANE(p4[i], cc), ds = LANE(ds4[i], cc);
            if (p == 0.0f) continue; /* hidden (or negligible): left out, not multiplied by zero */
            for (int n = 0; n < DN; ++n) {
              dv[i][n] = fma(p, oc[n], dv[i][n]);
              dk[i][n] = fma(ds, qc[n], dk[i][n]);
            }
          }
        }
      }
    }
  }

  for (int i = 0; i < RM; ++i) {
    const int key = k0 + tr * RM + i;
    if (key >= seq.k_rows) continue;
    for (int n = 0; n < DN; ++n) {
      const int c = tc + n * TC;
      if (c < D) {
        STORE(d_k, kbase + key * k_sn + c, poisoned ? NAN : dk[i][n] * scale);
        STORE(d_v, vbase + key * v_sn + c, poisoned ? NAN : dv[i][n]);
      }
    }
  }
}

#elif BWD_KIND == 2

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_bwd_dq(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                  __global const store_t *d_o, __global const float *lse, __global const float *dvec,
                  __global store_t *d_q,
                  long q_off, long q_sb, long q_sh, long q_sn,
                  long k_off, long k_sb, long k_sh, long k_sn,
                  long v_off, long v_sb, long v_sh, long v_sn,
                  long o_off, long o_sb, long o_sh, long o_sn,
                  int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS) {
  __local float4 Qs4[BM * DS4];
  __local float4 dOs4[BM * DS4];
  __local float4 Ks4[BN * DS4];
  __local float4 Vs4[BN * DS4];
  __local float4 dSs4[BM * PS4]; /* dS: [query][key] */
  __local float Ls[BM];
  __local float Ds[BM];
  __local float *Qs = (__local float *)Qs4;
  __local float *dOs = (__local float *)dOs4;
  __local float *Ks = (__local float *)Ks4;
  __local float *Vs = (__local float *)Vs4;
  __local float *dSs = (__local float *)dSs4;

  const int lid = get_local_id(0);
  const int tc = lid % TC;
  const int tr = lid / TC;
  /* Causal: the last query blocks see the most keys, so they take the first group ids and start first. */
  const int q0 =
      (win_right < nq_max ? (int)get_num_groups(0) - 1 - (int)get_group_id(0) : (int)get_group_id(0)) * BM;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  /* This sequence's lengths and rows (common.cl); a block past its last query row has nothing to do (nor
     has any block of a sequence whose cu_q entries did not fit: nq is then 0). */
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq_max, nk_max);
  const int nq = seq.nq, nk = seq.nk;
  if (q0 >= nq) return;
  const long qbase = fcl_query_base(&seq, b, h, q_off, q_sb, q_sh, q_sn);
  __global const store_t *kh = k + fcl_key_base(&seq, b, hk, k_off, k_sb, k_sh, k_sn);
  __global const store_t *vh = v + fcl_key_base(&seq, b, hk, v_off, v_sb, v_sh, v_sn);
  const long lbase = fcl_lse_base(&seq, b, h, num_heads, nq_max, total_q);
  LOAD_TILE(Qs, q + qbase, q_sn, q0, BM, nq, 1.0f);
  LOAD_TILE(dOs, d_o + fcl_query_base(&seq, b, h, o_off, o_sb, o_sh, o_sn), o_sn, q0, BM, nq, 1.0f);
  for (int r = lid; r < BM; r += WG) {
    const bool in = q0 + r < nq;
    Ls[r] = in ? lse[lbase + q0 + r] * FCL_LOG2E : 0.0f;
    Ds[r] = in ? dvec[lbase + q0 + r] : 0.0f;
  }

  float acc[RM][DN];
  for (int i = 0; i < RM; ++i)
    for (int n = 0; n < DN; ++n) acc[i][n] = 0.0f;

  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, nq, nk);
  /* A sequence whose key indices did not fit computes nothing and gets NaN dQ. */
  const int kv_begin = fcl_key_begin(&mods, q0);
  const int kv_end = seq.bad ? kv_begin : fcl_key_end(&mods, min(q0 + BM, nq) - 1, nk);
  const float qk_scale = scale * FCL_LOG2E;

  for (int k0 = kv_begin; k0 < kv_end; k0 += BN) {
    barrier(CLK_LOCAL_MEM_FENCE); /* Qs, dOs, Ls, Ds are loaded; the previous step is done with Ks, dSs */
    LOAD_TILE(Ks, kh, k_sn, k0, BN, nk, 1.0f);
    LOAD_TILE(Vs, vh, v_sn, k0, BN, nk, 1.0f);
    barrier(CLK_LOCAL_MEM_FENCE);

    float s[RM][RN], dp[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) s[i][j] = dp[i][j] = 0.0f;
    for (int d4 = 0; d4 < DP / 4; ++d4) {
      float4 kd[RN], vd[RN];
      for (int j = 0; j < RN; ++j) {
        kd[j] = Ks4[(tc + j * TC) * DS4 + d4];
        vd[j] = Vs4[(tc + j * TC) * DS4 + d4];
      }
      for (int i = 0; i < RM; ++i) {
        const float4 qd = Qs4[(tr * RM + i) * DS4 + d4];
        const float4 od = dOs4[(tr * RM + i) * DS4 + d4];
        for (int j = 0; j < RN; ++j) {
          DOT4(s[i][j], qd, kd[j]);
          DOT4(dp[i][j], od, vd[j]);
        }
      }
    }
    for (int i = 0; i < RM; ++i) {
      const int r = tr * RM + i;
      const int row = q0 + r;
      for (int j = 0; j < RN; ++j) {
        const int col = k0 + tc + j * TC;
        float p;
        BWD_P_DS(p, dSs[r * PS + tc + j * TC], s[i][j], dp[i][j], row, col, Ls[r], Ds[r]);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int c4 = 0; c4 < BN / 4; ++c4) {
      float4 ds4[RM];
      for (int i = 0; i < RM; ++i) ds4[i] = dSs4[(tr * RM + i) * PS4 + c4];
      for (int cc = 0; cc < 4; ++cc) {
        const int c = c4 * 4 + cc;
        float kc[DN];
        for (int n = 0; n < DN; ++n) kc[n] = Ks[c * DS + tc + n * TC];
        for (int i = 0; i < RM; ++i) {
          const float ds = LANE(ds4[i], cc);
          if (ds == 0.0f) continue; /* hidden (or negligible): left out, not multiplied by zero */
          for (int n = 0; n < DN; ++n) acc[i][n] = fma(ds, kc[n], acc[i][n]);
        }
      }
    }
  }

  for (int i = 0; i < RM; ++i) {
    const int row = q0 + tr * RM + i;
    if (row >= nq) continue;
    for (int n = 0; n < DN; ++n) {
      const int c = tc + n * TC;
      if (c < D) STORE(d_q, qbase + row * q_sn + c, seq.bad ? NAN : acc[i][n] * scale);
    }
  }
}

#endif
#endif
