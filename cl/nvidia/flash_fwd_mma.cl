/* Tensor-core FlashAttention-2 forward for NVIDIA GPUs of compute capability 8.0 and up, through inline
 * PTX: mma.sync m16n8k16 (f16 or bf16 operands, float accumulators), ldmatrix and cp.async. f32 (DTYPE 0)
 * takes mma.sync m16n8k8 with each float split into two TF32 parts and three products a product (3xTF32,
 * ptx.cl), reading its float fragments from local memory without ldmatrix; see "f32" below.
 *
 * A work-group of NW warps owns BR = NW * MT * 16 query rows of one (batch, head); each warp owns MT
 * tiles of 16 rows and keeps its O accumulator in registers; its Q fragments live in registers
 * (QSMEM 0) or in a local Q tile read by ldmatrix at each k step (QSMEM 1: fewer registers, so that 32
 * rows a warp fit at head_dim 128). With QSMEM 1, QREG > 0 keeps the first QREG k steps' fragments in
 * registers and only the columns after them in the local tile (f16/bf16): less local memory for a few
 * registers, so that a larger work-group's Q tile fits. K and V tiles of BC rows stream through a ring of
 * STAGES local buffers with cp.async, in the order K(0), V(0), K(1), V(1), ...: each is waited for when it
 * is needed and the tile STAGES - 1 further on is issued into the buffer just freed. With two buffers V(j)
 * loads while S = Q K(j)^T is computed and K(j+1) while O += P V(j) is; more keep more bytes in flight for
 * decode, where there is little to compute between the waits.
 * S is computed and softmaxed in the mma accumulator layout; its rounded probabilities are reused in
 * registers directly as the A operand of P V.
 *
 * Defines (src/plan_nvidia.c): DTYPE 1 (f16), 2 (bf16) or 0 (f32), D head_dim (a multiple of 8), DP D rounded
 * up to the k step (16; 8 for f32), DS local row stride in elements (DP + 8: rows 16 bytes apart modulo 128, so
 * ldmatrix is free of bank conflicts; DP + 4 for f32, see "f32" below), NW, MT, BC, QSMEM, QREG, STAGES. The
 * switches LAZY_RESCALE, MMA_VOLATILE and CAUSAL_FIRST_LONGEST are for measurements (docs/notes-nvidia.md);
 * the library keeps their defaults. The host takes this kernel only when every row of q, k, v and o starts
 * on a 16-byte boundary and scale > 0. Key rows beyond seqlen_k and columns beyond D are zero-filled in local
 * memory (cp.async with source size 0 reads nothing); tile rows beyond the problem's are computed on zeros and
 * never written.
 *
 * SPLIT 1 (split-KV, common.cl): the launch's first dimension also covers `splits` chunks of whole key tiles
 * of each row block's visible keys (fcl_split_keys, as the portable kernel cuts them); each work-group writes
 * its rows' partial O (float32, normalised by its own sum) and lse, without the sink, into part_o / part_lse
 * for combine.cl.
 *
 * PACK 1 (GQA packing for few query rows, common.cl's ROW_I, ROW_HEAD and ROW_OFF as the portable kernel
 * uses them): a work-group owns a kv head, and the rows of its tile are the (query row i, head) pairs of the
 * heads that share it, packed r = i * group + hg (head hk * group + hg), so K and V are read once for the
 * whole group. Every row keeps its own i for the window, causal position and
 * mask row, and its own head for ALiBi, the mask and the sink; a block's key range runs from the first
 * key of its first i to the last of its last i (r / group grows with r).
 *
 * Sequences (common.cl's VARLEN_Q, KV, SEQLENS_K): each work-group takes its sequence's lengths and rows;
 * packed K/V (KV 1) shift the base, paged K/V (KV 2) resolve each tile's key rows into local memory a tile
 * ahead of their loads (`page`). A key of a block outside the pool is read as NaN, so exactly the rows that see it become
 * NaN; a sequence whose key indices do not fit gets NaN O and lse; one whose query rows do not fit is not
 * written.
 *
 * Accumulator fragment of one m16n8 tile, lane = 4 g + t: c0 c1 at row g, columns 2t and 2t+1; c2 c3 at
 * row g + 8. So each lane holds two rows of S (hr = 0: row g, hr = 1: row g + 8), and the four lanes of a
 * quad together hold a row: row maxima and sums reduce over the quad with shfl.bfly 1 and 2.
 *
 * f32 (DTYPE 0): tiles hold floats, rows DS = DP + 4 floats apart (4 modulo 32 words when DP is a multiple
 * of 32), so that a warp's float reads of Q and K (row g, word t) and of V (row 2t, word g) fall in 32 banks.
 * Q's fragments are floats, in registers (QSMEM 0) or read from the local Q tile at each k step (QSMEM 1),
 * split once a key tile. In P V the keys of an 8-key step are taken in the order 0 2 4 6 1 3 5 7 (k = t is
 * key 2t, k = t + 4 is key 2t + 1), so the S accumulator of n8 tile i is, as it stands, the A operand of
 * step i (a0 = c0, a1 = c2, a2 = c1, a3 = c3), and V's b0, b1 come from key rows 2t and 2t + 1. Each n8 tile
 * of O sums a key tile's products in fresh accumulators and then adds them to O in float arithmetic: the
 * tensor cores' own additions are not rounded to nearest, and chained across thousands of keys their error
 * grew with the sequence (measured on the H200, docs/notes-portable.md v10).
 */

