/* Prototype (not part of the library; docs/notes-portable.md v9): the f32 forward on NVIDIA tensor cores
 * through mma.sync m16n8k8 with TF32 operands, each product done as three (3xTF32: x = big + small with
 * big = tf32(x), small = tf32(x - big); a b ~ big_a big_b + big_a small_b + small_a big_b), the arithmetic
 * PyTorch's fp32 memory-efficient kernel uses on this card. SPLIT3 0 does one TF32 product instead, to show
 * what the split buys. bench/nv_dev/tf32_bench.c builds it after cl/nvidia/ptx.cl (with -DDTYPE=1, which only
 * satisfies ptx.cl's guard: everything here is float), checks it against a float64 reference and times it.
 *
 * q, k, v, o: float [B*H][N][D], contiguous; lse float [B*H][N] (natural log). Not causal or causal
 * (CAUSAL 1, seqlen_q = seqlen_k). A work-group of NW warps owns BR = 16 NW query rows of one (batch, head);
 * a warp's Q fragments stay in registers as floats and are split once a key tile. K(j) and V(j) tiles of BC
 * keys go through two local buffers with cp.async: V(j) loads while S = Q K(j)^T is computed, K(j+1) while
 * O += P V(j) is.
 *
 * Fragments (lane = 4 g + t). m16n8k8 TF32 A (16 x 8): a0 (row g, col t), a1 (g + 8, t), a2 (g, t + 4),
 * a3 (g + 8, t + 4); B (8 x 8, k x n): b0 (k t, n g), b1 (k t + 4, n g); accumulators c0 c1 at row g, columns
 * 2t and 2t + 1, c2 c3 at row g + 8. For P V the keys of an 8-key step are taken in the order 0 2 4 6 1 3 5 7
 * (k = t is key 2t, k = t + 4 is key 2t + 1), so the S accumulator is the A operand as it stands (a0 = c0,
 * a1 = c2, a2 = c1, a3 = c3) and V's b0, b1 come from key rows 2t and 2t + 1.
 *
 * Local rows are DS = D + 4 floats apart (4 modulo 32 words): K reads (row g, word t) and V reads (row 2t,
 * word g) of a warp fall in 32 distinct banks.
 *
 * Defines: D (a multiple of 8), NW, BC (a multiple of 8), CAUSAL, SPLIT3.
 */
#define WG (NW * 32)
#define BR (NW * 16)
#define DS (D + 4)
#define KT (D / 8)  /* k steps of Q K^T */
#define NT (BC / 8) /* n8 tiles of S, and k steps of P V */
#define OT (D / 8)  /* n8 tiles of O */
#define CH (D / 4)  /* 16-byte chunks of a row */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#if D % 8 != 0 || BC % 8 != 0
#error "tf32_fwd: D and BC must be multiples of 8"
#endif

