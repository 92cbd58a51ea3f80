/* Tensor-core FlashAttention-2 backward for NVIDIA GPUs of compute capability 8.0 and up: the two heavy kernels
 * of the backward (cl/flash_bwd.cl keeps the pre-pass Dvec = rowsum(dO * O) and d_sinks), through inline PTX:
 * mma.sync m16n8k16 (f16 or bf16 operands, float accumulators), ldmatrix and cp.async, as
 * cl/nvidia/flash_fwd_mma.cl uses them; f32 (DTYPE 0) through mma.sync m16n8k8 as 3xTF32, see "f32" below. One
 * kernel per program (MMA_KIND selects it):
 *
 *   MMA_KIND 1  flash_bwd_dkdv_mma  a work-group of NW warps owns BM = NW * 16 QT key rows of one (batch, kv
 *                                   head); warp w owns keys 16 QT w on, whose K and V fragments it reads once into
 *                                   registers (or, KV_RESIDENT, at each step from K and V tiles kept in local
 *                                   memory, as FlashAttention-2 does); the query rows of every query head of
 *                                   the kv head's group stream through two local buffers of BN rows of Q and
 *                                   dO (cp.async: step s + 1 loads during step s), the second over the K and V
 *                                   tiles' space (KV_RESIDENT: K and V after both).
 *                                   Each warp computes S^T = K Q^T and dP^T = V dO^T with its keys as the mma
 *                                   rows, so P^T and dS^T come out in the accumulator layout with keys as rows:
 *                                   packed to f16/bf16 they are already the A operand of dV += P^T dO and
 *                                   dK += dS^T Q (no transpose through local memory, unlike FlashAttention-2,
 *                                   which computes S with queries as rows and reads P^T back with
 *                                   ldmatrix.trans). dK is scaled once at the end.
 *   MMA_KIND 2  flash_bwd_dq_mma    a work-group of NW warps owns BM = NW * 16 QT query rows of one (batch, head);
 *                                   Q and dO fragments live in registers (loaded once; with QT 2 above DP 64
 *                                   Q and dO rows in local memory instead, QLOCAL), K and V tiles of BN
 *                                   keys stream through two local buffers (cp.async, tile j + 1 during tile
 *                                   j); S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K with dS packed in
 *                                   registers as the A operand and K read with ldmatrix.trans.
 *
 * P = 2^(S scale log2(e) - lse log2(e)) through common.cl's mask layer (fcl_tile_masked decides whether a tile
 * needs the per-element test; with softcap, ALiBi or a mask every element goes through it), dS = P (dP - D),
 * times the softcap's derivative 1 - tanh^2. Rows beyond the lengths and columns beyond D are zero-filled in
 * local memory (cp.async with source size 0), so a tail query row of the dK/dV kernel has S = dP = 0, lse =
 * D = 0 there, P = 1 and contributes P dO = 0 and dS = 0; tail rows of the dQ kernel are never written.
 *
 * No atomics: every gradient element is summed by one lane in a fixed order, so the result is bitwise
 * reproducible. Hidden entries get P = dS = 0, but the tensor cores multiply them all the same, so a NaN or
 * inf in a Q, dO, K or V row that an entry hides reaches the accumulators as 0 * NaN. Finite inputs keep the
 * accumulators finite, so a warp whose accumulators are all finite goes on after one vote; otherwise each of
 * its rows (keys for dK/dV, query rows for dQ) with a non-finite accumulator is computed again in float32 from
 * global memory, adding only where P (dK/dV) or dS (dQ) is non-zero, as the portable kernels do: slow, and
 * taken only for non-finite inputs.
 *
 * GQA: the dK/dV work-group walks the (query head of its group, query block) pairs in order as one stream of
 * steps; the window's query range of its keys does not depend on the head. Sequences (common.cl's VARLEN_Q,
 * KV 1, SEQLENS_K) as in the portable backward; paged K/V (KV 2) is refused by the host. Untrusted indices:
 * a sequence with bad key indices gets NaN dQ and NaN dK, dV rows; one with bad cu_q entries writes no dQ and
 * NaN dK, dV.
 *
 * Defines (src/plan_nvidia.c, fcl_plan_nvidia_backward): MMA_KIND, DTYPE 1 (f16), 2 (bf16) or 0 (f32), D
 * head_dim (a multiple of 8, at most 128), DP D rounded up to the k step (16; 8 for f32), DS local row stride
 * in elements (DP + 8: rows 16 bytes apart modulo 128, so ldmatrix is free of bank conflicts; DP + 4 for f32),
 * NW warps, BN streamed rows per step (a multiple of 16). The host takes these kernels only when every row of
 * q, k, v, o (and so of d_o, d_q, d_k, d_v, which share their strides and offsets) starts on a 16-byte
 * boundary and scale > 0.
 *
 * f32 (DTYPE 0): the tiles hold floats and every product is three TF32 products of split operands (ptx.cl).
 * Held as floats, the K and V (or Q and dO) fragments would take as many registers as the accumulators, so a
 * warp reads those rows from global memory (through L1) at each use instead (fcl_arows; the dQ kernel keeps
 * Q's alone, read once), and the dK/dV kernel's local memory is its two step buffers alone; dK and dV are
 * written from the registers. Each step's dV, dK (or dQ) products are summed in fresh accumulators and added in
 * float, as the forward's P V is.
 *
 * Fragment layouts (as in flash_fwd_mma.cl): accumulator of one m16n8 tile, lane = 4 g + t: c0 c1 at row g,
 * columns 2t and 2t+1; c2 c3 at row g + 8. The accumulators of n8 tiles 2i and 2i+1 are, packed in pairs, the
 * m16k16 A fragment i.
 */
#if KV == 2
#error "flash_bwd_mma: paged K/V is not taken by the backward"
#endif

#define WG (NW * 32)
/* QT: m16 tiles a warp owns (1, or 2 with f16 and bf16). The dQ kernel's are query rows: each ldmatrix of K or V
   then feeds both tiles' products (docs/notes-nvidia.md v44). Up to a padded head_dim of 64 both tiles' Q and dO
   fragments stay in registers; above it (QLOCAL) the Q and dO rows stay in local memory and each chunk reads their
   fragments with ldmatrix, which leaves the registers to the two tiles' dQ accumulators (v47). The dQ kernel takes a
   tile's keys in chunks of QN n8 tiles (QK k steps): the whole tile, or with QT 2 16 keys (32 with QLOCAL, over
   which each Q and dO fragment read serves), so that S and dP of both m16 tiles fit in registers. The dK/dV
   kernel's are keys (KV_RESIDENT without WARP2D, DP up to 64): each ldmatrix of Q or dO then feeds both tiles'
   products, and its steps are short enough (BN) for S^T and dP^T of both tiles to fit in registers beside their
   dK and dV accumulators. */
#ifndef QT
#define QT 1
#endif
#if QT != 1 && (QT != 2 || DTYPE == 0 || DP > (MMA_KIND == 2 ? 128 : 64))
#error "flash_bwd_mma: QT 2 takes f16 or bf16, DP up to 128 (dQ) or 64 (dK/dV)"
#endif
#define QLOCAL (MMA_KIND == 2 && QT > 1 && DP > 64)
#if QLOCAL && BN % 32 != 0
#error "flash_bwd_mma: QT 2 above DP 64 takes key tiles of a multiple of 32"
#endif
#define QN (QT > 1 ? (MMA_KIND == 1 || QLOCAL ? 4 : 2) : NT)
#define QK (QN * 8 / KSTEP)
#define BM (NW * 16 * QT) /* rows a work-group owns: keys (dK/dV) or query rows (dQ), 16 QT a warp */
#if DTYPE == 0
typedef float elem_t; /* an element of a local tile */
#define EPC 4         /* elements in 16 bytes */
#define KSTEP 8       /* the k step of an mma (m16n8k8) */
#define PA_REGS 8     /* registers of an A fragment made of accumulators: TF32 big and small parts */
#else
typedef ushort elem_t;
#define EPC 8
#define KSTEP 16
#define PA_REGS 4
#endif
#define KT (DP / KSTEP) /* k steps over the head dimension */
#define NT (BN / 8)     /* n8 tiles of S over the streamed rows */
#define PT (BN / KSTEP) /* k steps over the streamed rows */
#define OT (DP / 8)     /* n8 tiles of the gradient accumulators */
#define CH (DP / EPC)   /* 16-byte chunks in a row of a tile */
/* WARP2D (with KV_RESIDENT, 4 warps): FlashAttention-2's warp tiles. The warps form two pairs by key half (warp & 1:
   keys 32 (warp & 1) on); in S^T and dP^T a warp takes its pair's 32 keys against half the step's query rows
   (warp >> 1), so an ldmatrix of Q or dO feeds two m16 tiles; P^T, then dS^T, go through local memory [BM][XS] to
   the pair, and in dV and dK a warp takes the 32 keys against half the head's columns (warp >> 1). Fewer
   ldmatrix reads a mma than 16 keys a warp (docs/notes-nvidia.md v42). */