#define WG (NW * 32)
#define BR (NW * MT * 16)
#if DTYPE == 0
typedef float elem_t;  /* an element of a local tile */
#define EPC 4          /* elements in 16 bytes */
#define KSTEP 8        /* head_dim columns a k step of Q K^T */
typedef float qfrag_t; /* a register of Q's A fragment: the float at column t of a k step */
#define QFRAG_COL(kk, t) ((kk) * 8 + (t))
#define QFRAG_LOAD(p) (*(p))
#else
typedef ushort elem_t;
#define EPC 8
#define KSTEP 16
typedef uint qfrag_t; /* the pair at columns 2t, 2t + 1 (4-byte aligned: every row starts on 16 bytes) */
#define QFRAG_COL(kk, t) ((kk) * 16 + 2 * (t))
#define QFRAG_LOAD(p) (*(__global const uint *)(p))
#endif
#define KT (DP / KSTEP) /* k steps of Q K^T over the head dimension */
#define NT (BC / 8)     /* n8 tiles of S */
#define PT (BC / 16)    /* k steps of P V over the keys (f16, bf16) */
#define OT (DP / 8)     /* n8 tiles of O */
#define CH (DP / EPC)   /* 16-byte chunks in a row of a tile */
#define TILE (BC * DS)
/* K and V tiles in lane-run order where the mask's rows start on 16 bytes (ptx.cl's KEY_PERM), with a sliding
   window too: 5% off an f16 mask under a window at head_dim 128 on an H100 (docs/notes-nvidia.md, v33). */
#define KEY_PERM (MASK && MASK_VEC && NT % 4 == 0)
#ifndef QSMEM
#define QSMEM 0 /* 1: Q stays in local memory and its fragments are loaded per k step (frees registers) */
#endif
#ifndef QREG
#define QREG 0 /* with QSMEM: the first QREG k steps of Q stay in registers, the local tile holds the rest */
#endif
#if QREG && (!QSMEM || DTYPE == 0 || QREG >= KT)
#error "flash_fwd_mma: QREG takes QSMEM 1, f16 or bf16, and fewer k steps than the head dimension has"
#endif
#define QC0 (QREG * KSTEP)         /* the local Q tile's first column */
#define QDS (DS - QC0)             /* its row stride: 16 bytes past a multiple of 32 as DS is, for ldmatrix */
#define QCH ((DP - QC0) / EPC)     /* 16-byte chunks in a row of it */
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 1 /* 1: skip reducing row maxima and rescaling O when no reference maximum of the warp moves */
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8.0f /* log2 units a row's maximum may pass its reference before the reference moves */
#endif
#ifndef STAGES
#define STAGES 2 /* tile buffers of the K/V ring; STAGES - 1 tiles in flight while one is read */
#endif
/* When a tile is needed, the STAGES - 2 groups committed after it may stay pending (as a literal:
   cp.async.wait_group takes an immediate). */
#if STAGES < 2 || STAGES > 8
#error "flash_fwd_mma: STAGES is 2..8"
#endif
#define RING_PENDING_2 0
#define RING_PENDING_3 1
#define RING_PENDING_4 2
#define RING_PENDING_5 3
#define RING_PENDING_6 4
#define RING_PENDING_7 5
#define RING_PENDING_8 6
#define RING_PENDING_(s) RING_PENDING_##s
#define RING_PENDING(s) RING_PENDING_(s)
#define RING_WAIT() CP_ASYNC_WAIT_GROUP(RING_PENDING(STAGES))
#ifndef MBAR_RING
#define MBAR_RING 0 /* 1: the ring's tiles synchronised by mbarriers, not work-group barriers (compute capability 9.0) */
#endif
#if MBAR_RING && KV == 2
#error "flash_fwd_mma: paged keys resolve their rows between the ring's barriers (MBAR_RING 0)"
#endif
#define QOFF (STAGES * TILE)                 /* the Q tile [BR][DS] after the K/V ring */
#define KVQ (STAGES * TILE + QSMEM * BR * QDS) /* elements: the K/V ring (and Q); later the O tile */
#define SMEM (KVQ > BR * DS ? KVQ : BR * DS)
#if DP % KSTEP != 0 || BC % 16 != 0 || D > DP || DS % EPC != 0
#error "flash_fwd_mma: inconsistent tile defines"
#endif

/* Rows k0.. of a [rows, D] tensor into a local tile [BC][DS], zero beyond nk and D; one commit group. With
   paged keys (KV 2) src is the (pool, kv head) base and rows the tile's rows' element offsets from it, -1 for
   a row of a block outside the pool, which is filled with NaN. */
#if DTYPE == 0
#define NAN2 0x7fc00000u /* a float NaN */
#elif DTYPE == 1
#define NAN2 0x7e007e00u /* two f16 NaNs */
#else
#define NAN2 0x7fc07fc0u /* two bf16 NaNs */
#endif
#define NCOPY ((BC * CH + WG - 1) / WG) /* 16-byte copies a work-item makes of a tile */
#if KV == 2
/* Paged keys: the copies go in groups of PG. A group's row offsets are read from local memory first and its
   copies are then issued without a branch, so a work-item waits for the reads once a group instead of once a
   copy (read, test and copy one at a time, the one-warp decode kernel spent about 2 us a tile more than with
   dense keys; docs/notes-nvidia.md, v15). A row of a block outside the pool (a scheduler's bug, never in normal
   use) is zero-filled by its copy and overwritten with NaN once this work-item's copies have landed. The
   groups are not unrolled into each other: with every copy's 64-bit offset live at once NVIDIA's compiler
   spilled 292 B (v11). Groups of eight, or four where a warp holds two row tiles: their accumulators leave
   fewer registers (at head_dim 128 with eight the 2 x 2 x 32 shape spilled 108 B, 12 B before; v15). */
