/* Portable FlashAttention-2 forward with head_dim streamed in chunks.
 *
 * The same algorithm as flash_fwd.cl, for devices whose local memory cannot hold a large Q tile at full
 * head_dim (48 KiB GPUs at head_dim 128 in float): instead of keeping Q resident, S = Q K^T is
 * accumulated over chunks of DK columns of head_dim, each chunk of Q and K brought into local memory
 * together (Q is re-read from the cache-resident global copy per key tile), and V arrives in chunks of
 * VR rows. That frees room for larger per-work-item register tiles (RM x RN of S, RM x DN of O), which
 * is what keeps the arithmetic ahead of local-memory traffic.
 *
 * Work-item (tr, tc) owns rows tr*RM.. of S and O, key columns tc, tc+TC, .. of S, and output
 * columns tc, tc+TC, .. of O. Defines (plan.c): D, DP (D padded to a multiple of DK and TC), DK, VR,
 * BR, BC, TR, TC, RM, RN, DN. Tails beyond seqlen_q, seqlen_k and D are zero-filled in local memory and
 * never written back.
 */
#define WG (TR * TC)
#define KS (DK + 4)                       /* Q/K chunk row stride: 4 mod 8 floats, banks staggered */
#define VS (DP % 8 == 0 ? DP + 4 : DP)    /* V chunk row stride */
#define PS (BC + 4)                       /* P row stride */
#define QK_FLOATS ((BR + BC) * KS)
#define V_FLOATS (VR * VS)
#define REGION_FLOATS (QK_FLOATS > V_FLOATS ? QK_FLOATS : V_FLOATS)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_fwd_chunked(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                       __global store_t *o, __global float *lse,
                       long q_off, long q_sb, long q_sh, long q_sn,
                       long k_off, long k_sb, long k_sh, long k_sn,
                       long v_off, long v_sb, long v_sh, long v_sn,
                       long o_off, long o_sb, long o_sh, long o_sn,
                       int num_heads, int group, int nq, int nk, int causal, float scale) {
  /* One region holds either the Q and K chunks or a V chunk: they are never needed at once. */
  __local float4 region4[(REGION_FLOATS + 3) / 4];
  __local float4 Ps4[BR * PS / 4];
  __local float Rmax[BR * TC];
  __local float Rsum[BR * TC];
  __local float *Qc = (__local float *)region4;
  __local float *Kc = Qc + BR * KS;
  __local float *Vc = (__local float *)region4;
  __local float4 *Qc4 = region4;
  __local float4 *Kc4 = region4 + BR * KS / 4;
  __local float *Ps = (__local float *)Ps4;

  const int lid = get_local_id(0);
  const int tc = lid % TC;
  const int tr = lid / TC;
  /* Last query block first: under a causal mask it has the most keys. */
  const int q0 = (get_num_groups(0) - 1 - get_group_id(0)) * BR;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  q += q_off + b * q_sb + h * q_sh;
  k += k_off + b * k_sb + hk * k_sh;
  v += v_off + b * v_sb + hk * v_sh;
  o += o_off + b * o_sb + h * o_sh;
  const float qscale = scale * FCL_LOG2E; /* S in log2 units for exp2 */

  float m[RM], l[RM], acc[RM][DN];
  for (int i = 0; i < RM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (int n = 0; n < DN; ++n) acc[i][n] = 0.0f;
  }

  const int diag = nk - nq;
  const int kv_end = causal ? clamp(q0 + BR + diag, 0, nk) : nk;

  for (int k0 = 0; k0 < kv_end; k0 += BC) {
    float s[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) s[i][j] = 0.0f;

    for (int d0 = 0; d0 < DP; d0 += DK) {
      barrier(CLK_LOCAL_MEM_FENCE); /* the region's previous readers are done */
      for (int i = lid; i < (BR + BC) * DK; i += WG) {
        const int r = i / DK, c = i % DK, col = d0 + c;
        float x = 0.0f;
        if (r < BR) {
          if (q0 + r < nq && col < D) x = LOAD(q, (q0 + r) * q_sn + col) * qscale;
        } else if (k0 + r - BR < nk && col < D) {
          x = LOAD(k, (k0 + r - BR) * k_sn + col);
        }
        Qc[r * KS + c] = x; /* Kc follows Qc, so row r >= BR is K row r - BR */
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int d4 = 0; d4 < DK / 4; ++d4) {
        float4 kd[RN];
        for (int j = 0; j < RN; ++j) kd[j] = Kc4[(tc + j * TC) * (KS / 4) + d4];
        for (int i = 0; i < RM; ++i) {
          const float4 qd = Qc4[(tr * RM + i) * (KS / 4) + d4];
          for (int j = 0; j < RN; ++j) {
            s[i][j] = fma(qd.x, kd[j].x, s[i][j]);
            s[i][j] = fma(qd.y, kd[j].y, s[i][j]);
            s[i][j] = fma(qd.z, kd[j].z, s[i][j]);
            s[i][j] = fma(qd.w, kd[j].w, s[i][j]);
          }
        }
      }
    }

    for (int i = 0; i < RM; ++i) {
      const int row = q0 + tr * RM + i;
      float tile_max = -INFINITY;
      for (int j = 0; j < RN; ++j) {
        const int col = k0 + tc + j * TC;
        const bool visible = col < nk && (!causal || col <= row + diag);
        s[i][j] = visible ? s[i][j] : -INFINITY;
        tile_max = fmax(tile_max, s[i][j]);
      }
      Rmax[(tr * RM + i) * TC + tc] = tile_max;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* row maxima complete; the Q/K chunks are no longer read */

    for (int i = 0; i < RM; ++i) {
      const int r = tr * RM + i;
      float m_new = m[i];
      for (int t = 0; t < TC; ++t) m_new = fmax(m_new, Rmax[r * TC + t]);
      /* A row that has seen no visible key keeps m = -inf; subtract 0 instead so no NaN appears. */
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2(m[i] - m_use);
      m[i] = m_new;
      float part = 0.0f;
      for (int j = 0; j < RN; ++j) {
        const float p = exp2(s[i][j] - m_use);
        Ps[r * PS + tc + j * TC] = p;
        part += p;
      }
      Rsum[r * TC + tc] = part;
      l[i] *= alpha;
      for (int n = 0; n < DN; ++n) acc[i][n] *= alpha;
    }

    for (int c0 = 0; c0 < BC; c0 += VR) {
      if (c0 > 0) barrier(CLK_LOCAL_MEM_FENCE); /* the previous V chunk is consumed */
      for (int i = lid; i < VR * DP; i += WG) {
        const int r = i / DP, c = i % DP;
        Vc[r * VS + c] = (k0 + c0 + r < nk && c < D) ? LOAD(v, (k0 + c0 + r) * v_sn + c) : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE); /* V chunk, and on the first chunk P and the row sums, complete */
      if (c0 == 0) {
        for (int i = 0; i < RM; ++i) {
          float sum = 0.0f;
          for (int t = 0; t < TC; ++t) sum += Rsum[(tr * RM + i) * TC + t];
          l[i] += sum;
        }
      }
      for (int c4 = 0; c4 < VR / 4; ++c4) {
        float4 p4[RM];
        for (int i = 0; i < RM; ++i) p4[i] = Ps4[(tr * RM + i) * (PS / 4) + (c0 / 4) + c4];
        for (int cc = 0; cc < 4; ++cc) {
          const int c = c4 * 4 + cc;
          float vc[DN];
          for (int n = 0; n < DN; ++n) vc[n] = Vc[c * VS + tc + n * TC];
          for (int i = 0; i < RM; ++i) {
            const float p = cc == 0 ? p4[i].x : cc == 1 ? p4[i].y : cc == 2 ? p4[i].z : p4[i].w;
            for (int n = 0; n < DN; ++n) acc[i][n] = fma(p, vc[n], acc[i][n]);
          }
        }
      }
    }
  }

  for (int i = 0; i < RM; ++i) {
    const int row = q0 + tr * RM + i;
    if (row >= nq) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int n = 0; n < DN; ++n) {
      const int c = tc + n * TC;
      if (c < D) STORE(o, row * o_sn + c, acc[i][n] * inv);
    }
    if (lse && tc == 0)
      lse[((long)b * num_heads + h) * nq + row] = l[i] > 0.0f ? (m[i] + log2(l[i])) * FCL_LN2 : -INFINITY;
  }
}