#define WARP2D_FITS (KV_RESIDENT && DTYPE != 0 && NW == 4 && BN % 32 == 0 && DP % 32 == 0) /* the shapes it takes */
#ifndef WARP2D
#define WARP2D 0
#endif
#if WARP2D && !WARP2D_FITS
#error "flash_bwd_mma: WARP2D takes f16 or bf16, KV_RESIDENT, 4 warps, BN and DP multiples of 32"
#endif
#define XS (BN + 8) /* row stride of the P^T / dS^T exchange tile (WARP2D) */
#if DP % KSTEP != 0 || BN % 16 != 0 || D > DP || DS % EPC != 0 || D % 8 != 0
#error "flash_bwd_mma: inconsistent tile defines"
#endif
#define SCORE_MODS (SOFTCAP || ALIBI || MASK)
/* The dQ kernel's K and V tiles in lane-run order where the mask's rows start on 16 bytes and no sliding window
   places the tiles (ptx.cl's KEY_PERM), with 64-key tiles or f32: there the runs took 4% (f16, head_dim 64) and
   1.6% (f32) off the masked backward on an H100, while 32-key f16 and bf16 tiles ran 0.6-1.1% slower with them
   (docs/notes-nvidia.md, v33). */
#define KEY_PERM \
  (MMA_KIND == 2 && QT == 1 && MASK && MASK_VEC && NT % 4 == 0 && (NT % 8 == 0 || DTYPE == 0) && WINDOW != 2)

/* Rows r0.. of a [n][D] tensor (row stride sn) into a local tile [rows][DS], zero beyond n and D; no commit.
   The row offset within the tile fits an int (the host bounds the row stride by 2^22). With perm (the dQ
   kernel's K and V tiles under KEY_PERM, ptx.cl) row r goes to local row TILE_ROW(r). */
inline void fcl_load_rows(__local elem_t *dst, __global const store_t *src, long sn, int r0, int rows, int n, int lid,
                          int perm) {
  for (int c = lid; c < rows * CH; c += WG) {
    const int r = c / CH, cc = c % CH;
    const bool ok = r0 + r < n && cc * EPC < D;
    __global const store_t *s = ok ? src + (long)r0 * sn + (r * (int)sn + cc * EPC) : src;
    CP_ASYNC16(dst + (perm ? TILE_ROW(r) : r) * DS + cc * EPC, s, ok ? 16 : 0);
  }
}

/* The float32 recomputation's two dot products over D: *x = q.k, *y = dO.v (rows of the tensors). */
inline void fcl_dot2(__global const store_t *q, __global const store_t *k, __global const store_t *o,
                     __global const store_t *v, float *x, float *y) {
  float a = 0.0f, c = 0.0f;
  for (int d = 0; d < D; ++d) {
    a = fma(LOAD(q, d), LOAD(k, d), a);
    c = fma(LOAD(o, d), LOAD(v, d), c);
  }
  *x = a;
  *y = c;
}

/* P and dS of one (row, key) through the mask layer of m_ (common.cl's FCL_P_DS). The exponential is MUFU.EX2
   (fcl_exp2), as in the forward: OpenCL's exp2 made every tile with a score modifier pay several instructions
   more an element (docs/notes-nvidia.md, v30). */
#define MMA_P_DS(p_out, ds_out, m_, s, dp, row, key, L, Dv) \
  FCL_P_DS(p_out, ds_out, m_, s, dp, row, key, L, Dv, fcl_exp2)

/* The products' helpers are inlined however large their unrolled loops make them, so that the fragment arrays stay
   registers (without it clang's build of the shapes beyond 48 KiB kept S^T and dP^T in a stack frame). */
#define FCL_ALWAYS_INLINE inline __attribute__((always_inline))

#if DTYPE != 0
/* Per-lane ldmatrix offsets (elements) within a tile of row stride DS. A operand (no transpose, rows of the
   warp's 16): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
   B operand from rows that are the n dimension (no transpose): (n 0-7, k 0-7), (n 0-7, k 8-15),
   (n 8-15, k 0-7), (n 8-15, k 8-15) give b0 b1 of n8 tile 2i and b0 b1 of tile 2i+1. B operand from rows that
   are the k dimension (transposed): (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). */
#define A_LANE_S(lane, stride) ((((lane) & 7) + (((lane) >> 3) & 1) * 8) * (stride) + ((lane) >> 4) * 8)
#define A_LANE(lane) A_LANE_S(lane, DS)
#define BN_LANE(lane) ((((lane) & 7) + ((lane) >> 4) * 8) * DS + (((lane) >> 3) & 1) * 8)
#define BK_LANE(lane) ((((lane) & 7) + (((lane) >> 3) & 1) * 8) * DS + ((lane) >> 4) * 8)
/* A tile as the products take it: its shared-window byte address; TILE_AT moves it by elements. */
typedef uint tile_ref;
#define TILE_REF(p) SMEM_ADDR(p)
#define TILE_AT(r, elems) ((r) + (uint)(elems) * 2u)
/* Two accumulator values rounded to the storage type at p (4-byte aligned). */
#define STORE_PAIR(p, lo, hi) (*(__local uint *)(p) = fcl_pack2((lo), (hi)))

/* acc += A (m16: the fragment a of the warp's 16 rows at k step kk) times the BN streamed rows at b_addr,
   transposed: one k step of S^T = K Q^T and dP^T = V dO^T, whose B rows are the n dimension. Addresses are
   shared-window bytes. (Inline functions rather than macros, so that `#pragma unroll` stands on its own line
   as in flash_fwd_mma.cl.) */
FCL_ALWAYS_INLINE void fcl_mma_abt_step(float acc[NT][4], uint a[4], uint b_addr, int kk) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint b0, b1, b2, b3;
    LDSM_X4(b0, b1, b2, b3, b_addr + (uint)((np * 16 * DS + kk * 16) * 2));
    MMA(acc[2 * np], a, b0, b1);
    MMA(acc[2 * np + 1], a, b2, b3);
  }
}

/* acc = A times the streamed rows over DP, the fragments a[KT] of A in registers. */
FCL_ALWAYS_INLINE void fcl_mma_abt(float acc[NT][4], uint a[KT][4], uint b_addr) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) fcl_mma_abt_step(acc, a[kk], b_addr, kk);
}

#if KV_RESIDENT
/* The same with the A fragments read from the local tile at a_addr at each k step (ldmatrix, A_LANE offsets):
   the dK/dV kernel with KV_RESIDENT. */
FCL_ALWAYS_INLINE void fcl_mma_abt_l(float acc[NT][4], uint a_addr, uint b_addr) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint a[4];
    LDSM_X4(a[0], a[1], a[2], a[3], a_addr + (uint)(kk * 32));
    fcl_mma_abt_step(acc, a, b_addr, kk);
  }
}
#endif

/* The A fragments of the warp's 16 rows over DP, from the local tile at a_addr (ldmatrix, A_LANE offsets). */
FCL_ALWAYS_INLINE void fcl_load_a(uint a[KT][4], uint a_addr) {
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) LDSM_X4(a[kk][0], a[kk][1], a[kk][2], a[kk][3], a_addr + (uint)(kk * 32));
}

/* acc[mt] += A[mt] (fragments a[mt QK + kt] over a chunk's QK k steps of streamed rows) times the streamed tile at
   b_addr (rows are the k dimension, read transposed) for the QT m16 tiles, each B fragment serving all of them:
   dV += P^T dO, dK += dS^T Q (QT 1, the chunk the whole step), dQ += dS K. */
FCL_ALWAYS_INLINE void fcl_mma_ab_tiles(float (*acc)[OT][4], uint (*a)[4], uint b_addr) {
#pragma unroll
  for (int kt = 0; kt < QK; ++kt)
#pragma unroll
    for (int np = 0; np < OT / 2; ++np) {
      uint b0, b1, b2, b3;
      LDSM_X4_T(b0, b1, b2, b3, b_addr + (uint)((kt * 16 * DS + np * 16) * 2));
#pragma unroll
      for (int mt = 0; mt < QT; ++mt) {
        MMA(acc[mt][2 * np], a[mt * QK + kt], b0, b1);
        MMA(acc[mt][2 * np + 1], a[mt * QK + kt], b2, b3);
      }
    }
}