#define PG (MT == 1 && NCOPY % 8 == 0 ? 8 : NCOPY % 4 == 0 ? 4 : NCOPY % 2 == 0 ? 2 : 1)
inline void fcl_load_tile(__local elem_t *dst, __global const store_t *src, long sn, __local const long *rows,
                          int k0, int nk, int lid) {
  (void)sn;
  int bad = 0;
#pragma unroll 1
  for (int i0 = 0; i0 < NCOPY; i0 += PG) {
    long off[PG];
#pragma unroll
    for (int u = 0; u < PG; ++u) off[u] = rows[min((lid + (i0 + u) * WG) / CH, BC - 1)];
#pragma unroll
    for (int u = 0; u < PG; ++u) {
      const int c = lid + (i0 + u) * WG;
      if ((BC * CH) % WG == 0 || c < BC * CH) {
        const int r = c / CH, cc = c % CH;
        const bool ok = k0 + r < nk && cc * EPC < D, in = ok && off[u] >= 0;
        bad |= ok && off[u] < 0;
        CP_ASYNC16(dst + TILE_ROW(r) * DS + cc * EPC, in ? src + (off[u] + cc * EPC) : src, in ? 16 : 0);
      }
    }
  }
  CP_ASYNC_COMMIT();
  if (bad) {
    CP_ASYNC_WAIT_ALL(); /* the zero fills this work-item issued have landed (and the ring's other tile: paged
                            keys keep STAGES 2) */
    for (int i = 0; i < NCOPY; ++i) {
      const int c = lid + i * WG, r = c / CH, cc = c % CH;
      if (c < BC * CH && k0 + r < nk && cc * EPC < D && rows[r] < 0)
        *(__local uint4 *)(dst + TILE_ROW(r) * DS + cc * EPC) = (uint4)(NAN2, NAN2, NAN2, NAN2);
    }
  }
}
#else
inline void fcl_load_tile(__local elem_t *dst, __global const store_t *src, long sn, __local const long *rows,
                          int k0, int nk, int lid) {
  (void)rows;
#if WG % CH == 0
  /* A work-item's copies all lie in one 16-byte column cc, RS rows apart: one row pointer a tile and constant
     steps from it. Written as c / CH and c % CH of c = lid + i WG, the compiler (at 255 registers) worked out
     a row, a column and a 64-bit address for every copy of every tile (docs/notes-nvidia.md, v21). Offsets
     within the tile fit an int (the host bounds the row stride). */
#define RS (WG / CH)
  const int r0 = lid / CH, cc = lid % CH;
  __global const store_t *s0 = src + ((long)(k0 + r0) * sn + cc * EPC);
  __local elem_t *d0 = dst + TILE_ROW(r0) * DS + cc * EPC;
  /* Local rows from d0 to copy i's (KEY_PERM: with RS a multiple of 2 NT, copy i's row is r0's plus 2 i RS / 2 NT) */
#if !KEY_PERM
#define COPY_STEP(i) ((i) * RS)
#elif RS % (2 * NT) == 0
#define COPY_STEP(i) ((i) * RS / NT)
#else
#define COPY_STEP(i) (TILE_ROW(r0 + (i) * RS) - TILE_ROW(r0))
#endif
#pragma unroll
  for (int i = 0; i < NCOPY; ++i) {
    const int r = r0 + i * RS;
    if (BC % RS == 0 || r < BC) {
      const bool ok = k0 + r < nk && cc * EPC < D;
      CP_ASYNC16(d0 + COPY_STEP(i) * DS, ok ? s0 + i * RS * (int)sn : src, ok ? 16 : 0);
    }
  }
#undef COPY_STEP
#undef RS
#else
#pragma unroll
  for (int i = 0; i < NCOPY; ++i) {
    const int c = lid + i * WG;
    if ((BC * CH) % WG == 0 || c < BC * CH) {
      const int r = c / CH, cc = c % CH;
      const bool ok = k0 + r < nk && cc * EPC < D;
      __global const store_t *s = ok ? src + (long)k0 * sn + (r * (int)sn + cc * EPC) : src;
      CP_ASYNC16(dst + TILE_ROW(r) * DS + cc * EPC, s, ok ? 16 : 0);
    }
  }
#endif
  CP_ASYNC_COMMIT();
}
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void flash_fwd_mma(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                   __global store_t *o, __global float *lse,
                   long q_off, long q_sb, long q_sh, long q_sn,
                   long k_off, long k_sb, long k_sh, long k_sn,
                   long v_off, long v_sb, long v_sh, long v_sn,
                   long o_off, long o_sb, long o_sh, long o_sn,
                   int num_heads, int group, int nq_max, int nk_max, float scale, FCL_MOD_ARGS, FCL_SEQ_ARGS,
                   FCL_SPLIT_ARGS) {
  __local uint4 smem[SMEM / EPC]; /* uint4: 16-byte aligned for cp.async, ldmatrix and the O write */
  __local elem_t *Ks = (__local elem_t *)smem; /* the ring's first buffer */
  /* Paged keys (KV 2): each tile's rows' element offsets in K and in V, resolved once by the work-items of the
     rows into one of two slots (tile j's in slot j & 1): tiles 0 and 1 before the key loop, tile j + 2 at the
     end of iteration j, where the S and P registers are free (a table read there kept in registers across
     the iteration made the one-warp kernel spill 400 bytes). K(j + 2) loads mid-way through iteration j + 1,
     after the barrier that publishes it; slot j & 1's tile j was last read by V(j)'s load at the top of
     iteration j. The host counts these 32 BC bytes in the plan's local memory. */
  __local long page[KV == 2 ? 2 : 1][2][KV == 2 ? BC : 1];
#if KV == 2 && STAGES != 2
#error "flash_fwd_mma: a deeper ring loads tiles before their rows are resolved; paged keys take STAGES 2"
#endif
#if MBAR_RING
  /* The ring's mbarriers (MBAR_RING): ring_bar[0][s] completes a phase when every work-item's copies of buffer
     s's tile have landed, ring_bar[1][s] when every warp is done reading it. A warp waits for the tile it reads
     next, and before copying its share of a tile for the reads of the tile that buffer held before; no barrier
     of the whole work-group remains in the key loop, so a warp may run up to a copy ahead of the slowest. */
  __local ulong ring_bar[2][STAGES];
#endif

  const int lid = get_local_id(0);
  const int lane = lid & 31, warp = lid >> 5;
  const int g = lane >> 2, t = lane & 3;
  /* Causal blocks further down hold more work: start them first (CAUSAL_FIRST_LONGEST=0: in order). */
#ifndef CAUSAL_FIRST_LONGEST
#define CAUSAL_FIRST_LONGEST 1
#endif
#if SPLIT
  /* Work-group (chunk split, row block gq). */
  const int blocks = (int)get_num_groups(0) / splits;
  const int split = (int)get_group_id(0) / blocks, gq = (int)get_group_id(0) % blocks;
  const int qb = win_right < nq_max && CAUSAL_FIRST_LONGEST ? blocks - 1 - gq : gq;
#else
  const int qb = win_right < nq_max && CAUSAL_FIRST_LONGEST ? (int)get_num_groups(0) - 1 - (int)get_group_id(0)
                                                            : (int)get_group_id(0);
#endif
  const int q0 = qb * BR;
#if PACK
  const int hk = get_group_id(1), h = hk * group; /* h: the group's first head */
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

  /* The keys the block's rows see: tiles outside the window are never loaded. The window and causal bounds
     do not depend on the head, so mods serves every row for them. */
  fcl_mods mods;
  FCL_MODS_INIT(mods, b, h, nq, nk);
  const int last_row = min(q0 + BR, nrows) - 1;
  const int i_first = ROW_I(q0), i_last = ROW_I(last_row);
  const int key0 = FCL_BLOCK_KEY_BEGIN(&mods, i_first);
#if SPLIT
  /* Split-KV: this work-group's chunk of them. */
  const int2 keys = fcl_split_keys(key0, fcl_key_end(&mods, i_last, nk), BC, split, splits);
#else
  const int2 keys = (int2)(key0, fcl_key_end(&mods, i_last, nk));
#endif
  const int kv_begin = keys.x, kv_end = seq.bad ? keys.x : keys.y;
  const int ntiles = kv_end > kv_begin ? (kv_end - kv_begin + BC - 1) / BC : 0;
#if KV == 2
  /* Tile t's rows (key j0 on) into slot t & 1, as fcl_load_tile takes them, in two steps: PAGE_READ reads the
     rows' block-table entries into registers (ent), PAGE_STORE resolves them into offsets. In the key loop the
     read of tile j + 2's entries is issued at the top of iteration j and stored at its end, so the table read's
     latency hides behind the tile's mma instead of stalling the warp once a tile. */
  int ent[(BC + WG - 1) / WG];
#define PAGE_READ(j0)                                                                                        \
  for (int i_ = 0; i_ < (BC + WG - 1) / WG; ++i_) {                                                         \
    const int r_ = lid + i_ * WG;                                                                            \
    ent[i_] = r_ < BC && (j0) + r_ < nk ? seq.table[fcl_key_entry(&seq, (j0) + r_)] : -1;                    \
  }
#define PAGE_STORE(t, j0)                                                                                    \
  for (int i_ = 0; i_ < (BC + WG - 1) / WG; ++i_) {                                                         \
    const int r_ = lid + i_ * WG;                                                                            \
    if (r_ < BC) {                                                                                           \
      const int2 e_ = (j0) + r_ < nk ? fcl_key_resolve(&seq, (j0) + r_, ent[i_]) : (int2)(-1, 0);            \
      page[(t) & 1][0][r_] = fcl_block_offset(e_, k_sb, k_sn);                                               \
      page[(t) & 1][1][r_] = fcl_block_offset(e_, v_sb, v_sn);                                               \
    }                                                                                                        \
  }
  PAGE_READ(kv_begin);
  PAGE_STORE(0, kv_begin);
  PAGE_READ(kv_begin + BC);
  PAGE_STORE(1, kv_begin + BC);
  barrier(CLK_LOCAL_MEM_FENCE);
#endif
#define PAGE(j, kv) (&page[KV == 2 ? (j) & 1 : 0][kv][0])
  /* The ring: tile n (K(n / 2) for even n, V(n / 2) for odd) goes into buffer n % STAGES; RING_LOAD(n) issues
     this work-item's share of its copies, RING_ADVANCE(n, next) before the first read of tile n makes it readable
     by every warp and starts tile next (n + STAGES - 1), RING_RELEASE(n) follows a warp's last read of it. */
#define RING_COPY(n_)                                                                                         \
  fcl_load_tile(Ks + (n_ % STAGES) * TILE, n_ & 1 ? v : k, n_ & 1 ? v_sn : k_sn, PAGE(n_ >> 1, n_ & 1),        \
                kv_begin + (n_ >> 1) * BC, nk, lid)
#if MBAR_RING
  /* On mbarriers: a work-item copies its share of tile n once every warp has released tile n - STAGES (that
     buffer's phase n / STAGES - 1), and a warp waits until every share of the tile it reads next has landed
     (phase n / STAGES), so warps meet at no barrier of the whole work-group. */
#define RING_BAR(which, n) SMEM_ADDR(&ring_bar[which][(n) % STAGES])
#define RING_LOAD(n)                                                                                          \
  do {                                                                                                       \
    const int n_ = (n);                                                                                      \
    if (n_ < 2 * ntiles) {                                                                                   \
      if (n_ >= STAGES) MBAR_WAIT(RING_BAR(1, n_), (n_ / STAGES - 1) & 1);                                  \
      RING_COPY(n_);                                                                                         \
      CP_ASYNC_MBAR_ARRIVE(RING_BAR(0, n_));                                                                 \
    }                                                                                                        \
  } while (0)
#define RING_WAIT_TILE(n) MBAR_WAIT(RING_BAR(0, n), ((n) / STAGES) & 1)
#define RING_ADVANCE(n, next)                                                                                 \
  do {                                                                                                       \
    RING_LOAD(next);                                                                                         \
    RING_WAIT_TILE(n);                                                                                       \
  } while (0)
#define RING_RELEASE(n)                                                                                       \
  do {                                                                                                       \
    WARP_SYNC();                                                                                             \
    if (lane == 0) MBAR_ARRIVE(RING_BAR(1, n));                                                              \
  } while (0)
  if (lid < STAGES) {
    MBAR_INIT(SMEM_ADDR(&ring_bar[0][lid]), WG);
    MBAR_INIT(SMEM_ADDR(&ring_bar[1][lid]), NW);
    MBAR_INIT_FENCE();
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#else
  /* On work-group barriers: past the last key tile an empty commit group, so that every RING_WAIT counts the
     same groups; tile n has landed for this work-item, then for all at the barrier, where every warp is also
     done with tile n - 1, whose buffer tile n + STAGES - 1 reuses. */
#define RING_LOAD(n)                                                                                          \
  do {                                                                                                       \
    const int n_ = (n);                                                                                      \
    if (n_ < 2 * ntiles)                                                                                     \
      RING_COPY(n_);                                                                                         \
    else                                                                                                     \
      CP_ASYNC_COMMIT();                                                                                     \
  } while (0)
#define RING_ADVANCE(n, next)                                                                                 \
  do {                                                                                                       \
    RING_WAIT();                                                                                             \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                            \
    RING_LOAD(next);                                                                                         \
  } while (0)
#define RING_RELEASE(n)
#endif

  const int wrow = warp * MT * 16;
#if QSMEM
  /* Q tile (its columns from QC0) into local memory with K(0) (one commit group); zero beyond nq and D. */
  __local elem_t *Qs = Ks + QOFF;
#pragma unroll
  for (int i = 0; i < (BR * QCH + WG - 1) / WG; ++i) {
    const int c = lid + i * WG;
    if ((BR * QCH) % WG == 0 || c < BR * QCH) {
      const int r = c / QCH, cc = c % QCH;
      const bool ok = q0 + r < nrows && QC0 + cc * EPC < D;
      CP_ASYNC16(Qs + r * QDS + cc * EPC, ok ? q + ROW_OFF(q0 + r, q_sh, q_sn) + QC0 + cc * EPC : q, ok ? 16 : 0);
    }
  }
  /* The ring's first STAGES - 1 tiles (the Q copies join the first group; with MBAR_RING, tile 0's arrivals,
     which wait for every copy a work-item issued before them). */
#pragma unroll
  for (int n = 0; n < STAGES - 1; ++n) RING_LOAD(n);
#if DTYPE == 0
  /* f32: lane (g, t) reads its A fragment's floats at rows g, g + 8 and columns t, t + 4 of each k step. */
  __local const float *q_lane = Qs + (wrow + g) * QDS + t;
#else
  /* ldmatrix of the A fragment: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15). */
  const uint q_lane = SMEM_ADDR(Qs + (wrow + (lane & 7) + ((lane >> 3) & 1) * 8) * QDS + (lane >> 4) * 8);
#endif
#else
#pragma unroll
  for (int n = 0; n < STAGES - 1; ++n) RING_LOAD(n);
#endif
#define QRK (QSMEM ? QREG : KT) /* k steps of Q whose fragments stay in registers */
#if QRK
  /* Q fragments in registers (A of Q K^T; f16/bf16 m16k16, f32 m16k8): a0 at row g, a1 at row g + 8, a2 and a3
     the same rows half a k step on (qfrag_t's columns). */
  qfrag_t qa[MT][QRK][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r0 = q0 + wrow + mt * 16 + g, r1 = r0 + 8;
    __global const store_t *p0 = q + ROW_OFF(r0, q_sh, q_sn), *p1 = q + ROW_OFF(r1, q_sh, q_sn);
#pragma unroll
    for (int kk = 0; kk < QRK; ++kk) {
      const int c0 = QFRAG_COL(kk, t), c1 = c0 + KSTEP / 2;
      qa[mt][kk][0] = r0 < nrows && c0 < D ? QFRAG_LOAD(p0 + c0) : 0;
      qa[mt][kk][1] = r1 < nrows && c0 < D ? QFRAG_LOAD(p1 + c0) : 0;
      qa[mt][kk][2] = r0 < nrows && c1 < D ? QFRAG_LOAD(p0 + c1) : 0;
      qa[mt][kk][3] = r1 < nrows && c1 < D ? QFRAG_LOAD(p1 + c1) : 0;
    }
  }
#endif

  float acc[MT][OT][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < OT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][i][e] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const float sl2 = scale * FCL_LOG2E;
  /* With score modifiers S is taken to log2 units before the softmax (su = 1); without, the scale is folded
     into the exponent (su = sl2; scale > 0, so the raw maximum is the scaled one). */
#define SCORE_MODS (SOFTCAP || ALIBI || MASK)
  const float su = SCORE_MODS ? 1.0f : sl2;
#if PACK && (ALIBI || MASK)
  /* Packed rows of different heads: each row's own ALiBi slope and mask (a padding row's head is still a
     head of the group; its mask is never read, fcl_score hides it first). */
  fcl_mods rmods[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) FCL_MODS_INIT(rmods[mt][hr], b, ROW_HEAD(q0 + wrow + mt * 16 + g + hr * 8), nq, nk);
#define ROW_MODS(mt, hr) (&rmods[mt][hr])
#else
#define ROW_MODS(mt, hr) (&mods)
#endif

  /* Per-lane ldmatrix row addresses. K (B of Q K^T, no transpose): matrices (keys 0-7, d 0-7),
     (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) give b0b1, b2b3 of two n8 tiles.
     V (B of P V, transposed): (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15). */
#if DTYPE != 0
  const uint k_lane = SMEM_ADDR(Ks + ((lane & 7) + (lane >> 4) * 8) * DS + ((lane >> 3) & 1) * 8);
  const uint v_lane = SMEM_ADDR(Ks + ((lane & 7) + ((lane >> 3) & 1) * 8) * DS + (lane >> 4) * 8);
#endif

  for (int j = 0; j < ntiles; ++j) {
    const int k0 = kv_begin + j * BC;
#if KV == 2
    if (j + 2 < ntiles) PAGE_READ(k0 + 2 * BC);
#endif
    RING_ADVANCE(2 * j, 2 * j + STAGES - 1); /* K(j) */
#if DTYPE != 0
    const uint k_addr = k_lane + (uint)((2 * j) % STAGES * TILE * 2);
    const uint v_addr = v_lane + (uint)((2 * j + 1) % STAGES * TILE * 2);
#endif

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][i][e] = 0.0f;
#if DTYPE == 0
    /* S = Q K^T in 3xTF32: lane (g, t) reads K rows 8 i + g at columns t and t + 4 of each k step. */
    __local const float *kt_ = Ks + (2 * j) % STAGES * TILE + g * DS + t;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint ab[MT][4], as[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#if QSMEM
        __local const float *qr_ = q_lane + mt * 16 * QDS + kk * 8;
        const float qf[4] = {qr_[0], qr_[8 * QDS], qr_[4], qr_[8 * QDS + 4]};
#else
        const float *qf = qa[mt][kk];
#endif
#pragma unroll
        for (int e = 0; e < 4; ++e) TF32_SPLIT(ab[mt][e], as[mt][e], qf[e]);
      }
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        uint bb0, bs0, bb1, bs1;
        TF32_SPLIT(bb0, bs0, kt_[i * 8 * DS + kk * 8]);
        TF32_SPLIT(bb1, bs1, kt_[i * 8 * DS + kk * 8 + 4]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) MMA3(s[mt][i], ab[mt], as[mt], bb0, bb1, bs0, bs1);
      }
    }
