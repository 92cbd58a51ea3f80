/* PTX building blocks of the NVIDIA tensor-core kernels (flash_fwd_mma.cl, flash_bwd_mma.cl; the host
 * builds each after common.cl and this file): the mma.sync m16n8k16 product with f16 or bf16 operands and
 * float accumulators (DTYPE 1 or 2), the m16n8k8 product of float operands split into TF32 parts (DTYPE 0),
 * ldmatrix, cp.async, mbarriers, the conversion of float pairs to the storage type, and the warp vote and quad
 * shuffles the online softmax and the non-finite checks use. */
#if DTYPE == 1
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define CVT_OP "cvt.rn.f16x2.f32"
#elif DTYPE == 2
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define CVT_OP "cvt.rn.bf16x2.f32"
#elif DTYPE != 0 /* f32 takes the TF32 products below */
#error "the tensor-core kernels take DTYPE 0 (f32, TF32 products), 1 (f16) or 2 (bf16)"
#endif

/* The 32-bit shared-window address of a local pointer, as ldmatrix and cp.async take it. */
#define SMEM_ADDR(p) ((uint)(size_t)(p))

/* 16 bytes global -> local, asynchronously; bytes 0 zero-fills the destination and reads nothing. The L2
   fetches the whole 128-byte line (the hint measured 1-2% faster on decode, docs/notes-nvidia.md v16). */
#define CP_ASYNC16(dst, src, bytes)                                                                      \
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(SMEM_ADDR(dst)),         \
               "l"((ulong)(src)),                                                                        \
               "r"(bytes)                                                                              \
               : "memory")
#define CP_ASYNC_COMMIT() asm volatile("cp.async.commit_group;\n" ::: "memory")
/* Wait until at most n of this work-item's committed groups are pending; n is a literal (the instruction takes
   an immediate), expanded first so that a macro naming one can be passed. */
#define CP_ASYNC_WAIT_STR_(n) #n
#define CP_ASYNC_WAIT_GROUP(n) asm volatile("cp.async.wait_group " CP_ASYNC_WAIT_STR_(n) ";\n" ::: "memory")
#define CP_ASYNC_WAIT_ALL() CP_ASYNC_WAIT_GROUP(0)
#define CP_ASYNC_WAIT_BUT_ONE() CP_ASYNC_WAIT_GROUP(1)

/* mbarriers (64-bit words in local memory, by shared-window address; waiting on a phase's parity takes compute
   capability 9.0): a phase completes when its count of arrivals has come in. Arrivals release this work-item's
   earlier accesses; a wait that sees the phase complete acquires those of every arrival. */
#define MBAR_INIT(bar, count) asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory")
/* After MBAR_INIT, before any other work-item or copy arrives on the mbarrier. */
#define MBAR_INIT_FENCE() asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory")
#define MBAR_ARRIVE(bar) asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(bar) : "memory")
/* An arrival on bar once this work-item's cp.async copies issued so far have landed (counted in the phase's
   arrivals given to MBAR_INIT). */
#define CP_ASYNC_MBAR_ARRIVE(bar) asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory")
/* Until the phase of parity `parity` (0 for the first, 1 for the second, ...) has completed. */
#define MBAR_WAIT(bar, parity)                                                                               \
  asm volatile("{\n .reg .pred p_;\n WAIT_:\n mbarrier.try_wait.parity.shared.b64 p_, [%0], %1;\n @!p_ bra WAIT_;\n}\n" \
               ::"r"(bar), "r"(parity)                                                                       \
               : "memory")
/* The warp's work-items meet, and their earlier memory accesses are ordered before what each does next. */
#define WARP_SYNC() asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory")

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it. */
#define LDSM_X4(r0, r1, r2, r3, addr)                                                    \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"       \
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)                                \
               : "r"(addr))
#define LDSM_X4_T(r0, r1, r2, r3, addr)                                                  \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" \
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)                                \
               : "r"(addr))

/* c (float[4]) += A (uint[4], m16k16 row-major) * B (b0 b1, k16n8 column-major). It touches no memory,
   so it need not be volatile; MMA_VOLATILE=1 keeps the mma instructions in source order. */
#ifndef MMA_VOLATILE
#define MMA_VOLATILE 0
#endif
#if MMA_VOLATILE
#define MMA_ASM asm volatile
#else
#define MMA_ASM asm
#endif
#define MMA(c, a, b0, b1)                                                                              \
  MMA_ASM(MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                     \
               : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                              \
               : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1))