/* The same for one m16 tile over the BN streamed rows (the dK/dV kernel, whose QT is 1 and chunk the whole step). */
FCL_ALWAYS_INLINE void fcl_mma_ab(float acc[OT][4], uint a[PT][4], uint b_addr) {
  fcl_mma_ab_tiles((float(*)[OT][4])acc, a, b_addr);
}

#if WARP2D
/* acc (two m16 tiles of keys, OT / 2 n8 tiles of columns each: acc[mt OT/2 + n]) += A (the pair's P^T or dS^T from
   the exchange tile at a_addr, XS stride, A_LANE_S offsets) times the streamed tile at b_addr (rows are the k
   dimension, read transposed, from the warp's first column): WARP2D's dV += P^T dO and dK += dS^T Q. */
FCL_ALWAYS_INLINE void fcl_mma_ab_x(float acc[OT][4], uint a_addr, uint b_addr) {
#pragma unroll
  for (int kt = 0; kt < PT; ++kt) {
    uint a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) LDSM_X4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], a_addr + (uint)((mt * 16 * XS + kt * 16) * 2));
#pragma unroll
    for (int np = 0; np < OT / 4; ++np) {
      uint b0, b1, b2, b3;
      LDSM_X4_T(b0, b1, b2, b3, b_addr + (uint)((kt * 16 * DS + np * 16) * 2));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        MMA(acc[mt * (OT / 2) + 2 * np], a[mt], b0, b1);
        MMA(acc[mt * (OT / 2) + 2 * np + 1], a[mt], b2, b3);
      }
    }
  }
}
#endif

/* Accumulators s of n8 tiles 2i and 2i+1 packed into the m16k16 A fragment a[i], over a chunk's QK k steps (the
   dK/dV kernel's: the whole step). */
FCL_ALWAYS_INLINE void fcl_pack_a(uint a[QK][4], float s[QN][4]) {
#pragma unroll
  for (int kt = 0; kt < QK; ++kt) {
    a[kt][0] = fcl_pack2(s[2 * kt][0], s[2 * kt][1]);
    a[kt][1] = fcl_pack2(s[2 * kt][2], s[2 * kt][3]);
    a[kt][2] = fcl_pack2(s[2 * kt + 1][0], s[2 * kt + 1][1]);
    a[kt][3] = fcl_pack2(s[2 * kt + 1][2], s[2 * kt + 1][3]);
  }
}

#else /* DTYPE 0: float tiles, m16n8k8 TF32 products (3xTF32, ptx.cl) */
/* Per-lane offsets (elements) of the float fragments within a tile of row stride DS = DP + 4 (4 modulo 8 words,
   so that the 32 words a warp reads in either pattern below fall in 32 banks). The A operand (m16k8: a0 row
   g, column t; a1 row g + 8; a2, a3 four columns on) comes from global memory (fcl_arows below). The B operand
   from rows that are the n dimension (b0 row g, column t; b1 four columns on) starts at row g, column t; from
   rows that are the k dimension, at row 2t, column g: an 8-row k step's rows are taken in the order
   0 2 4 6 1 3 5 7 (k = t is row 2t, k = t + 4 row 2t + 1), so the accumulator of n8 tile i is, as it stands,
   the A fragment of k step i (a0 = c0, a1 = c2, a2 = c1, a3 = c3), as flash_fwd_mma.cl takes P for P V. */
#define BN_LANE(lane) (((lane) >> 2) * DS + ((lane) & 3))
#define BK_LANE(lane) (2 * ((lane) & 3) * DS + ((lane) >> 2))
typedef __local const float *tile_ref;
#define TILE_REF(p) (p)
#define TILE_AT(r, elems) ((r) + (elems))
#define STORE_PAIR(p, lo, hi) (*(__local float2 *)(p) = (float2)((lo), (hi)))

/* The A operand of the warp's 16 rows over DP, read from global memory (through L1) at each use: the lane's
   rows g and g + 8 at column t. Held in registers as floats, as the f16/bf16 kernels hold theirs as pairs, K
   and V (or Q and dO) would take DP registers a lane, as many as dK and dV together: 2 DP with them, 128 at
   head_dim 64 before S^T, dP^T and their TF32 parts (clang's build of that spilled), 256 at 128. */
typedef struct {
  __global const float *r0, *r1;
} fcl_arows;

/* LO_ACC 1: the small products go to accumulators of their own (MMA3_HL), added at the end: two dependency
   chains an accumulator tile instead of one. On the H200 (docs/notes-nvidia.md, v22) that took the f32 backward
   at head_dim 64, N = 4096, from 22.5 to 21.8 ms (causal 12.3 to 11.6); at 128 it ran 61 to 62 ms against 61,
   the dK/dV kernel at 255 registers, where the extra accumulators spill. */
#define LO_ACC (DP <= 64)
#if LO_ACC
#define MMA3_ACC(c, lo, ab, as, bb0, bb1, bs0, bs1) MMA3_HL(c, lo, ab, as, bb0, bb1, bs0, bs1)
#else
#define MMA3_ACC(c, lo, ab, as, bb0, bb1, bs0, bs1) MMA3(c, ab, as, bb0, bb1, bs0, bs1)
#endif

/* Register e of the lane's A fragment at k step kk, from the rows a: row g (e even) or g + 8 (e odd), column t
   (e < 2) or t + 4 of the k step. */
#define AROWS_AT(a, kk, e) ((e) & 1 ? (a).r1 : (a).r0)[(kk) * 8 + ((e) >> 1) * 4]
/* The same from registers qf (the dQ kernel's Q, read once with AROWS_AT) when qf is not NULL. */
#define A_FRAG(e) (qf ? qf[kk][e] : AROWS_AT(a, kk, e))

/* acc = A (rows a, or fragments qf in registers when qf is not NULL; split at each k step) times the BN streamed
   rows at b, transposed, over DP: S^T = K Q^T, dP^T = V dO^T, S = Q K^T, dP = dO V^T. */
FCL_ALWAYS_INLINE void fcl_mma_abt_from(float acc[NT][4], fcl_arows a, float (*qf)[4], tile_ref b) {
  float lo[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = lo[i][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint ab[4], as[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) TF32_SPLIT(ab[e], as[e], A_FRAG(e));
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      uint bb0, bs0, bb1, bs1;
      TF32_SPLIT(bb0, bs0, b[i * 8 * DS + kk * 8]);
      TF32_SPLIT(bb1, bs1, b[i * 8 * DS + kk * 8 + 4]);
      MMA3_ACC(acc[i], lo[i], ab, as, bb0, bb1, bs0, bs1);
    }
  }
#if LO_ACC
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] += lo[i][e];
#endif
}
#undef A_FRAG
#define fcl_mma_abt(acc, a, b) fcl_mma_abt_from(acc, a, 0, b)

/* acc += A (a[kt]: big parts, then small parts) times the streamed tile at b (rows as k, BK_LANE offsets):
   dV += P^T dO, dK += dS^T Q, dQ += dS K. Each n8 tile sums the step's products in fresh accumulators and adds
   them to acc in float arithmetic: the tensor cores' own additions are not rounded to nearest, and chained
   over thousands of rows their error would grow with the sequence, as it did in the forward
   (docs/notes-portable.md v10). */
FCL_ALWAYS_INLINE void fcl_mma_ab(float acc[OT][4], uint a[PT][PA_REGS], tile_ref b) {
#pragma unroll
  for (int n = 0; n < OT; ++n) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kt = 0; kt < PT; ++kt) {
      uint bb0, bs0, bb1, bs1;
      TF32_SPLIT(bb0, bs0, b[kt * 8 * DS + n * 8]);
      TF32_SPLIT(bb1, bs1, b[kt * 8 * DS + DS + n * 8]);
      MMA3_ACC(c, lo, a[kt], a[kt] + 4, bb0, bb1, bs0, bs1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] += LO_ACC ? c[e] + lo[e] : c[e];
  }
}

/* Accumulators s of n8 tile kt as the A fragment of k step kt, split into TF32 parts (big in a[kt][0..3],
   small in a[kt][4..7]), over the tile's PT k steps (QT is 1 in f32). */
FCL_ALWAYS_INLINE void fcl_pack_a(uint a[PT][PA_REGS], float s[NT][4]) {
#pragma unroll
  for (int kt = 0; kt < PT; ++kt) {
    TF32_SPLIT(a[kt][0], a[kt][4], s[kt][0]);
    TF32_SPLIT(a[kt][1], a[kt][5], s[kt][2]);
    TF32_SPLIT(a[kt][2], a[kt][6], s[kt][1]);
    TF32_SPLIT(a[kt][3], a[kt][7], s[kt][3]);
  }
}
#endif

#if MMA_KIND == 1