#else
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
#if QSMEM
      /* k steps from QREG on: the fragments from the local tile (the first QREG are in qa). */
      uint ql[MT][4];
      if (kk >= QREG)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          LDSM_X4(ql[mt][0], ql[mt][1], ql[mt][2], ql[mt][3], q_lane + (uint)((mt * 16 * QDS + (kk - QREG) * 16) * 2));
#if QREG /* (the inner test keeps the index in bounds in the branch not taken; kk is a constant once unrolled) */
#define QK_A(mt, kk) ((kk) < QREG ? qa[mt][(kk) < QREG ? (kk) : 0] : ql[mt])
#else
#define QK_A(mt, kk) ql[mt]
#endif
#else
#define QK_A(mt, kk) qa[mt][kk]
#endif
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint b0, b1, b2, b3;
        LDSM_X4(b0, b1, b2, b3, k_addr + (uint)((np * 16 * DS + kk * 16) * 2));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          MMA(s[mt][2 * np], QK_A(mt, kk), b0, b1);
          MMA(s[mt][2 * np + 1], QK_A(mt, kk), b2, b3);
        }
      }
    }
#endif
    RING_RELEASE(2 * j);

    /* Hide keys outside a row's window or beyond nk (only in tiles that reach either; rows beyond nq are never
       written): there every score goes through the mask layer, with modifiers in log2 units. Other tiles take the
       modifiers alone, below. */
    if (fcl_tile_masked(&mods, i_first, i_last, k0, BC, nk)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = q0 + wrow + mt * 16 + g + (e >> 1) * 8;
            const int col = k0 + TILE_KEY(i, 2 * t + (e & 1));
            s[mt][i][e] = SCORE_MODS ? fcl_score(ROW_MODS(mt, e >> 1), s[mt][i][e] * sl2, ROW_I(row), col, nq, nk)
                                     : (fcl_visible(&mods, ROW_I(row), col, nk) ? s[mt][i][e] : -INFINITY);
          }
    }
