/* Storage types and conversions shared by every kernel. DTYPE (0 f32, 1 f16, 2 bf16) is a -D define;
 * arithmetic is always float. f16 goes through vload_half/vstore_half, which need no cl_khr_fp16. */
#ifndef DTYPE
#error "DTYPE must be defined"
#endif

#if DTYPE == 0
typedef float store_t;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
typedef half store_t;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
#else
typedef ushort store_t;
#define LOAD(p, i) as_float((uint)(p)[i] << 16)
#define STORE(p, i, x) ((p)[i] = fcl_float_to_bf16(x))
#endif

/* Round to nearest even; NaN stays NaN. */
inline ushort fcl_float_to_bf16(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* NaN or +-inf, from the bits: stays right under -cl-finite-math-only or -cl-fast-relaxed-math in the caller's
   build options, which let isfinite() fold to true. */
inline bool fcl_nonfinite(float x) { return (as_uint(x) & 0x7f800000u) == 0x7f800000u; }

#define FCL_LOG2E 1.4426950408889634f
#define FCL_LN2 0.6931471805599453f

/* Cooperative load of `rows` rows (global rows row0..) of an [n][D] matrix with row stride `stride` into a
   local [rows][DS] float tile, times mul, zero-filled beyond n rows and D columns. The kernel defines lid,
   WG, D, DP and DS. */
#define LOAD_TILE(dst, src, stride, row0, rows, n, mul)                                                 \
  for (int i_ = lid; i_ < (rows) * DP; i_ += WG) {                                                      \
    const int r_ = i_ / DP, c_ = i_ % DP;                                                               \
    (dst)[r_ * DS + c_] = ((row0) + r_ < (n) && c_ < D) ? LOAD(src, ((row0) + r_) * (stride) + c_) * (mul) : 0.0f; \
  }

/* ---- The mask and score-modifier layer: the one place every attention kernel takes visibility and
 * score modifiers from (mirrored by the tests' float64 host reference).
 *
 * Query row i of a sequence sits at key position p = i + diag, diag = seqlen_k - seqlen_q. Key j is
 * visible from row i iff 0 <= j < nk and p - wl <= j <= p + wr (the host folds causal into wr = 0 and
 * passes nk / nq for an unbounded side; WINDOW below). Scores are in log2 units (scale * log2(e) * q.k): the modifiers
 * follow them there, in the order softcap, ALiBi, mask. Switches (-D, 0 when absent): SOFTCAP, ALIBI,
 * MASK (1 f32, 2 f16, 3 bf16 values), SINKS; FCL_PTX (NVIDIA's tensor-core kernels: inline PTX for the
 * modifiers' special functions, fcl_rcp). */
#ifndef FCL_PTX
#define FCL_PTX 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef MASK
#define MASK 0
#endif
#ifndef SINKS
#define SINKS 0
#endif

#if MASK == 2
typedef half mask_t;
#define MASK_LOAD(p, i) vload_half((i), (p))
#elif MASK == 3
typedef ushort mask_t;
#define MASK_LOAD(p, i) as_float((uint)(p)[i] << 16)
#else
typedef float mask_t;
#define MASK_LOAD(p, i) ((p)[i])
#endif

/* The modifier arguments every attention kernel takes last, in this order (fcl_set_modifier_args). */
#define FCL_MOD_ARGS                                                                                   \
  int win_left, int win_right, float softcap, __global const float *alibi, long alibi_off, long alibi_sb, \
      __global const mask_t *mask, long mask_off, long mask_sb, long mask_sh, long mask_sn,             \
      __global const float *sinks

/* The modifiers of one (batch, head), ready for per-element use. */
typedef struct fcl_mods {
  int diag, wl, wr;
  float cap, inv_cap; /* softcap in log2 units, and its inverse */
  float slope;        /* ALiBi slope of this (batch, head) in log2 units */
  __global const mask_t *mask; /* this (batch, head)'s mask, row 0 */
  long mask_sn;
} fcl_mods;

#define FCL_MODS_INIT(m, b, h, nq, nk)                                                       \
  do {                                                                                       \
    (m).diag = (nk) - (nq);                                                                  \
    (m).wl = win_left;                                                                       \
    (m).wr = win_right;                                                                      \
    (m).cap = softcap * FCL_LOG2E;                                                           \
    (m).inv_cap = SOFTCAP ? 1.0f / (m).cap : 0.0f;                                           \
    (m).slope = ALIBI ? alibi[alibi_off + (long)(b) * alibi_sb + (h)] * FCL_LOG2E : 0.0f;     \
    (m).mask = MASK ? mask + mask_off + (long)(b) * mask_sb + (long)(h) * mask_sh : mask;    \
    (m).mask_sn = mask_sn;                                                                   \
  } while (0)

/* WINDOW (-D, from the host): 0 no window (every key of the row's range is visible), 1 causal only
 * (wl unbounded, wr = 0), 2 any window. The first two keep the per-element work of the common cases at
 * one or two comparisons. */
#ifndef WINDOW
#define WINDOW 2
#endif

/* First visible key of row i, and one past the last (clamped to [0, nk]; empty when begin >= end).
   Both grow with i, so a block of rows r0..r1 needs keys [fcl_key_begin(r0), fcl_key_end(r1)). */
inline int fcl_key_begin(const fcl_mods *m, int i) { return WINDOW == 2 ? max(0, i + m->diag - m->wl) : 0; }
inline int fcl_key_end(const fcl_mods *m, int i, int nk) {
  return WINDOW == 0 ? nk : clamp(i + m->diag + m->wr + 1, 0, nk);
}
/* First query row that sees key j, and one past the last that does (clamped to [0, nq]). */
inline int fcl_row_begin(const fcl_mods *m, int j) { return WINDOW == 0 ? 0 : max(0, j - m->wr - m->diag); }
inline int fcl_row_end(const fcl_mods *m, int j, int nq) {
  return WINDOW == 2 ? clamp(j + m->wl - m->diag + 1, 0, nq) : nq;
}

/* Key j < nk is visible from row i (rows beyond nq are the caller's to exclude). */
inline bool fcl_visible(const fcl_mods *m, int i, int j, int nk) {
#if WINDOW == 0
  (void)m, (void)i;
  return j < nk;
#elif WINDOW == 1
  return j < nk && j <= i + m->diag;
#else
  const int p = i + m->diag;
  return j < nk && j >= p - m->wl && j <= p + m->wr;
#endif
}
/* 1 when some key of the tile j0..j0+bc-1 is hidden from some row i0..i1 (the tile needs the per-element
   mask); 0 when every row sees the whole tile. */
inline bool fcl_tile_masked(const fcl_mods *m, int i0, int i1, int j0, int bc, int nk) {
#if WINDOW == 0
  (void)m, (void)i0, (void)i1;
  return j0 + bc > nk;
#elif WINDOW == 1
  (void)i1;
  return j0 + bc > nk || j0 + bc - 1 > i0 + m->diag;
#else
  return j0 + bc > nk || j0 + bc - 1 > i0 + m->diag + m->wr || j0 < i1 + m->diag - m->wl;
#endif
}

/* 1/x, and 2^x for arguments whose result is normal. NVIDIA's tensor-core kernels (FCL_PTX from the host) take
   one special-function instruction for each: rcp.approx (1 ulp) and ex2.approx (2 ulp). A division compiles there
   to IEEE division, whose slow path is a call behind a branch, and a branch in a score's code keeps the scores of
   a tile from overlapping (docs/notes-nvidia.md, v31). Elsewhere, OpenCL's own. */
#if FCL_PTX
inline float fcl_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
/* 2^x as one MUFU.EX2 instruction. native_exp2 compiles to ex2.approx.f32 without .ftz, which NVIDIA's compiler
   wraps in a compare and two predicated multiplies to produce subnormal results: four instructions an
   exponential, on the softmax's critical path. Here results below 2^-126 flush to zero: such a probability is
   below float's resolution next to a row sum of at least 1, and its share of O below O's. */
inline float fcl_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
inline float fcl_exp2_normal(float x) { return fcl_exp2(x); }
#else
inline float fcl_rcp(float x) { return 1.0f / x; }
inline float fcl_exp2_normal(float x) { return exp2(x); }
#endif

/* tanh to 1.3 ulp in float (2.4 with FCL_PTX's instructions at their bounds) from one exponential and one
   reciprocal: above |x| = 0.9, 1 - 2 / (e^2|x| + 1) (e^2|x| = inf gives 1); below, where that would cancel, an odd
   polynomial x + x^3 P(x^2), P fitted for relative error on [0, 0.9]. Compilers branch between the two, so a
   work-item (a warp) whose arguments are all small, as scores against a cap usually are, skips the exponential:
   selecting without a branch took a softcapped forward 1.4x longer on PoCL. OpenCL's tanh took it 1.8x longer on
   PoCL and 4% longer on the H200 (docs/notes-nvidia.md, v30). */
inline float fcl_tanh(float x) {
  const float a = fabs(x), x2 = x * x;
  const float big = fma(-2.0f, fcl_rcp(fcl_exp2_normal(a * 2.88539008f) + 1.0f), 1.0f); /* 2 log2(e) */
  float p = 0.00130395847f;
  p = fma(p, x2, -0.00686005317f);
  p = fma(p, x2, 0.0209041238f);
  p = fma(p, x2, -0.0537214912f);
  p = fma(p, x2, 0.133303598f);
  p = fma(p, x2, -0.333332121f);
  return a < 0.9f ? fma(x * x2, p, x) : copysign(big, x);
}

/* Softcap of a log2-unit score (identity when off). */
inline float fcl_softcap(const fcl_mods *m, float s) {
#if SOFTCAP
  return m->cap * fcl_tanh(s * m->inv_cap);
#else
  (void)m;
  return s;
#endif
}
/* ALiBi's bias of row i, key j added to s (identity when off). */
inline float fcl_alibi(const fcl_mods *m, float s, int i, int j) {
#if ALIBI
  s -= m->slope * (float)abs(i + m->diag - j);
#endif
  (void)m, (void)i, (void)j;
  return s;
}
/* A mask value mv added to s: -inf hides the key whatever the score holds (a NaN from q or k must not pass the
   mask as NaN + -inf). */
inline float fcl_add_mask(float s, float mv) { return mv == -INFINITY ? -INFINITY : s + mv * FCL_LOG2E; }
/* The additive modifiers of row i, key j: ALiBi and the mask (identity when off). The mask is read only where
   ok (i < nq and the row sees key j); elsewhere its first element is read instead, which every launched sequence
   has, and the caller hides the result, so that a score's code needs no branch. */
inline float fcl_bias(const fcl_mods *m, float s, int i, int j, bool ok) {
  s = fcl_alibi(m, s, i, j);
#if MASK
  s = fcl_add_mask(s, MASK_LOAD(m->mask, ok ? (long)i * m->mask_sn + j : 0));
#endif
  (void)ok;
  return s;
}
/* Whether row i's score of key j takes part: i is no padding row beyond nq (whose mask row does not exist) and
   the row sees the key. */
inline bool fcl_score_ok(const fcl_mods *m, int i, int j, int nq, int nk) {
  return (i < nq) & fcl_visible(m, i, j, nk);
}
/* The modified score of (i, j), or -INFINITY when it takes no part. Every part is computed and the result
   selected: a branch around each score keeps the compiler from overlapping a tile's scores (docs/notes-nvidia.md,
   v31). */
inline float fcl_score(const fcl_mods *m, float s, int i, int j, int nq, int nk) {
  const bool ok = fcl_score_ok(m, i, j, nq, nk);
  return select(-INFINITY, fcl_bias(m, fcl_softcap(m, s), i, j, ok), (int)ok);
}
/* dS of one entry from its P, dp = dO.v, Dv = rowsum(dO O) and u = softcapped score / cap: P (dp - Dv) times the
   softcap's derivative 1 - u^2, and 0 wherever P is (whatever dp holds). A macro, so that the kernels' code stays
   as the compiler saw it written out in place (a function changed clang's branches in the backward kernels). */
#define FCL_DS(p, dp, Dv, u) ((p) == 0.0f ? 0.0f : (p) * ((dp) - (Dv)) * (SOFTCAP ? 1.0f - (u) * (u) : 1.0f))
/* The backward's P and dS of one (row, key) from the raw score s = q.k and dp = dO.v, through the mask layer of
   m_ (a pointer): P = 2^(modified score - L) with L = lse log2(e), by EXP2; dS = P (dp - Dv), times the softcap's
   derivative. Entries that take no part (fcl_score_ok), those a mask gives -inf, and every entry of a row that saw
   nothing (L = -inf) get P = dS = 0. The kernel defines qk_scale, nq and nk. Without a branch, as fcl_score. */
#define FCL_P_DS(p_out, ds_out, m_, s, dp, row, key, L, Dv, EXP2)                                       \
  do {                                                                                                 \
    const bool ok_ = fcl_score_ok((m_), (row), (key), nq, nk) & ((L) != -INFINITY);                    \
    const float t_ = fcl_softcap((m_), (s) * qk_scale);                                                \
    const float p_ = select(0.0f, EXP2(fcl_bias((m_), t_, (row), (key), ok_) - (L)), (int)ok_);       \
    const float u_ = t_ * (m_)->inv_cap;                                                               \
    (p_out) = p_;                                                                                      \
    (ds_out) = FCL_DS(p_, (dp), (Dv), u_);                                                             \
  } while (0)
/* The sink logit of head h in log2 units (SINKS only). */
#define FCL_SINK(h) (sinks[h] * FCL_LOG2E)

/* ---- Sequences: where sequence b's query rows and key rows are (dense, varlen, paged), from the
 * caller's untrusted index buffers. Switches (-D, 0 when absent): VARLEN_Q (q, o packed by cu_q; lse
 * [heads][total_q]), KV (0 dense [batch] tensors, 1 packed by cu_k, 2 paged through the block table),
 * SEQLENS_K (each sequence's key count from seqlens_k).
 * An index that does not fit is never followed: a sequence with bad cu_q entries is skipped (its rows are
 * not written; no row could be trusted to be its own), one with bad cu_k or seqlens_k entries gets NaN O and
 * lse in every row, and a block-table entry outside the pool reads NaN keys and values, so exactly the rows
 * that see those keys become NaN. */
#ifndef VARLEN_Q
#define VARLEN_Q 0
#endif
#ifndef KV
#define KV 0
#endif
#ifndef SEQLENS_K
#define SEQLENS_K 0
#endif

/* The sequence arguments every attention kernel takes after the modifiers (fcl_set_sequence_args). */
#define FCL_SEQ_ARGS                                                                                   \
  __global const int *cu_q, __global const int *cu_k, __global const int *seqlens_k,                 \
      __global const int *block_table, long table_stride, int block_size, int num_blocks, int total_q, \
      int total_k

typedef struct fcl_seq {
  int nq, nk;      /* this sequence's query rows and keys */
  long q_row;      /* packed row of its first query (VARLEN_Q), else 0 */
  long k_row;      /* packed row of its first key (KV 1), else 0 */
  bool bad;        /* a key index of this sequence did not fit: its rows' O and lse are NaN */
  bool skip;       /* its cu_q entries did not fit (VARLEN_Q): its query rows are unknown, nq is 0 */
  int k_rows;      /* KV 0, 1: the key rows of k and v it owns (the backward's dK, dV rows; nk or more with
                      SEQLENS_K; 0 when its cu_k entries did not fit) */
  __global const int *table; /* KV 2: its row of the block table */
  int block_size, num_blocks; /* KV 2: the pools' geometry */
  int block_shift;            /* KV 2: log2(block_size) when it is a power of two (the common sizes), else -1 */
} fcl_seq;

/* Whether cu[0..n] starts at 0 or more and never decreases: then the ranges [cu[i], cu[i + 1]) of the first n
   sequences lie in order without overlapping. Every work-item of a work-group gets the same answer. The portable
   kernels: each work-item reads every entry, (n + 1) / 4 + 3 loop iterations (loop_bounds.c's
   fcl_prefix_loop_iterations). The tensor-core kernels (FCL_PTX), which call it where all of a warp's lanes are
   active: the lanes take 32 neighbouring pairs a pass, in coalesced loads, and vote. Counters are long: n may be
   INT_MAX. */
inline bool fcl_sorted_prefix(__global const int *cu, int n) {
#if FCL_PTX
  int bad = 0, any;
  for (long j = get_local_id(0) & 31; j <= n; j += 32) bad |= (j ? cu[j - 1] : 0) > cu[j];
  asm volatile("{\n .reg .pred p_, q_;\n setp.ne.s32 p_, %1, 0;\n vote.sync.any.pred q_, p_, 0xffffffff;\n"
               " selp.s32 %0, 1, 0, q_;\n}\n"
               : "=r"(any)
               : "r"(bad));
  return !any;
#else
  bool ok = true;
  int prev = 0;
  long i = 0;
  for (; i + 3 <= n; i += 4) {
    const int4 c = vload4(0, cu + i);
    ok &= prev <= c.x & c.x <= c.y & c.y <= c.z & c.z <= c.w;
    prev = c.w;
  }
  for (; i <= n; ++i) {
    const int c = cu[i];
    ok &= prev <= c;
    prev = c;
  }
  return ok;
#endif
}

/* A packed range [cu[b], cu[b + 1]) that fits in [0, total) and is at most max long; else (-1, 0). With
   `prefix`, also entries cu[0..b + 1] that never decrease from 0 or more (fcl_sorted_prefix), so that no two
   ranges that pass overlap: a caller that leaves it out has checked the whole array. */
inline int2 fcl_packed_range(__global const int *cu, int b, int total, int max, bool prefix) {
  const int lo = cu[b], hi = cu[b + 1];
  const bool fits = lo >= 0 && hi >= lo && hi <= total && hi - lo <= max && (!prefix || fcl_sorted_prefix(cu, b + 1));
  return fits ? (int2)(lo, hi - lo) : (int2)(-1, 0);
}

/* Sequence b of a launch whose longest sequences have nq_max query rows and nk_max keys. Its cu_q and cu_k
   entries are trusted only after a prefix of entries that never decrease (fcl_packed_range): a kernel that loops
   over every sequence checks the whole arrays once and passes prefix false to FCL_SEQ_INIT_FROM. */
#define FCL_SEQ_INIT(s, b, nq_max, nk_max) FCL_SEQ_INIT_FROM(s, b, nq_max, nk_max, true)
#define FCL_SEQ_INIT_FROM(s, b, nq_max, nk_max, prefix)                                       \
  do {                                                                                      \
    (s).nq = (nq_max), (s).nk = (nk_max), (s).q_row = 0, (s).k_row = 0, (s).bad = false;   \
    (s).skip = false, (s).k_rows = (nk_max);                                                \
    (s).table = block_table, (s).block_size = block_size, (s).num_blocks = num_blocks;     \
    (s).block_shift = (block_size & (block_size - 1)) == 0 ? 31 - clz(block_size) : -1;     \
    if (VARLEN_Q) {                                                                         \
      const int2 r_ = fcl_packed_range(cu_q, (b), total_q, (nq_max), (prefix));              \
      (s).q_row = max(r_.x, 0), (s).nq = r_.y, (s).skip = r_.x < 0;                         \
    }                                                                                       \
    if (KV == 1) {                                                                          \
      const int2 r_ = fcl_packed_range(cu_k, (b), total_k, (nk_max), (prefix));              \
      (s).k_row = max(r_.x, 0), (s).nk = (s).k_rows = r_.y, (s).bad |= r_.x < 0;            \
    }                                                                                       \
    if (SEQLENS_K) {                                                                        \
      const int n_ = seqlens_k[b];                                                          \
      (s).bad |= n_ < 0 || n_ > (s).nk;                                                     \
      (s).nk = (s).bad ? 0 : n_;                                                            \
    }                                                                                       \
    if (KV == 2) (s).table = block_table + (long)(b) * table_stride;                        \
  } while (0)

/* Paged keys: the pool block of key j (-1 when its table entry is outside the pool; the host has checked
   that every key below seqlen_k has an entry) and its row in that block. */
inline int fcl_key_entry(const fcl_seq *s, int j) {
  return s->block_shift >= 0 ? j >> s->block_shift : j / s->block_size;
}
/* The same from key j's table entry blk, read earlier (a kernel can issue the read well before it needs it). */
inline int2 fcl_key_resolve(const fcl_seq *s, int j, int blk) {
  return (int2)(blk >= 0 && blk < s->num_blocks ? blk : -1, j - fcl_key_entry(s, j) * s->block_size);
}
inline int2 fcl_key_block(const fcl_seq *s, int j) { return fcl_key_resolve(s, j, s->table[fcl_key_entry(s, j)]); }

/* Element offset of sequence s's first query row of head h in q, o or dO (off and strides of that tensor):
   its packed rows with VARLEN_Q, batch b's otherwise. */
inline long fcl_query_base(const fcl_seq *s, long b, long h, long off, long sb, long sh, long sn) {
  return off + (VARLEN_Q ? s->q_row * sn : b * sb) + h * sh;
}
/* Element offset of sequence s's first key row of kv head hk in k or v: batch b's (KV 0), its packed rows
   (KV 1), or the pool's kv head (KV 2, where each key's block comes on top). */
inline long fcl_key_base(const fcl_seq *s, long b, long hk, long off, long sb, long sh, long sn) {
  return off + (KV == 0 ? b * sb : s->k_row * sn) + hk * sh;
}
/* Index of sequence s's first query row of head h in lse: [heads, total_q] with VARLEN_Q, else
   [batch, heads, nq_max]. */
inline long fcl_lse_base(const fcl_seq *s, long b, long h, int num_heads, int nq_max, int total_q) {
  return VARLEN_Q ? h * total_q + s->q_row : (b * num_heads + h) * nq_max;
}

/* Moves q, o, k and v (the kernel's arguments of those names, with their offsets and strides) to sequence
   seq's rows: head h's of q and o, kv head hk's of k and v (paged: the pool's kv head; a block's offset comes
   per key). */
#define FCL_SEQ_BASES(seq, b, h, hk)                            \
  q += fcl_query_base(&(seq), b, h, q_off, q_sb, q_sh, q_sn);   \
  o += fcl_query_base(&(seq), b, h, o_off, o_sb, o_sh, o_sn);   \
  k += fcl_key_base(&(seq), b, hk, k_off, k_sb, k_sh, k_sn);    \
  v += fcl_key_base(&(seq), b, hk, v_off, v_sb, v_sh, v_sn)

/* Paged keys: the element offset of pool row e (block, row in it; fcl_key_block) from the (pool, kv head) base
   of K or V (sb: the pool's block stride, sn: its row stride), or -1 for a block outside the pool. */
inline long fcl_block_offset(int2 e, long sb, long sn) { return e.x >= 0 ? (long)e.x * sb + (long)e.y * sn : -1L; }

/* A tile's key rows j0 .. j0 + rows - 1 resolved once for its K and V loads: with KV 2 each row's block and
   row in the block go to local `page` (int2 [rows]; the caller synchronises before reading it); otherwise
   nothing is needed (row j is j * row stride from the sequence's base). */
#define FCL_PAGE_ROWS(page, seq, j0, rows)                                                   \
  if (KV == 2)                                                                              \
    for (int r_ = lid; r_ < (rows); r_ += WG)                                               \
      (page)[r_] = (j0) + r_ < (seq).nk ? fcl_key_block(&(seq), (j0) + r_) : (int2)(-1, 0);

/* Element offset of tile row r (key j) from its (batch or pool, kv head) base, for a tensor whose block or
   batch stride is sb and row stride sn; -1 for a key of a block outside the pool. */
#define FCL_KEY_OFFSET(page, r, j, sb, sn) (KV == 2 ? fcl_block_offset((page)[r], sb, sn) : (long)(j) * (sn))

/* Tile row r (key j)'s offset as FCL_KEY_OFFSET gives it, or -2 for a row past the sequence's nk keys; and
   element c of such a row: the value, NaN in a block outside the pool, 0 past the keys (masked later). */
#define FCL_KEY_ROW(page, r, j, nk, sb, sn) ((j) < (nk) ? FCL_KEY_OFFSET(page, r, j, sb, sn) : -2L)
#define FCL_KEY_LOAD(src, off, c) ((off) >= 0 ? LOAD(src, (off) + (c)) : (off) == -1 ? NAN : 0.0f)

/* Cooperative load of key rows j0.. (j0 + r < seq.nk) of K or V into a local [rows][DS] tile as LOAD_TILE
   does, addressed through FCL_KEY_OFFSET; a row of a block outside the pool loads as NaN. */
#define LOAD_KEY_TILE(dst, src, sb, sn, seq, page, j0, rows)                                     \
  for (int i_ = lid; i_ < (rows) * DP; i_ += WG) {                                               \
    const int r_ = i_ / DP, c_ = i_ % DP;                                                        \
    const long off_ = FCL_KEY_ROW(page, r_, (j0) + r_, (seq).nk, (sb), (sn));                    \
    (dst)[r_ * DS + c_] = c_ < D ? FCL_KEY_LOAD(src, off_, c_) : 0.0f;                          \
  }

/* ---- GQA packing (PACK 1, for few query rows): a work-group owns kv head hk of its batch, and the rows of its
 * tile are (query row, head) pairs of the heads that share it, r = i * group + (head - hk * group), so K and V
 * are read once for the whole group. Tile row r's query row, head, and element offset from the group's first
 * head's row 0 (sh, sn: the tensor's head and row strides); without PACK, r is the query row of head h.
 * The kernel defines group, hk and h (the group's first head under PACK). */
#ifndef PACK
#define PACK 0
#endif
#if PACK
#define ROW_I(r) ((r) / group)
#define ROW_HEAD(r) (hk * group + (r) % group)
#define ROW_OFF(r, sh, sn) ((long)((r) % group) * (sh) + (long)((r) / group) * (sn))
#else
#define ROW_I(r) (r)
#define ROW_HEAD(r) (h)
#define ROW_OFF(r, sh, sn) ((long)(r) * (sn))
#endif

/* ---- Split-KV: a launch's work-groups also cover `splits` chunks of each row block's visible key tiles
 * (SPLIT 1). Each writes its partial O, float32 and normalised by its own sum, into
 * part_o [splits][batch][heads][nq][D] and its lse (natural log, -inf when its chunk saw nothing, no sink)
 * into part_lse [splits][batch][heads][nq]; combine.cl merges them exactly, adding the sink once. */
#ifndef SPLIT
#define SPLIT 0
#endif
#define FCL_SPLIT_ARGS int splits, __global float *part_o, long part_lse_off /* part_lse = part_o + part_lse_off */

/* The keys [begin, end) of a row block, cut into whole tiles of bc: chunk `split` of `splits` (as equal as
   whole tiles allow; empty when there are fewer tiles than splits). */
inline int2 fcl_split_keys(int begin, int end, int bc, int split, int splits) {
  const int tiles = end > begin ? (end - begin + bc - 1) / bc : 0;
  const int per = (tiles + splits - 1) / splits;
  const int lo = begin + min(split * per, tiles) * bc;
  return (int2)(lo, min(end, lo + per * bc));
}