/* Local memory: two step buffers, each Q then dO [BN][DS] (the step's buffer and the next one's); K and V
   [BM][DS] are copied into the space from the second buffer on and read once into registers (K and V
   fragments, 2 KT 4 a lane) before step 1's rows land there; lse * log2(e) and Dvec of the streamed rows
   [2][BN] as floats. At the end dK and dV go through the K and V tiles. Tile shapes (plan_nvidia.c): d <= 64:
   4 warps (64 keys), 64 query rows a step: 18 KiB of the first buffer + 18 KiB of K, V (or the second
   buffer); 64 + 64 accumulator registers for dK, dV, 16 + 16 for the K, V fragments, 32 + 32 for S^T, dP^T;
   d <= 128: 4 warps (64 keys), 32 query rows a step (K and V over both buffers, below): 35 KiB, 128
   accumulator registers, 32 + 32 of fragments, 16 + 16 for S^T, dP^T.
   When K and V together outgrow the second buffer but each fits one buffer (BN < BM <= 2 BN: 4 warps, 32-row
   steps), K goes over the second buffer and V over the first, and step 0's rows are loaded only once every
   warp has read its V fragments: one load latency more a work-group, for twice the keys a step's rows are
   copied for within 48 KiB.
   f32 (DTYPE 0) reads its K and V fragments from global memory at each step (fcl_arows) and writes dK and dV
   from the registers, so its local memory is the two step buffers alone.
   KV_RESIDENT 1 (f16, bf16; local memory beyond the 48 KiB NVIDIA's OpenCL reports, caps->nv_static_local): K and
   V [BM][DS] stay in local memory after the two step buffers for the whole kernel, and each step reads the warp's
   fragments with ldmatrix at each k step, as FlashAttention-2 does: 64 registers a lane free at head_dim 128 for
   longer steps, for 8 KiB more of ldmatrix a warp a step. */
#ifndef KV_RESIDENT
#define KV_RESIDENT 0
#endif
#if KV_RESIDENT && DTYPE == 0
#error "flash_bwd_mma: KV_RESIDENT takes f16 or bf16"
#endif
#if QT > 1 && (!KV_RESIDENT || WARP2D || BN % 32 != 0)
#error "flash_bwd_mma: two key tiles a warp take KV_RESIDENT without WARP2D, steps of a multiple of 32 rows"
#endif
#define KV_LOCAL (DTYPE != 0)
#define KV_OVER_BOTH (KV_LOCAL && !KV_RESIDENT && BM > BN && BM <= 2 * BN)
#define SMEM                                                                                       \
  (KV_RESIDENT                   ? (4 * BN + 2 * BM) * DS + WARP2D * BM * XS                       \
   : !KV_LOCAL || KV_OVER_BOTH ? 4 * BN * DS                                                       \
                               : (2 * BN + (BM > BN ? 2 * BM : 2 * BN)) * DS)
#define STEP_ELEMS (2 * BN * DS) /* one step buffer, Q and dO */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_bwd_dkdv_mma(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                        __global const store_t *d_o, __global const float *lse, __global const float *dvec,
                        __global store_t *d_k, __global store_t *d_v,
                        long q_off, long q_sb, long q_sh, long q_sn,
                        long k_off, long k_sb, long k_sh, long k_sn,
                        long v_off, long v_sb, long v_sh, long v_sn,
                        long o_off, long o_sb, long o_sh, long o_sn,
                        int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS) {
  __local uint4 smem[SMEM / EPC]; /* uint4: 16-byte aligned for cp.async, ldmatrix and the 16-byte stores */
  __local float Ls[2][BN], Dl[2][BN];
  __local elem_t *Qs = (__local elem_t *)smem; /* buffer b's Q at Qs + b STEP_ELEMS */
  __local elem_t *dOs = Qs + BN * DS;          /* buffer b's dO at dOs + b STEP_ELEMS */
#if KV_LOCAL
  /* over the second buffer (and beyond it when BM > BN), or after both (KV_RESIDENT) */
  __local elem_t *Ks = Qs + (1 + KV_RESIDENT) * STEP_ELEMS;
  __local elem_t *Vs = KV_OVER_BOTH ? Qs : Ks + BM * DS;
#endif
#if WARP2D
  __local elem_t *Xs = Ks + 2 * BM * DS; /* P^T, then dS^T, of the step [BM][XS] */
#endif

  const int lid = get_local_id(0);
  const int lane = lid & 31, warp = lid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int k0 = get_group_id(0) * BM; /* causal: the first key blocks are seen by the most queries */
  const int hk = get_group_id(1);
  const int b = get_group_id(2);

  /* This sequence's lengths and rows; a block past the key rows it owns has nothing to write. Its rows from nk
     to k_rows (beyond seqlens_k) get zero gradients; any bad index of the sequence makes its rows NaN. */
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq_max, nk_max);
  if (k0 >= seq.k_rows) return;
  const int nq = seq.nq, nk = seq.nk;
  const bool poisoned = seq.bad || seq.skip;
  const long kbase = fcl_key_base(&seq, b, hk, k_off, k_sb, k_sh, k_sn);
  const long vbase = fcl_key_base(&seq, b, hk, v_off, v_sb, v_sh, v_sn);
  const long qbase0 = fcl_query_base(&seq, b, 0, q_off, q_sb, q_sh, q_sn); /* + h q_sh */
  const long obase0 = fcl_query_base(&seq, b, 0, o_off, o_sb, o_sh, o_sn); /* + h o_sh */
#define LBASE(h_) fcl_lse_base(&seq, b, h_, num_heads, nq_max, total_q)

  /* The query rows that see some key of the block (the window does not depend on the head), in steps of BN,
     for each query head of the group in order. */
  fcl_mods mods;
  FCL_MODS_INIT(mods, b, hk * group, nq, nk);
  const int q_begin = fcl_row_begin(&mods, k0), q_end = fcl_row_end(&mods, min(k0 + BM, nk) - 1, nq);
  const int qtiles = poisoned || k0 >= nk || q_end <= q_begin ? 0 : (q_end - q_begin + BN - 1) / BN;
  const int nsteps = qtiles * group;

#if KV_LOCAL
  fcl_load_rows(Ks, k + kbase, k_sn, k0, BM, nk, lid, 0);
  fcl_load_rows(Vs, v + vbase, v_sn, k0, BM, nk, lid, 0);
  CP_ASYNC_COMMIT();
#endif
  /* Step s's Q and dO rows into buffer s & 1 (one commit group), and its rows' lse and Dvec. */
#define STEP_LOAD(s_)                                                                                  \
  do {                                                                                               \
    const int h_ = hk * group + (s_) / qtiles, q0_ = q_begin + ((s_) % qtiles) * BN, buf_ = (s_) & 1;  \
    fcl_load_rows(Qs + buf_ * STEP_ELEMS, q + qbase0 + h_ * q_sh, q_sn, q0_, BN, nq, lid, 0);         \
    fcl_load_rows(dOs + buf_ * STEP_ELEMS, d_o + obase0 + h_ * o_sh, o_sn, q0_, BN, nq, lid, 0);      \
    CP_ASYNC_COMMIT();                                                                               \
    for (int r_ = lid; r_ < BN; r_ += WG) {                                                          \
      const bool in_ = q0_ + r_ < nq;                                                                \
      Ls[buf_][r_] = in_ ? lse[LBASE(h_) + q0_ + r_] * FCL_LOG2E : 0.0f;                               \
      Dl[buf_][r_] = in_ ? dvec[LBASE(h_) + q0_ + r_] : 0.0f;                                          \
    }                                                                                                \
  } while (0)
#if !KV_OVER_BOTH
  if (nsteps > 0) STEP_LOAD(0);
#endif

  /* The warp's keys (from the block's first): MT m16 tiles from wkey (WARP2D: its pair's 32 keys; QT 2: its own
     32). Its S^T and dP^T: those keys against SN n8 tiles of the step's query rows from wq (tile mt SN + i); its
     dK, dV accumulators: against OTW n8 tiles of columns from wcol (accumulator mt OTW + i). */
#define MT (WARP2D ? 2 : QT)
#define SN (WARP2D ? NT / 2 : QT > 1 ? QN : NT)
#define NCH (QT > 1 ? NT / QN : 1) /* chunks of a step's rows (QT 2: of 32 rows, each its S^T, dP^T, dV, dK) */
#define OTW (WARP2D ? OT / 2 : OT)
  float dk[MT * OTW][4], dv[MT * OTW][4];