#if SCORE_MODS
    else {
      /* A tile every row sees whole: softcap, ALiBi and the mask, without the visibility tests. Each row reads
         its mask through one pointer a tile, at offsets the compiler knows, a pair of keys a load with
         MASK_PAIRS, a run of 2 NT keys by 16-byte loads with KEY_PERM; rows past the block's last read its last
         row's (they are never written). */
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int ri = ROW_I(min(q0 + wrow + mt * 16 + g + hr * 8, last_row));
          const fcl_mods *rm = ROW_MODS(mt, hr);
#if MASK && KEY_PERM
          /* The lane's keys of the tile are k0 + 2 NT t on, in a run (TILE_KEY): 16 bytes a load. */
          __global const mask_t *mrow = rm->mask + (long)ri * rm->mask_sn + k0 + 2 * NT * t;
          mask_pair_t mrun[NT];
#pragma unroll
          for (int u = 0; u < NT / MASK_RUN_PAIRS; ++u)
            fcl_mask_16(mrow + 2 * MASK_RUN_PAIRS * u, mrun + MASK_RUN_PAIRS * u);
#elif MASK
          __global const mask_t *mrow = rm->mask + (long)ri * rm->mask_sn + k0 + 2 * t;
#endif
#if MASK && NT <= 4
          /* The next tile's part of this row on its way to L1 while this tile's scores are finished, so that its
             loads need not wait for L2: 3-6% off the masked forward with 32-key tiles on an H100, 4% slower with
             64-key tiles (docs/notes-nvidia.md, v33). */
          if (j + 1 < ntiles)
            fcl_prefetch_l1(rm->mask + (long)ri * rm->mask_sn + min(k0 + BC + 2 * NT * t, nk - 1));
#endif
#pragma unroll
          for (int i = 0; i < NT; ++i) {
#if MASK && KEY_PERM
            const float2 mv = MASK_PAIR_VALUES(mrun[i]);
#elif MASK
            const float2 mv = MASK_PAIR(mrow + i * 8);
#endif
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int col = k0 + TILE_KEY(i, 2 * t + c);
              float x = fcl_alibi(rm, fcl_softcap(rm, s[mt][i][2 * hr + c] * sl2), ri, col);
#if MASK
              x = fcl_add_mask(x, c ? mv.y : mv.x);
#endif
              s[mt][i][2 * hr + c] = x;
            }
          }
        }
    }
