/* The global-atomic traffic of accumulating dQ from the dK/dV pass (FlashAttention-2's scheme), alone, for
 * bench/nv_dev/atomics.c: a work-group stands for one block of KEYS keys of one (batch, head) and, for each
 * step of ROWS query rows, adds a ROWS x D block into dq[head] with red.global.add (VEC 1: one float an
 * instruction; VEC 4: red.global.add.v4.f32, sm_90; VEC 0: one 64-bit integer an instruction, as a fixed-point
 * accumulation whose sum does not depend on the adds' order would issue them). Every work-group of a head adds
 * to the same rows in the same order, as the key blocks of the real kernel do. Each add is 2^-10 (2^30 as an
 * integer), so every element ends at (seqlen / KEYS) times that exactly: the host checks that no add was lost. */
#if VEC == 0
typedef ulong acc_t;
#else
typedef float acc_t;
#endif
__kernel void dq_atomics(__global acc_t *dq, int n) {
  __global acc_t *base = dq + (long)get_group_id(1) * n * D;
  const int lid = get_local_id(0), wg = get_local_size(0);
  const float x = 1.0f / 1024.0f;
  for (int s = 0; s < n / ROWS; ++s) {
    __global acc_t *p = base + (long)s * ROWS * D;
#if VEC == 4
    for (int i = lid * 4; i < ROWS * D; i += wg * 4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"((ulong)(p + i)), "f"(x), "f"(x), "f"(x),
                   "f"(x)
                   : "memory");
#elif VEC == 0
    for (int i = lid; i < ROWS * D; i += wg)
      asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"((ulong)(p + i)), "l"((ulong)1 << 30) : "memory");
#else
    for (int i = lid; i < ROWS * D; i += wg)
      asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"((ulong)(p + i)), "f"(x) : "memory");
#endif
  }
}