#pragma unroll
  for (int i = 0; i < MT * OTW; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;

  const float qk_scale = scale * FCL_LOG2E;
  const int wkey = WARP2D ? (warp & 1) * 32 : warp * 16 * QT, wcol = WARP2D ? (warp >> 1) * (DP / 2) : 0;
  const int wq = WARP2D ? (warp >> 1) * (BN / 2) : 0;
  const tile_ref q_n = TILE_REF(Qs + BN_LANE(lane)), o_n = TILE_REF(dOs + BN_LANE(lane));
  const tile_ref q_k = TILE_REF(Qs + BK_LANE(lane)), o_k = TILE_REF(dOs + BK_LANE(lane));

#if !KV_LOCAL
  /* The lane's two key rows of K and V (rows past nk read row nk - 1: their entries are hidden, and a block
     with no key below nk has no steps). */
  const int kr0 = max(min(k0 + wkey + g, nk - 1), 0), kr1 = max(min(k0 + wkey + g + 8, nk - 1), 0);
  const fcl_arows kf = {k + kbase + (long)kr0 * k_sn + t, k + kbase + (long)kr1 * k_sn + t};
  const fcl_arows vf = {v + vbase + (long)kr0 * v_sn + t, v + vbase + (long)kr1 * v_sn + t};
#else
  const tile_ref k_a = TILE_REF(Ks + wkey * DS + A_LANE(lane)), v_a = TILE_REF(Vs + wkey * DS + A_LANE(lane));
#if WARP2D
  const tile_ref x_a = TILE_REF(Xs + wkey * XS + A_LANE_S(lane, XS));
  /* The pair (the two warps of the same keys) meets at named barrier 1 or 2. */
#define PAIR_SYNC() asm volatile("bar.sync %0, 64;\n" ::"r"(1 + (warp & 1)) : "memory")
#endif
#if KV_RESIDENT
  /* The products read the warp's K and V fragments from the tiles at each step (fcl_mma_abt_l); the first step's
     wait and barrier cover the tiles' copies. */
#else
  /* The warp's K and V fragments, read once: the steps' products read only Q and dO from local memory, and the
     K, V tiles' space is free for step 1's buffer once every warp has passed the first step's barrier. */
  uint kf[KT][4], vf[KT][4];
  CP_ASYNC_WAIT_ALL();
  barrier(CLK_LOCAL_MEM_FENCE);
  fcl_load_a(kf, k_a);
  fcl_load_a(vf, v_a);
#if KV_OVER_BOTH
  barrier(CLK_LOCAL_MEM_FENCE); /* every warp has its V fragments out of the first buffer */
  if (nsteps > 0) STEP_LOAD(0);
#endif
#endif /* KV_RESIDENT */
#endif

  for (int st = 0; st < nsteps; ++st) {
    const int hg = st / qtiles, h = hk * group + hg;
    const int q0 = q_begin + (st % qtiles) * BN;
    (void)h; /* the head matters to the mask layer only with ALiBi or a mask (HMODS) */
    const int boff = (st & 1) * STEP_ELEMS; /* elements to this step's buffer */
    CP_ASYNC_WAIT_ALL();          /* this step's Q, dO have landed for this work-item ... */
    barrier(CLK_LOCAL_MEM_FENCE); /* ... and for all; every warp is done with the other buffer (step st - 1, or
                                     at st = 0 the K, V tiles over it) */
    if (st + 1 < nsteps) STEP_LOAD(st + 1);

#pragma unroll 1
    for (int ch = 0; ch < NCH; ++ch) {
      const int cq = wq + ch * SN * 8; /* the chunk's first row in the step */
      /* dP^T = V dO^T and S^T = K Q^T (keys as rows, this step's query rows as columns). With WARP2D the pair's 32
         keys against the warp's half of the rows, with QT 2 the warp's 32 keys against the chunk's 32 rows: each
         ldmatrix of Q or dO serves both m16 tiles of keys. */
      float dp[MT * SN][4], s[MT * SN][4];
#if MT == 2
#pragma unroll
      for (int i = 0; i < MT * SN; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        uint ka[2][4], va[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          LDSM_X4(ka[mt][0], ka[mt][1], ka[mt][2], ka[mt][3], k_a + (uint)((mt * 16 * DS + kk * 16) * 2));
          LDSM_X4(va[mt][0], va[mt][1], va[mt][2], va[mt][3], v_a + (uint)((mt * 16 * DS + kk * 16) * 2));
        }
#pragma unroll
        for (int np = 0; np < SN / 2; ++np) {
          uint b0, b1, b2, b3;
          LDSM_X4(b0, b1, b2, b3, TILE_AT(q_n, boff + (cq + np * 16) * DS + kk * 16));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            MMA(s[mt * SN + 2 * np], ka[mt], b0, b1);
            MMA(s[mt * SN + 2 * np + 1], ka[mt], b2, b3);
          }
          LDSM_X4(b0, b1, b2, b3, TILE_AT(o_n, boff + (cq + np * 16) * DS + kk * 16));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            MMA(dp[mt * SN + 2 * np], va[mt], b0, b1);
            MMA(dp[mt * SN + 2 * np + 1], va[mt], b2, b3);
          }
        }
      }
#elif KV_RESIDENT
      fcl_mma_abt_l(dp, v_a, TILE_AT(o_n, boff));
      fcl_mma_abt_l(s, k_a, TILE_AT(q_n, boff));
#else
      fcl_mma_abt(dp, vf, TILE_AT(o_n, boff));
      fcl_mma_abt(s, kf, TILE_AT(q_n, boff));
#endif

      /* P^T and dS^T in place of S^T and dP^T. Only tiles that reach a hidden entry (or all, with modifiers) go
         through the mask layer; the tile's last query row is its last one below nq (tail rows are zeros, see
         the top). */
#if ALIBI || MASK
      fcl_mods hmods;
      FCL_MODS_INIT(hmods, b, h, nq, nk);
#define HMODS (&hmods)
#else
#define HMODS (&mods)
#endif
      const int buf = st & 1;
      if (SCORE_MODS || fcl_tile_masked(&mods, q0, min(q0 + BN, nq) - 1, k0, BM, nk)) {
#pragma unroll
        for (int i = 0; i < MT * SN; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = cq + (i % SN) * 8 + 2 * t + (e & 1);
            const int key = k0 + wkey + (i / SN) * 16 + g + (e >> 1) * 8;
            float p, ds;
            MMA_P_DS(p, ds, HMODS, s[i][e], dp[i][e], q0 + c, key, Ls[buf][c], Dl[buf][c]);
            s[i][e] = p;
            dp[i][e] = ds;
          }
      } else {
        const float sl2 = qk_scale;
#pragma unroll
        for (int i = 0; i < MT * SN; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = cq + (i % SN) * 8 + 2 * t + (e & 1);
            const float p = native_exp2(fma(s[i][e], sl2, -Ls[buf][c]));
            s[i][e] = p;
            dp[i][e] = p * (dp[i][e] - Dl[buf][c]);
          }
      }
#if WARP2D
      /* P^T to the exchange tile, dV += P^T dO over the step's rows (the pair's two halves of P^T), then dS^T in its
         place once the pair has read P^T, and dK += dS^T Q. */
#define X_STORE(x)                                                                                   \
  do {                                                                                               \
    _Pragma("unroll") for (int i = 0; i < NT; ++i) {                                                 \
      __local elem_t *x_ = Xs + (wkey + (i / SN) * 16 + g) * XS + cq + (i % SN) * 8 + 2 * t;         \
      STORE_PAIR(x_, x[i][0], x[i][1]);                                                              \
      STORE_PAIR(x_ + 8 * XS, x[i][2], x[i][3]);                                                     \
    }                                                                                                \
  } while (0)
      X_STORE(s);
      PAIR_SYNC();
      fcl_mma_ab_x(dv, x_a, TILE_AT(o_k, boff + wcol));
      PAIR_SYNC();
      X_STORE(dp);
      PAIR_SYNC();
      fcl_mma_ab_x(dk, x_a, TILE_AT(q_k, boff + wcol));
#undef X_STORE
#elif QT > 1
      /* dV += P^T dO, dK += dS^T Q for both m16 tiles of keys, each ldmatrix of dO or Q serving both. */
      uint pa[QT * QK][4], da[QT * QK][4];
#pragma unroll
      for (int mt = 0; mt < QT; ++mt) {
        fcl_pack_a(pa + mt * QK, s + mt * SN);
        fcl_pack_a(da + mt * QK, dp + mt * SN);
      }
      fcl_mma_ab_tiles((float(*)[OT][4])dv, pa, TILE_AT(o_k, boff + cq * DS));
      fcl_mma_ab_tiles((float(*)[OT][4])dk, da, TILE_AT(q_k, boff + cq * DS));
#else
      uint pa[PT][PA_REGS], da[PT][PA_REGS];
      fcl_pack_a(pa, s);
      fcl_pack_a(da, dp);

      /* dV += P^T dO, dK += dS^T Q. */
      fcl_mma_ab(dv, pa, TILE_AT(o_k, boff));
      fcl_mma_ab(dk, da, TILE_AT(q_k, boff));
#endif
    }
  }

  /* Which of the lane's two key rows hold a non-finite accumulator (a NaN or inf reached them as 0 * x from a
     hidden entry, or from a visible one); the quad holds the row. */
  int bad[MT][2], any_bad = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int x = 0;