#endif

    /* Online softmax in log2 units: p = 2^(s su - m su), m the row's reference maximum. The reference moves
       to the row's maximum only when that passes it by more than RESCALE_SLACK (at the row's first visible
       key always: m is -inf until then); below that p stays under 2^RESCALE_SLACK, which float, f16 and bf16
       hold as well as values under 1, and O and l, both taken relative to m, need no rescaling: O / l and
       lse = m su + log2 l come out the same. After a row's first tiles its maximum rarely passes by that
       much, so a warp rarely rescales (with slack 0, some row of a warp's 32 finds a new maximum in most
       tiles of random scores). O's accumulator, at most 2^RESCALE_SLACK l max|V| against l max|V| with the true maximum, can
       overflow where that comes within 2^RESCALE_SLACK of float's range (|V| near it, or very long rows);
       such rows take the non-finite path below, which recomputes them against their true maximum.
       Each lane first takes its own part of each row's maximum: only when some lane of the warp holds a score
       past its row's reference by more than the slack does the warp reduce the maxima over its quads (two
       shuffles a row, on the way to the exponentials), move the references that passed and rescale O and l
       (the branch is uniform over the warp; alpha is exactly 1 wherever a finite reference stayed, and 0 for a
       row still at -inf, whose O and l hold nothing but zeros then). */
    float mx[MT][2];
    int passed = 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float x = m[mt][hr];