#if DTYPE != 0
/* Two floats rounded to the storage type and packed, lo in the low half. */
inline uint fcl_pack2(float lo, float hi) {
  uint r;
  asm(CVT_OP " %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#else
/* Float products on tensor cores (3xTF32): each operand x is split into big = tf32(x) (11 significant bits,
   rounded to nearest) and small = x - big, and a b is taken as big_a big_b + big_a small_b + small_a big_b,
   three TF32 products with float accumulators; the dropped small_a small_b is 2^-22 of a b, near float's own
   rounding (one TF32 product alone is 2^-11: 1000 times float's error). The tensor cores read a TF32 operand's
   top 19 bits and ignore the rest, so small goes in as it is (truncated: 2^-21 of x at most) and big is
   rounded by adding half a TF32 ulp to the bits and clearing the 13 low ones: three instructions a split,
   where the split through cvt.rna.tf32.f32 took seven (the conversion guards non-finite values with a compare
   and a select). A NaN's big may come out finite, but its small is x - big, a NaN, so the products stay NaN;
   infinity gives big = x and small NaN, as cvt.rna does. */
inline uint fcl_tf32_big(float x) { return (as_uint(x) + 0x1000u) & 0xffffe000u; }
#define TF32_SPLIT(big, small, x)                 \
  do {                                            \
    const float x_ = (x);                         \
    (big) = fcl_tf32_big(x_);                     \
    (small) = as_uint(x_ - as_float(big));        \
  } while (0)
/* c (float[4]) += A (m16k8, a0 row g col t, a1 row g+8 col t, a2 row g col t+4, a3 row g+8 col t+4) * B
   (k8n8, b0 row t col g, b1 row t+4 col g), TF32 operands. */
#define MMA_TF32(c, a0, a1, a2, a3, b0, b1)                                                        \
  MMA_ASM("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "     \
          "{%8,%9}, {%0,%1,%2,%3};\n"                                                              \
          : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                                  \
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
/* a b in 3xTF32, the small products first into lo, then big_a big_b into hi; ab, as: A's big and small parts
   (uint[4]); bb*, bs*: B's. With two accumulators, added in float arithmetic at the end, there are two
   dependency chains instead of one, so that a warp with few accumulator tiles does not wait on each mma's
   latency in turn; MMA3 is the one-accumulator form. */
#define MMA3_HL(hi, lo, ab, as, bb0, bb1, bs0, bs1)                           \
  do {                                                                         \
    MMA_TF32(lo, (ab)[0], (ab)[1], (ab)[2], (ab)[3], bs0, bs1);                \
    MMA_TF32(lo, (as)[0], (as)[1], (as)[2], (as)[3], bb0, bb1);                \
    MMA_TF32(hi, (ab)[0], (ab)[1], (ab)[2], (ab)[3], bb0, bb1);                \
  } while (0)
#define MMA3(c, ab, as, bb0, bb1, bs0, bs1) MMA3_HL(c, c, ab, as, bb0, bb1, bs0, bs1)
#endif

/* The mask values at p[0] and p[1] (MASK). With MASK_PAIRS (from the host: the mask's offset and strides are
   even, so the pair of an even key starts on 4 bytes, 8 for f32) by one load instead of two: a warp's mask load
   touches eight rows' cache lines, and halving the loads halves those accesses. */
#ifndef MASK_PAIRS
#define MASK_PAIRS 0
#endif
#ifndef MASK_VEC
#define MASK_VEC 0 /* 1 (host): the mask's offset and strides are multiples of 16 bytes */
#endif
#if MASK && MASK_PAIRS
#if MASK != 1
/* The two mask values of 2 bytes in the word w, the lower address first. */
inline float2 fcl_mask_word(uint w) {
#if MASK == 2
  float lo, hi;
  asm("{\n .reg .b16 l_, h_;\n mov.b32 {l_, h_}, %2;\n cvt.f32.f16 %0, l_;\n cvt.f32.f16 %1, h_;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(w));
  return (float2)(lo, hi);
#else
  return (float2)(as_float(w << 16), as_float(w & 0xffff0000u));
#endif
}
#endif
inline float2 fcl_mask_pair(__global const mask_t *p) {
#if MASK == 1
  return *(__global const float2 *)p;
#else
  return fcl_mask_word(*(__global const uint *)p);
#endif
}
#if MASK_VEC
/* A row's mask pairs (keys 2u, 2u + 1) as loaded: a word of two 2-byte values, or a float2; the values of pair w are
   MASK_PAIR_VALUES(w), converted where they are used so that a run of them takes half the registers (2 bytes). */
#if MASK == 1
typedef float2 mask_pair_t;
#define MASK_PAIR_VALUES(w) (w)
#else
typedef uint mask_pair_t;
#define MASK_PAIR_VALUES(w) fcl_mask_word(w)
#endif
#define MASK_RUN_PAIRS (16 / (int)sizeof(mask_pair_t)) /* pairs a 16-byte load holds */
/* The pairs of one 16-byte load at p (on 16 bytes: MASK_VEC) into out[0 .. MASK_RUN_PAIRS - 1]. */
inline void fcl_mask_16(__global const mask_t *p, mask_pair_t *out) {
#if MASK == 1
  const float4 a = *(__global const float4 *)p;
  out[0] = a.xy, out[1] = a.zw;
#else
  const uint4 w = *(__global const uint4 *)p;
  out[0] = w.x, out[1] = w.y, out[2] = w.z, out[3] = w.w;
#endif
}
#endif
#define MASK_PAIR(p) fcl_mask_pair(p)
#elif MASK
#define MASK_PAIR(p) ((float2)(MASK_LOAD((p), 0), MASK_LOAD((p), 1)))
#endif

/* KEY_PERM (each kernel defines it, with its own conditions: a mask whose rows start on 16 bytes, MASK_VEC from the
   host, and key tiles of NT n8 tiles, NT a multiple of 4, among them): the local K and V tiles hold
   their keys in an order that gives each lane a run of consecutive keys. The accumulator of S's n8 tile i holds,
   in lane (g, t), columns 2t and 2t + 1, which are local tile rows 8i + 2t and + 1; storing the tile's key
   2 NT a + 2i + c (a < 4, c < 2) at local row 8i + 2a + c makes lane t's columns over all i the keys
   2 NT t .. 2 NT t + 2 NT - 1, so its mask values come from one run of a row, 16 bytes a load, where the natural
   order asks for a pair of keys a load at eight rows' lines each. K and V are stored in the same order, so each
   product pairs a column of S with the same key's row: the products' code is unchanged, only the copies'
   destination rows (TILE_ROW(r): the local row of the tile's key r) and the keys the modifiers and visibility
   tests see (TILE_KEY(i, n): the key at column n of n8 tile i). Whole tiles read the mask at keys k0 + ... by
   aligned loads (pairs with MASK_PAIRS, runs with KEY_PERM) from keys that are multiples of MASK_ALIGN: every tile
   starts on one, since a block's first key is rounded down to it (FCL_BLOCK_KEY_BEGIN) and tiles and split-KV
   chunks are multiples of 16 keys (MASK_ALIGN is at most 8). */
#define TILE_ROW(r) (KEY_PERM ? 8 * (((r) % (2 * NT)) >> 1) + 2 * ((r) / (2 * NT)) + ((r) & 1) : (r))
#define TILE_KEY(i, n) (KEY_PERM ? 2 * NT * ((n) >> 1) + 2 * (i) + ((n) & 1) : 8 * (i) + (n))
#define MASK_ALIGN (KEY_PERM ? 16 / (int)sizeof(mask_t) : MASK_PAIRS ? 2 : 1)
/* The first key of a block whose first row is i: that row's first visible key (non-zero only with a sliding window)
   rounded down to MASK_ALIGN. The few keys before the window fall in the first tile, which the window cuts, so that
   tile takes the per-entry path, which hides them. */
#define FCL_BLOCK_KEY_BEGIN(m, i) (fcl_key_begin((m), (i)) & ~(MASK_ALIGN - 1))

/* A hint to bring the line at p into L1 (prefetch.global.L1): no register waits for it. */
inline void fcl_prefetch_l1(__global const void *p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }

/* 1 when p is non-zero in any lane of the warp. */
inline int fcl_warp_any(int p) {
  int r;
  asm volatile("{\n .reg .pred p_, q_;\n setp.ne.s32 p_, %1, 0;\n vote.sync.any.pred q_, p_, 0xffffffff;\n"
               " selp.s32 %0, 1, 0, q_;\n}\n"
               : "=r"(r)
               : "r"(p));
  return r;
}

inline float fcl_shfl_xor1(float x) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;\n" : "=f"(r) : "f"(x));
  return r;
}

inline float fcl_shfl_xor2(float x) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, 2, 0x1f, 0xffffffff;\n" : "=f"(r) : "f"(x));
  return r;
}

/* bad |= whether one of the n m16n8 accumulator tiles acc[0 ..] holds a NaN or inf in the lane's row half hr (c0
   c1, row g, for hr 0; c2 c3, row g + 8, for 1); fcl_quad_any then tells the quad, whose four lanes hold the row
   together. A macro, so that the accumulators stay registers (a function taking them by pointer put them in a
   stack frame, in clang's build at least). */
#define FCL_ROW_NONFINITE(bad, acc, n, hr)                                                              \
  do {                                                                                                \
    _Pragma("unroll") for (int i_ = 0; i_ < (n); ++i_) (bad) |=                                       \
        fcl_nonfinite((acc)[i_][2 * (hr)]) | fcl_nonfinite((acc)[i_][2 * (hr) + 1]);                  \
  } while (0)

inline int fcl_quad_any(int x) {
  x |= as_int(fcl_shfl_xor1(as_float(x)));
  return x | as_int(fcl_shfl_xor2(as_float(x)));
}