#pragma unroll
      for (int i = mt * OTW; i < (mt + 1) * OTW; ++i)
        x |= fcl_nonfinite(dk[i][2 * hr]) | fcl_nonfinite(dk[i][2 * hr + 1]) | fcl_nonfinite(dv[i][2 * hr]) |
             fcl_nonfinite(dv[i][2 * hr + 1]);
      bad[mt][hr] = fcl_quad_any(x);
      any_bad |= bad[mt][hr];
    }

  /* dK (scaled) and dV into the K and V tiles, so the global writes are 16 bytes a work-item (f32: straight
     from the registers, 8 bytes a work-item, 32 bytes a quad); the accumulators end here (the recomputation
     below then has the registers of a row at a time). */
#if KV_LOCAL /* (c is added unparenthesised, term by term, as this code always formed the address: the grouped
                 sum made NVIDIA's and clang's builds of the f16 kernel spill more) */
#define OUT_KV(rl, c, kx, ky, vx, vy)          \
  do {                                         \
    STORE_PAIR(Ks + (rl) * DS + c, kx, ky);    \
    STORE_PAIR(Vs + (rl) * DS + c, vx, vy);    \
  } while (0)
#else
#define OUT_KV(rl, c, kx, ky, vx, vy)                                                              \
  do {                                                                                             \
    if (k0 + (rl) < seq.k_rows && (c) < D) {                                                       \
      *(__global float2 *)(d_k + kbase + (long)(k0 + (rl)) * k_sn + (c)) = (float2)((kx), (ky));   \
      *(__global float2 *)(d_v + vbase + (long)(k0 + (rl)) * v_sn + (c)) = (float2)((vx), (vy));   \
    }                                                                                              \
  } while (0)
#endif
  CP_ASYNC_WAIT_ALL();          /* nothing is in flight by now (every copy was waited for in or before the
                                   loop); kept so that reusing the tiles does not rest on that */
  barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the tiles */
  const float ks = poisoned ? NAN : scale, vs = poisoned ? NAN : 1.0f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int rl = wkey + mt * 16 + g + hr * 8;
#pragma unroll
      for (int i = 0; i < OTW; ++i)
        OUT_KV(rl, wcol + i * 8 + 2 * t, dk[mt * OTW + i][2 * hr] * ks, dk[mt * OTW + i][2 * hr + 1] * ks,
               dv[mt * OTW + i][2 * hr] * vs, dv[mt * OTW + i][2 * hr + 1] * vs);
    }

  /* Rows with a non-finite accumulator again in float32, over the same query rows of every head of the group,
     adding p dO and dS Q only where p != 0, as flash_bwd.cl does: slow, and taken only for non-finite inputs.
     Each lane rewrites its own columns of the row. */
  if (fcl_warp_any(any_bad)) {
    for (int mt = 0; mt < MT; ++mt)
      for (int hr = 0; hr < 2; ++hr) {
        if (!bad[mt][hr]) continue;
        const int key = k0 + wkey + mt * 16 + g + hr * 8, rl = wkey + mt * 16 + g + hr * 8;
        float fk[OTW][2], fv[OTW][2];
#pragma unroll
        for (int i = 0; i < OTW; ++i) fk[i][0] = fk[i][1] = fv[i][0] = fv[i][1] = 0.0f;
        __global const store_t *kr = k + kbase + (long)key * k_sn, *vr = v + vbase + (long)key * v_sn;
        /* A key beyond nk gets zero gradients. */
        for (int hg = 0; hg < (poisoned || key >= nk ? 0 : group); ++hg) {
          const int h = hk * group + hg;
          fcl_mods rm;
          FCL_MODS_INIT(rm, b, h, nq, nk);
          __global const store_t *qh = q + qbase0 + h * q_sh, *oh = d_o + obase0 + h * o_sh;
          const long lb = LBASE(h);
          const int r_end = fcl_row_end(&rm, key, nq);
          for (int row = fcl_row_begin(&rm, key); row < r_end; ++row) {
            __global const store_t *qr = qh + (long)row * q_sn, *orow = oh + (long)row * o_sn;
            float x, y;
            fcl_dot2(qr, kr, orow, vr, &x, &y);
            float p, ds;
            MMA_P_DS(p, ds, &rm, x, y, row, key, lse[lb + row] * FCL_LOG2E, dvec[lb + row]);
            if (p != 0.0f)
#pragma unroll
              for (int i = 0; i < OTW; ++i)
                if (wcol + i * 8 + 2 * t < D) {
                  const int c = wcol + i * 8 + 2 * t;
                  fv[i][0] = fma(p, LOAD(orow, c), fv[i][0]);
                  fv[i][1] = fma(p, LOAD(orow, c + 1), fv[i][1]);
                  fk[i][0] = fma(ds, LOAD(qr, c), fk[i][0]);
                  fk[i][1] = fma(ds, LOAD(qr, c + 1), fk[i][1]);
                }
          }
        }
#pragma unroll
        for (int i = 0; i < OTW; ++i)
          OUT_KV(rl, wcol + i * 8 + 2 * t, fk[i][0] * ks, fk[i][1] * ks, fv[i][0] * vs, fv[i][1] * vs);
      }
  }
#if KV_LOCAL
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int c = lid; c < BM * CH; c += WG) {
    const int r = c / CH, cc = c % CH;
    const int key = k0 + r;
    if (key < seq.k_rows && cc * EPC < D) {
      *(__global uint4 *)(d_k + kbase + (long)key * k_sn + cc * EPC) = *(__local const uint4 *)(Ks + r * DS + cc * EPC);
      *(__global uint4 *)(d_v + vbase + (long)key * v_sn + cc * EPC) = *(__local const uint4 *)(Vs + r * DS + cc * EPC);
    }
  }
#endif
#undef OUT_KV
#undef PAIR_SYNC
#undef MT
#undef SN
#undef OTW
#undef NCH
#undef LBASE
#undef STEP_LOAD
#undef HMODS
}

#elif MMA_KIND == 2

/* Local memory: K and V [2][BN][DS] (the tile's buffer and the next one's); at the end the dQ tile [BM][DS].
   Q and dO fragments stay in registers (2 KT 4 each; 64 registers at d = 128 beside 64 of dQ accumulators and
   S and dP of the tile). Tile shapes (plan_nvidia.c): 4 warps; 64-key tiles (36 KiB at d <= 64, 68 KiB at d <= 128
   where two work-groups fit a multiprocessor), 32-key tiles within 48 KiB. f32 keeps Q's fragments (4 KT floats),
   reads its dO rows from global memory at each use (fcl_arows) and takes 32-key tiles at d <= 64 (34 KiB), 16 or 32
   at d <= 128. With QT 2 (f16, bf16) a warp owns two m16 tiles (32 query rows) and takes each tile's keys in chunks
   of 16 (d <= 64: 64 more registers of Q, dO and dQ fragments) or, with QLOCAL (d > 64), of 32, Q and dO [BM][DS]
   then kept in local memory after K and V (102 KiB with 32-key tiles at d = 128) and read by ldmatrix a k step a
   chunk: each ldmatrix of K or V feeds both m16 tiles' products. */