#pragma unroll
        for (int i = 0; i < NT; ++i) x = fmax(x, fmax(s[mt][i][2 * hr], s[mt][i][2 * hr + 1]));
        mx[mt][hr] = x;
        /* (-inf - -inf is NaN: a row that has seen no visible key keeps m = -inf) */
        passed |= (x - m[mt][hr]) * su > RESCALE_SLACK;
      }
#if LAZY_RESCALE
    if (fcl_warp_any(passed))
#endif
    {
      float alpha[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float x = mx[mt][hr];
          x = fmax(x, fcl_shfl_xor1(x));
          x = fmax(x, fcl_shfl_xor2(x));
          const float mr = (x - m[mt][hr]) * su > RESCALE_SLACK ? x : m[mt][hr];
          alpha[mt][hr] = fcl_exp2(m[mt][hr] * su - (mr == -INFINITY ? 0.0f : mr * su));
          m[mt][hr] = mr;
          l[mt][hr] *= alpha[mt][hr];
        }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < OT; ++i) {
          acc[mt][i][0] *= alpha[mt][0];
          acc[mt][i][1] *= alpha[mt][0];
          acc[mt][i][2] *= alpha[mt][1];
          acc[mt][i][3] *= alpha[mt][1];
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        /* A row that has seen no visible key yet keeps m = -inf; subtract 0 then, so no NaN appears. */
        const float mu = m[mt][hr] == -INFINITY ? 0.0f : m[mt][hr] * su;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const float p0 = fcl_exp2(fma(s[mt][i][2 * hr], su, -mu));
          const float p1 = fcl_exp2(fma(s[mt][i][2 * hr + 1], su, -mu));
          s[mt][i][2 * hr] = p0;
          s[mt][i][2 * hr + 1] = p1;
          sum += p0 + p1;
        }
        l[mt][hr] += sum;
      }

#if DTYPE == 0
    /* P in the A layout of P V's 8-key steps (keys in the order 0 2 4 6 1 3 5 7), split into TF32 parts. */
    uint pb[MT][NT][4], ps[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        TF32_SPLIT(pb[mt][i][0], ps[mt][i][0], s[mt][i][0]); /* row g, key 2t */
        TF32_SPLIT(pb[mt][i][1], ps[mt][i][1], s[mt][i][2]); /* row g + 8, key 2t */
        TF32_SPLIT(pb[mt][i][2], ps[mt][i][2], s[mt][i][1]); /* row g, key 2t + 1 */
        TF32_SPLIT(pb[mt][i][3], ps[mt][i][3], s[mt][i][3]); /* row g + 8, key 2t + 1 */
      }
#else
    /* P in the A layout of P V: the accumulators of n8 tiles 2kt and 2kt+1 are the m16k16 fragment kt. */
    uint pa[MT][PT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kt = 0; kt < PT; ++kt) {
        pa[mt][kt][0] = fcl_pack2(s[mt][2 * kt][0], s[mt][2 * kt][1]);
        pa[mt][kt][1] = fcl_pack2(s[mt][2 * kt][2], s[mt][2 * kt][3]);
        pa[mt][kt][2] = fcl_pack2(s[mt][2 * kt + 1][0], s[mt][2 * kt + 1][1]);
        pa[mt][kt][3] = fcl_pack2(s[mt][2 * kt + 1][2], s[mt][2 * kt + 1][3]);
      }
#endif

    RING_ADVANCE(2 * j + 1, 2 * j + STAGES); /* V(j) */

#if DTYPE == 0
    /* O += P V: each n8 tile of O over the key tile in fresh accumulators, then added in float. Lane (g, t)
       reads V rows 8 ks + 2t and + 1 at column 8 i + g. */
    __local const float *vt_ = Ks + (2 * j + 1) % STAGES * TILE + 2 * t * DS + g;
#pragma unroll
    for (int i = 0; i < OT; ++i) {
      float c[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) c[mt][0] = c[mt][1] = c[mt][2] = c[mt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < NT; ++ks) {
        uint bb0, bs0, bb1, bs1;
        TF32_SPLIT(bb0, bs0, vt_[ks * 8 * DS + i * 8]);
        TF32_SPLIT(bb1, bs1, vt_[ks * 8 * DS + DS + i * 8]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) MMA3(c[mt], pb[mt][ks], ps[mt][ks], bb0, bb1, bs0, bs1);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][i][e] += c[mt][e];
    }
#else
#pragma unroll
    for (int kt = 0; kt < PT; ++kt) {
#pragma unroll
      for (int np = 0; np < OT / 2; ++np) {
        uint b0, b1, b2, b3;
        LDSM_X4_T(b0, b1, b2, b3, v_addr + (uint)((kt * 16 * DS + np * 16) * 2));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          MMA(acc[mt][2 * np], pa[mt][kt], b0, b1);
          MMA(acc[mt][2 * np + 1], pa[mt][kt], b2, b3);
        }
      }
    }
#endif
#if KV == 2
    if (j + 2 < ntiles) PAGE_STORE(j + 2, k0 + 2 * BC);
