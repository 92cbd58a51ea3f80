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