inline uint tf32(float x) {
  uint r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

/* big and small TF32 parts of x (small = 0 without SPLIT3). */
#define TF32_SPLIT(big, small, x)                     \
  do {                                           \
    const float x_ = (x);                        \
    (big) = tf32(x_);                            \
    (small) = SPLIT3 ? tf32(x_ - as_float(big)) : 0u; \
  } while (0)

#define MMA8(c, a0, a1, a2, a3, b0, b1)                                                             \
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
      "{%0,%1,%2,%3};\n"                                                                           \
      : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                                      \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

/* c += a b in 3xTF32 (the small products first), or 1xTF32. */
#define MMA3(c, ab, as, bb0, bb1, bs0, bs1)                                   \
  do {                                                                        \
    if (SPLIT3) {                                                             \
      MMA8(c, ab[0], ab[1], ab[2], ab[3], bs0, bs1);                          \
      MMA8(c, as[0], as[1], as[2], as[3], bb0, bb1);                          \
    }                                                                         \
    MMA8(c, ab[0], ab[1], ab[2], ab[3], bb0, bb1);                            \
  } while (0)

/* Key rows k0.. of one (batch, head) into a local tile [BC][DS], zero beyond n; one commit group. */
inline void load_tile(__local float *dst, __global const float *src, int k0, int n, int lid) {
  for (int c = lid; c < BC * CH; c += WG) {
    const int r = c / CH, cc = c % CH;
    const bool ok = k0 + r < n;
    CP_ASYNC16(dst + r * DS + cc * 4, ok ? src + (long)(k0 + r) * D + cc * 4 : src, ok ? 16 : 0);
  }
  CP_ASYNC_COMMIT();
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void tf32_fwd(__global const float *q, __global const float *k, __global const float *v, __global float *o,
              __global float *lse, int n, float scale) {
  __local float4 smem[2 * BC * DS / 4]; /* float4: 16-byte aligned for cp.async */
  __local float *Ks = (__local float *)smem, *Vs = Ks + BC * DS;
  const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane / 4, t = lane % 4;
  const int r0 = get_group_id(0) * BR, bh = get_group_id(1);
  const long base = (long)bh * n * D;
  __global const float *kb = k + base, *vb = v + base;

  /* Keys this block sees: all, or up to its last row. */
  const int kend = CAUSAL ? min(n, r0 + BR) : n;
  const int tiles = (kend + BC - 1) / BC;
  if (tiles > 0) {
    load_tile(Ks, kb, 0, n, lid);
    load_tile(Vs, vb, 0, n, lid);
  }

  /* This warp's Q fragments, raw floats (rows beyond n read as 0). */
  const int qr = r0 + warp * 16 + g; /* rows qr and qr + 8 */
  float qf[KT][4];
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    qf[kk][0] = qr < n ? q[base + (long)qr * D + 8 * kk + t] : 0.0f;
    qf[kk][1] = qr + 8 < n ? q[base + (long)(qr + 8) * D + 8 * kk + t] : 0.0f;
    qf[kk][2] = qr < n ? q[base + (long)qr * D + 8 * kk + t + 4] : 0.0f;
    qf[kk][3] = qr + 8 < n ? q[base + (long)(qr + 8) * D + 8 * kk + t + 4] : 0.0f;
  }

  const float sl2 = scale * LOG2E;
  float oc[OT][4];
#pragma unroll
  for (int i = 0; i < OT; ++i) oc[i][0] = oc[i][1] = oc[i][2] = oc[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * BC;
    /* K(j) has landed (V(j) may still be in flight). */
    CP_ASYNC_WAIT_GROUP(1);
    barrier(CLK_LOCAL_MEM_FENCE);
    float s[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint ab[4], as[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) TF32_SPLIT(ab[e], as[e], qf[kk][e]);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        __local const float *kr = Ks + (8 * i + g) * DS + 8 * kk + t;
        uint bb0, bs0, bb1, bs1;
        TF32_SPLIT(bb0, bs0, kr[0]);
        TF32_SPLIT(bb1, bs1, kr[4]);
        MMA3(s[i], ab, as, bb0, bb1, bs0, bs1);
      }
    }
    /* Every warp is done with K(j): K(j + 1) into its buffer (an empty group past the last tile keeps the
       count of pending groups the same). */
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j + 1 < tiles) load_tile(Ks, kb, k0 + BC, n, lid);
    else CP_ASYNC_COMMIT();

    /* Online softmax in the accumulator layout: hr 0 is row qr, hr 1 row qr + 8. */
    float alpha[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = qr + 8 * hr;
      float mx = m[hr];
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = k0 + 8 * i + 2 * t + c;
          float x = s[i][2 * hr + c] * sl2;
          if (key >= n || (CAUSAL && key > row)) x = -INFINITY;
          s[i][2 * hr + c] = x;
          mx = fmax(mx, x);
        }
      mx = fmax(mx, fcl_shfl_xor1(mx));
      mx = fmax(mx, fcl_shfl_xor2(mx));
      /* A row that has seen no key yet keeps m = -inf; its P are 0. */
      const float mu = mx == -INFINITY ? 0.0f : mx;
      alpha[hr] = exp2(m[hr] - mu);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = exp2(s[i][2 * hr + c] - mu);
          s[i][2 * hr + c] = p;
          sum += p;
        }
      sum += fcl_shfl_xor1(sum);
      sum += fcl_shfl_xor2(sum);
      l[hr] = l[hr] * alpha[hr] + sum;
      m[hr] = mx;
    }
#pragma unroll
    for (int i = 0; i < OT; ++i) {
      oc[i][0] *= alpha[0], oc[i][1] *= alpha[0];
      oc[i][2] *= alpha[1], oc[i][3] *= alpha[1];
    }

    /* V(j) has landed (K(j + 1) may still be in flight). */
    CP_ASYNC_WAIT_GROUP(1);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int ks = 0; ks < NT; ++ks) {
      uint ab[4], as[4];
      TF32_SPLIT(ab[0], as[0], s[ks][0]); /* row g, key 2t */
      TF32_SPLIT(ab[1], as[1], s[ks][2]); /* row g + 8, key 2t */
      TF32_SPLIT(ab[2], as[2], s[ks][1]); /* row g, key 2t + 1 */
      TF32_SPLIT(ab[3], as[3], s[ks][3]); /* row g + 8, key 2t + 1 */
      __local const float *vr = Vs + (8 * ks + 2 * t) * DS + g;
#pragma unroll
      for (int i = 0; i < OT; ++i) {
        uint bb0, bs0, bb1, bs1;
        TF32_SPLIT(bb0, bs0, vr[8 * i]);
        TF32_SPLIT(bb1, bs1, vr[DS + 8 * i]);
        MMA3(oc[i], ab, as, bb0, bb1, bs0, bs1);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j + 1 < tiles) load_tile(Vs, vb, k0 + BC, n, lid);
    else CP_ASYNC_COMMIT();
  }
  CP_ASYNC_WAIT_GROUP(0);

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = qr + 8 * hr;
    if (row >= n) continue;
    const float inv = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
#pragma unroll
    for (int i = 0; i < OT; ++i) {
      __global float *dst = o + base + (long)row * D + 8 * i + 2 * t;
      dst[0] = oc[i][2 * hr] * inv;
      dst[1] = oc[i][2 * hr + 1] * inv;
    }
    if (t == 0) lse[(long)bh * n + row] = l[hr] > 0.0f ? (m[hr] + log2(l[hr])) * LN2 : -INFINITY;
  }
}