#endif
    RING_RELEASE(2 * j + 1);
  }

  /* Row sums over the quad; then O through local memory, so the global write is 16 bytes a work-item. */
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      l[mt][hr] += fcl_shfl_xor1(l[mt][hr]);
      l[mt][hr] += fcl_shfl_xor2(l[mt][hr]);
    }

  /* A NaN or inf in a V row that some row does not see reaches that row's O as 0 * inf: the tensor cores
     multiply every entry of P, zero or not; and against a reference maximum that lags the true one (the
     slack above), finite inputs whose exact result nears float's range can overflow. A warp whose
     accumulators are all finite goes on after one vote. Otherwise each of its rows with a non-finite
     accumulator is computed again in float32 from global memory, over the same keys: a first pass finds the
     row's true maximum, a second sums p and adds p V only where p != 0 (as the portable kernel does): slow,
     and taken only for non-finite inputs or results within 2^RESCALE_SLACK of float's range. */
  int nonfinite = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < OT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) nonfinite |= fcl_nonfinite(acc[mt][i][e]);
  if (fcl_warp_any(nonfinite)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        int bad = 0;
        FCL_ROW_NONFINITE(bad, acc[mt], OT, hr);
        bad = fcl_quad_any(bad);
        const int row = q0 + wrow + mt * 16 + g + hr * 8;
        if (!bad || row >= nrows) continue;
        __global const store_t *qr = q + ROW_OFF(row, q_sh, q_sn);
#pragma unroll
        for (int i = 0; i < OT; ++i) acc[mt][i][2 * hr] = acc[mt][i][2 * hr + 1] = 0.0f;
        float mx = -INFINITY, mu = 0.0f, sum = 0.0f;
        for (int pass = 0; pass < 2; ++pass) {
          for (int c = kv_begin; c < kv_end; ++c) {
            const int2 e = KV == 2 ? fcl_key_block(&seq, c) : (int2)(0, 0);
            const long ko = KV == 2 ? fcl_block_offset(e, k_sb, k_sn) : (long)c * k_sn;
            const long vo = KV == 2 ? fcl_block_offset(e, v_sb, v_sn) : (long)c * v_sn;
            __global const store_t *kr = k + ko, *vr = v + vo;
            float x = ko < 0 ? NAN : 0.0f; /* a key of a block outside the pool is NaN */
            if (ko >= 0)
              for (int d = 0; d < D; ++d) x = fma(LOAD(qr, d), LOAD(kr, d), x);
            x = SCORE_MODS ? fcl_score(ROW_MODS(mt, hr), x * sl2, ROW_I(row), c, nq, nk)
                           : (fcl_visible(&mods, ROW_I(row), c, nk) ? x : -INFINITY);
            if (pass == 0) {
              mx = fmax(mx, x);
              continue;
            }
            const float p = native_exp2(fma(x, su, -mu));
            sum += p;
            if (p != 0.0f)
#pragma unroll
              for (int i = 0; i < OT; ++i)
                if (i * 8 + 2 * t < D) {
                  acc[mt][i][2 * hr] = fma(p, vo < 0 ? NAN : LOAD(vr, i * 8 + 2 * t), acc[mt][i][2 * hr]);
                  acc[mt][i][2 * hr + 1] = fma(p, vo < 0 ? NAN : LOAD(vr, i * 8 + 2 * t + 1), acc[mt][i][2 * hr + 1]);
                }
          }
          mu = mx == -INFINITY ? 0.0f : mx * su; /* as in the key loop: a row that saw nothing subtracts 0 */
        }
        m[mt][hr] = mx; /* O, l and lse of the row relative to its true maximum */
        l[mt][hr] = sum;
      }
  }
#if SPLIT
  CP_ASYNC_WAIT_ALL(); /* the Q copy of a chunk without key tiles may still be in flight */
  /* A chunk's partial result, straight from the accumulators; the combine adds the sink and normalises
     across chunks. part row (split, b, head, i). */
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = q0 + wrow + mt * 16 + g + hr * 8;
      if (row < nrows) {
        const long prow = (((long)split * get_num_groups(2) + b) * num_heads + ROW_HEAD(row)) * nq_max + ROW_I(row);
        const float inv = seq.bad ? NAN : l[mt][hr] == 0.0f ? 0.0f : 1.0f / l[mt][hr];
#pragma unroll
        for (int i = 0; i < OT; ++i)
          if (i * 8 < D)
            *(__global float2 *)(part_o + prow * D + i * 8 + 2 * t) =
                (float2)(acc[mt][i][2 * hr] * inv, acc[mt][i][2 * hr + 1] * inv); /* 8-byte aligned: D is even */
        if (t == 0)
          part_o[part_lse_off + prow] =
              seq.bad ? NAN : l[mt][hr] == 0.0f ? -INFINITY : (m[mt][hr] * su + log2(l[mt][hr])) * FCL_LN2;
      }
    }
  return;
#endif
  CP_ASYNC_WAIT_ALL(); /* the Q copy of a block without key tiles may still be in flight */
  barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the K and V tiles */
  __local elem_t *Os = Ks;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int rl = wrow + mt * 16 + g + hr * 8;
      float m2 = m[mt][hr] * su, c = 1.0f; /* the row's maximum in log2 units; O's factor from the sink */
#if SINKS
      /* The sink joins the denominator once: l' = l 2^(m - m') + 2^(sink - m'), m' = max(m, sink). */
      const float sink = FCL_SINK(ROW_HEAD(q0 + rl)), mf = fmax(m2, sink);
      if (mf != -INFINITY) {
        c = exp2(m2 - mf);
        l[mt][hr] = l[mt][hr] * c + exp2(sink - mf);
        m2 = mf;
      }
#endif
      /* l is 0 only for a row that saw nothing (O = 0, lse = -inf); NaN inputs stay NaN in O and lse, and a
         sequence whose key indices did not fit gets NaN. */
      const float inv = seq.bad ? NAN : l[mt][hr] == 0.0f ? 0.0f : c / l[mt][hr];
#pragma unroll
      for (int i = 0; i < OT; ++i)
#if DTYPE == 0
        *(__local float2 *)(Os + rl * DS + i * 8 + 2 * t) =
            (float2)(acc[mt][i][2 * hr] * inv, acc[mt][i][2 * hr + 1] * inv);
#else
        *(__local uint *)(Os + rl * DS + i * 8 + 2 * t) =
            fcl_pack2(acc[mt][i][2 * hr] * inv, acc[mt][i][2 * hr + 1] * inv);
#endif
      const int row = q0 + rl;
      const long lse_row = fcl_lse_base(&seq, b, ROW_HEAD(row), num_heads, nq_max, total_q);
      if (lse && t == 0 && row < nrows)
        lse[lse_row + ROW_I(row)] = seq.bad ? NAN : l[mt][hr] == 0.0f ? -INFINITY : (m2 + log2(l[mt][hr])) * FCL_LN2;
    }
  barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
  for (int i = 0; i < (BR * CH + WG - 1) / WG; ++i) {
    const int c = lid + i * WG;
    const int r = c / CH, cc = c % CH;
    const int row = q0 + r;
    if (c < BR * CH && row < nrows && cc * EPC < D)
      *(__global uint4 *)(o + ROW_OFF(row, o_sh, o_sn) + cc * EPC) = *(__local const uint4 *)(Os + r * DS + cc * EPC);
  }
}