#if QLOCAL
#define SMEM (4 * BN * DS + 2 * BM * DS) /* then Q and dO [BM][DS] each */
#else
#define SMEM (4 * BN * DS > BM * DS ? 4 * BN * DS : BM * DS)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_bwd_dq_mma(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                      __global const store_t *d_o, __global const float *lse, __global const float *dvec,
                      __global store_t *d_q,
                      long q_off, long q_sb, long q_sh, long q_sn,
                      long k_off, long k_sb, long k_sh, long k_sn,
                      long v_off, long v_sb, long v_sh, long v_sn,
                      long o_off, long o_sb, long o_sh, long o_sn,
                      int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS) {
  __local uint4 smem[SMEM / EPC];
  __local elem_t *Ks = (__local elem_t *)smem; /* [2][BN][DS] */
  __local elem_t *Vs = Ks + 2 * BN * DS;      /* [2][BN][DS] */

  const int lid = get_local_id(0);
  const int lane = lid & 31, warp = lid >> 5;
  const int g = lane >> 2, t = lane & 3;
  /* Causal: the last query blocks see the most keys, so they take the first group ids and start first. */
  const int q0 =
      (win_right < nq_max ? (int)get_num_groups(0) - 1 - (int)get_group_id(0) : (int)get_group_id(0)) * BM;
  const int h = get_group_id(1);
  const int b = get_group_id(2);
  const int hk = h / group;

  /* This sequence's lengths and rows; a block past its last query row has nothing to do (nor has any block
     of a sequence whose cu_q entries did not fit: nq is then 0). */
  fcl_seq seq;
  FCL_SEQ_INIT(seq, b, nq_max, nk_max);
  const int nq = seq.nq, nk = seq.nk;
  if (q0 >= nq) return;
  const long qbase = fcl_query_base(&seq, b, h, q_off, q_sb, q_sh, q_sn);
  const long obase = fcl_query_base(&seq, b, h, o_off, o_sb, o_sh, o_sn);
  __global const store_t *kh = k + fcl_key_base(&seq, b, hk, k_off, k_sb, k_sh, k_sn);
  __global const store_t *vh = v + fcl_key_base(&seq, b, hk, v_off, v_sb, v_sh, v_sn);
  const long lbase = fcl_lse_base(&seq, b, h, num_heads, nq_max, total_q);

  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, nq, nk);
  /* A sequence whose key indices did not fit computes nothing and gets NaN dQ. */
  const int q_last = min(q0 + BM, nq) - 1;
  const int kv_begin = FCL_BLOCK_KEY_BEGIN(&mods, q0);
  const int kv_end = seq.bad ? kv_begin : fcl_key_end(&mods, q_last, nk);
  const int ntiles = kv_end > kv_begin ? (kv_end - kv_begin + BN - 1) / BN : 0;
#if QLOCAL
  __local elem_t *Qls = Vs + 2 * BN * DS, *Ols = Qls + BM * DS; /* the block's Q and dO rows */
#endif
  if (ntiles > 0) {
#if QLOCAL
    /* Q and dO, zeros past nq, in the first K/V tile's group (the loop's first wait covers them). */
    fcl_load_rows(Qls, q + qbase, q_sn, q0, BM, nq, lid, 0);
    fcl_load_rows(Ols, d_o + obase, o_sn, q0, BM, nq, lid, 0);
#endif
    fcl_load_rows(Ks, kh, k_sn, kv_begin, BN, nk, lid, KEY_PERM);
    fcl_load_rows(Vs, vh, v_sn, kv_begin, BN, nk, lid, KEY_PERM);
    CP_ASYNC_COMMIT();
  }

  const int wrow = warp * 16 * QT;
  const int r0 = q0 + wrow + g, r1 = r0 + 8; /* the lane's two query rows of its first m16 tile (+ 16 mt after) */
#if DTYPE == 0
  /* Q and dO rows from global memory (fcl_arows): dO's at each tile, Q's once, below. A row past nq reads row
     nq - 1 and takes lse +inf, so its P and dS are 0 (it is never written). */
  const fcl_arows qa = {q + qbase + (long)min(r0, nq - 1) * q_sn + t, q + qbase + (long)min(r1, nq - 1) * q_sn + t};
  const fcl_arows oa = {d_o + obase + (long)min(r0, nq - 1) * o_sn + t,
                        d_o + obase + (long)min(r1, nq - 1) * o_sn + t};
  const float Ltail = INFINITY;
  /* Q's fragments in registers, read once (4 KT floats a lane): S's A operand without an L1 read a k step; up to
     head_dim 64 dO's too (dP's A operand). At 128 dO's would spill 708 bytes (NVIDIA's compiler) and ran 0-5%
     slower; at 64 they took 3% off the f32 backward (docs/notes-nvidia.md v29). */
  float qf[KT][4];
#if DP <= 64
  float of[KT][4];
#else
  float(*of)[4] = 0; /* dO's rows from L1 at each use */
#endif
#pragma unroll
  for (int kk = 0; kk < KT; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      qf[kk][e] = AROWS_AT(qa, kk, e);
#if DP <= 64
      of[kk][e] = AROWS_AT(oa, kk, e);
#endif
    }
#else
  /* Q and dO fragments (m16k16, row-major A) of each of the warp's QT m16 tiles: a0 a1 row g, columns 2t, 2t+1; a2
     a3 row g+8; a4..a7 the same eight columns on. Pairs are 4-byte aligned because every row starts on a 16-byte
     boundary. Rows beyond nq are zeros. */
#if QLOCAL
  /* The warp's rows' A fragments in the local Q and dO tiles (ldmatrix, A_LANE offsets), tile mt 16 rows on. */
  const tile_ref q_a = TILE_REF(Qls + wrow * DS + A_LANE(lane)), o_a = TILE_REF(Ols + wrow * DS + A_LANE(lane));
#else
  uint qa[QT][KT][4], oa[QT][KT][4];
#pragma unroll
  for (int mt = 0; mt < QT; ++mt) {
    const int m0 = r0 + 16 * mt, m1 = r1 + 16 * mt;
    __global const store_t *p0 = q + qbase + (long)m0 * q_sn, *p1 = q + qbase + (long)m1 * q_sn;
    __global const store_t *o0 = d_o + obase + (long)m0 * o_sn, *o1 = d_o + obase + (long)m1 * o_sn;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const int c0 = kk * 16 + 2 * t, c1 = c0 + 8;
      qa[mt][kk][0] = m0 < nq && c0 < D ? *(__global const uint *)(p0 + c0) : 0u;
      qa[mt][kk][1] = m1 < nq && c0 < D ? *(__global const uint *)(p1 + c0) : 0u;
      qa[mt][kk][2] = m0 < nq && c1 < D ? *(__global const uint *)(p0 + c1) : 0u;
      qa[mt][kk][3] = m1 < nq && c1 < D ? *(__global const uint *)(p1 + c1) : 0u;
      oa[mt][kk][0] = m0 < nq && c0 < D ? *(__global const uint *)(o0 + c0) : 0u;
      oa[mt][kk][1] = m1 < nq && c0 < D ? *(__global const uint *)(o1 + c0) : 0u;
      oa[mt][kk][2] = m0 < nq && c1 < D ? *(__global const uint *)(o0 + c1) : 0u;
      oa[mt][kk][3] = m1 < nq && c1 < D ? *(__global const uint *)(o1 + c1) : 0u;
    }
  }
#endif
  const float Ltail = 0.0f;
#endif
  /* The lane's rows' lse (log2 units) and Dvec: row r0 + 16 mt + 8 hr at [mt][hr]. */
  float Lr[QT][2], Dr[QT][2];
#pragma unroll
  for (int mt = 0; mt < QT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = r0 + 16 * mt + 8 * hr;
      Lr[mt][hr] = row < nq ? lse[lbase + row] * FCL_LOG2E : Ltail;
      Dr[mt][hr] = row < nq ? dvec[lbase + row] : 0.0f;
    }

  float acc[QT][OT][4];
#pragma unroll
  for (int mt = 0; mt < QT; ++mt)
#pragma unroll
    for (int i = 0; i < OT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][i][e] = 0.0f;
  const float qk_scale = scale * FCL_LOG2E;
  const tile_ref k_n = TILE_REF(Ks + BN_LANE(lane)), v_n = TILE_REF(Vs + BN_LANE(lane));
  const tile_ref k_k = TILE_REF(Ks + BK_LANE(lane));

  for (int j = 0; j < ntiles; ++j) {
    const int kc = kv_begin + j * BN;
    const int boff = (j & 1) * BN * DS; /* elements to this tile's buffer */
    CP_ASYNC_WAIT_ALL();          /* K(j), V(j) have landed for this work-item ... */
    barrier(CLK_LOCAL_MEM_FENCE); /* ... and for all; every warp is done with the other buffer (tile j - 1) */
    if (j + 1 < ntiles) {
      const int nb = ((j + 1) & 1) * BN * DS;
      fcl_load_rows(Ks + nb, kh, k_sn, kc + BN, BN, nk, lid, KEY_PERM);
      fcl_load_rows(Vs + nb, vh, v_sn, kc + BN, BN, nk, lid, KEY_PERM);
      CP_ASYNC_COMMIT();
    }

    /* The tile in chunks of QN n8 tiles of keys: one chunk of the whole tile, or with QT m16 tiles a warp chunks of
       16 keys (32 with QLOCAL), so that S and dP of both tiles fit in registers beside their fragments. */
#if QT > 1
#pragma unroll 1 /* one chunk's fragments live at a time */
#endif
    for (int ch = 0; ch < NT / QN; ++ch) {
      /* dP = dO V^T, S = Q K^T. */
      float dp[QT][QN][4], s[QT][QN][4];
#if DTYPE == 0
      fcl_mma_abt_from(dp[0], oa, of, TILE_AT(v_n, boff));
      fcl_mma_abt_from(s[0], qa, qf, TILE_AT(k_n, boff));
#else
#pragma unroll
      for (int mt = 0; mt < QT; ++mt)
#pragma unroll
        for (int i = 0; i < QN; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[mt][i][e] = s[mt][i][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
#if QLOCAL
        uint qf[QT][4], of[QT][4]; /* this k step's fragments of both tiles, read once for the chunk's keys */
#pragma unroll
        for (int mt = 0; mt < QT; ++mt) {
          LDSM_X4(of[mt][0], of[mt][1], of[mt][2], of[mt][3], TILE_AT(o_a, mt * 16 * DS + kk * 16));
          LDSM_X4(qf[mt][0], qf[mt][1], qf[mt][2], qf[mt][3], TILE_AT(q_a, mt * 16 * DS + kk * 16));
        }
#define QFRAG(mt) qf[mt]
#define OFRAG(mt) of[mt]
#else
#define QFRAG(mt) qa[mt][kk]
#define OFRAG(mt) oa[mt][kk]
#endif
#pragma unroll
        for (int np = 0; np < QN / 2; ++np) {
          const int at = boff + (ch * (QN / 2) + np) * 16 * DS + kk * 16;
          uint b0, b1, b2, b3;
          LDSM_X4(b0, b1, b2, b3, TILE_AT(v_n, at));
#pragma unroll
          for (int mt = 0; mt < QT; ++mt) {
            MMA(dp[mt][2 * np], OFRAG(mt), b0, b1);
            MMA(dp[mt][2 * np + 1], OFRAG(mt), b2, b3);
          }
          LDSM_X4(b0, b1, b2, b3, TILE_AT(k_n, at));
#pragma unroll
          for (int mt = 0; mt < QT; ++mt) {
            MMA(s[mt][2 * np], QFRAG(mt), b0, b1);
            MMA(s[mt][2 * np + 1], QFRAG(mt), b2, b3);
          }
        }
#undef QFRAG
#undef OFRAG
      }
#endif

      /* dS in place of S (P is not needed further here). Tiles that a window or the sequence's end cuts take each
         entry through the mask layer; whole tiles with modifiers take them without the visibility tests, below.
         (The test after the products, as for one tile a warp: before them it cost clang's build registers.) */
      const int masked = fcl_tile_masked(&mods, q0, q_last, kc, BN, nk);
#pragma unroll
      for (int mt = 0; mt < QT; ++mt) {
        if (masked) {
#pragma unroll
          for (int i = 0; i < QN; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = r0 + 16 * mt + (e >> 1) * 8;
              const int col = kc + TILE_KEY(ch * QN + i, 2 * t + (e & 1));
              float p, ds;
              MMA_P_DS(p, ds, &mods, s[mt][i][e], dp[mt][i][e], row, col, Lr[mt][e >> 1], Dr[mt][e >> 1]);
              s[mt][i][e] = ds;
            }
        }
#if SCORE_MODS
        else {
          /* A tile every row sees whole: softcap, ALiBi and the mask alone, each row's mask through one pointer a
             tile, a pair of keys a load with MASK_PAIRS, a run of 2 NT keys by 16-byte loads with KEY_PERM (as the
             forward reads it). Rows past nq read row q_last's mask and, like a row that saw nothing (L = -inf),
             get P = 0. */
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int row = r0 + 16 * mt + 8 * hr, ri = min(row, q_last);
            const int live = (Lr[mt][hr] != -INFINITY) & (row < nq);
#if MASK && KEY_PERM
            __global const mask_t *mrow = mods.mask + (long)ri * mods.mask_sn + kc + 2 * NT * t;
            mask_pair_t mrun[NT];
#pragma unroll
            for (int u = 0; u < NT / MASK_RUN_PAIRS; ++u)
              fcl_mask_16(mrow + 2 * MASK_RUN_PAIRS * u, mrun + MASK_RUN_PAIRS * u);
#elif MASK
            __global const mask_t *mrow = mods.mask + (long)ri * mods.mask_sn + kc + 2 * t;
#endif
#pragma unroll
            for (int i = 0; i < QN; ++i) {
#if MASK && KEY_PERM
              const float2 mv = MASK_PAIR_VALUES(mrun[ch * QN + i]);
#elif MASK
              const float2 mv = MASK_PAIR(mrow + (ch * QN + i) * 8);
#endif
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int e = 2 * hr + c;
                const float t_ = fcl_softcap(&mods, s[mt][i][e] * qk_scale);
                float x = fcl_alibi(&mods, t_, ri, kc + TILE_KEY(ch * QN + i, 2 * t + c));
#if MASK
                x = fcl_add_mask(x, c ? mv.y : mv.x);
#endif
                const float p = select(0.0f, fcl_exp2(x - Lr[mt][hr]), live);
                const float u = t_ * mods.inv_cap;
                s[mt][i][e] = FCL_DS(p, dp[mt][i][e], Dr[mt][hr], u);
              }
            }
          }
        }
#else
        else {
#pragma unroll
          for (int i = 0; i < QN; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float p = native_exp2(fma(s[mt][i][e], qk_scale, -Lr[mt][e >> 1]));
              s[mt][i][e] = p * (dp[mt][i][e] - Dr[mt][e >> 1]);
            }
        }
#endif
      }
      uint da[QT * QK][PA_REGS];
#pragma unroll
      for (int mt = 0; mt < QT; ++mt) fcl_pack_a(da + mt * QK, s[mt]);
      /* dQ += dS K (the chunk's keys), each fragment of K serving the QT tiles. */
#if DTYPE == 0
      fcl_mma_ab(acc[0], da, TILE_AT(k_k, boff));
#else
      fcl_mma_ab_tiles(acc, da, TILE_AT(k_k, boff + ch * QN * 8 * DS));
#endif
    }
  }

  /* Non-finite accumulators: the affected rows of the warp again in float32 over the same keys, adding dS K
     only where dS != 0, as flash_bwd.cl does. */
  int nonfinite = 0;
#pragma unroll
  for (int mt = 0; mt < QT; ++mt)
#pragma unroll
    for (int i = 0; i < OT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) nonfinite |= fcl_nonfinite(acc[mt][i][e]);
  if (fcl_warp_any(nonfinite)) {
#pragma unroll
    for (int mt = 0; mt < QT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        int bad = 0;
        FCL_ROW_NONFINITE(bad, acc[mt], OT, hr);
        bad = fcl_quad_any(bad);
        const int row = r0 + 16 * mt + hr * 8;
        if (!bad || row >= nq) continue;
#pragma unroll
        for (int i = 0; i < OT; ++i) acc[mt][i][2 * hr] = acc[mt][i][2 * hr + 1] = 0.0f;
        __global const store_t *qr = q + qbase + (long)row * q_sn, *orow = d_o + obase + (long)row * o_sn;
        const float L = lse[lbase + row] * FCL_LOG2E, Dv = dvec[lbase + row];
        for (int c = kv_begin; c < kv_end; ++c) {
          __global const store_t *kr = kh + (long)c * k_sn;
          float x, y;
          fcl_dot2(qr, kr, orow, vh + (long)c * v_sn, &x, &y);
          float p, ds;
          MMA_P_DS(p, ds, &mods, x, y, row, c, L, Dv);
          if (ds != 0.0f)
#pragma unroll
            for (int i = 0; i < OT; ++i)
              if (i * 8 + 2 * t < D) {
                acc[mt][i][2 * hr] = fma(ds, LOAD(kr, i * 8 + 2 * t), acc[mt][i][2 * hr]);
                acc[mt][i][2 * hr + 1] = fma(ds, LOAD(kr, i * 8 + 2 * t + 1), acc[mt][i][2 * hr + 1]);
              }
        }
      }
  }

  /* dQ (scaled) through local memory, so the global writes are 16 bytes a work-item. */
  CP_ASYNC_WAIT_ALL();
  barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the K and V tiles */
  __local elem_t *Qs = Ks;
  const float qs = seq.bad ? NAN : scale;
#pragma unroll
  for (int mt = 0; mt < QT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int rl = wrow + 16 * mt + g + hr * 8;
#pragma unroll
      for (int i = 0; i < OT; ++i)
        STORE_PAIR(Qs + rl * DS + i * 8 + 2 * t, acc[mt][i][2 * hr] * qs, acc[mt][i][2 * hr + 1] * qs);
    }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int c = lid; c < BM * CH; c += WG) {
    const int r = c / CH, cc = c % CH;
    const int row = q0 + r;
    if (row < nq && cc * EPC < D)
      *(__global uint4 *)(d_q + qbase + (long)row * q_sn + cc * EPC) = *(__local const uint4 *)(Qs + r * DS + cc * EPC);
  }
}

#else
#error "flash_bwd_mma: MMA_KIND must be 1 (dK/dV) or 2 (dQ)"
#endif
