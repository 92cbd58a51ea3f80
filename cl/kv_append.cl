/* Cache append (fcl_kv_cache_append): token t's K and V rows, every kv head, into the paged pools at slot
 * slots[t] = block * block_size + row. Elements are copied as bits (uint for f32, ushort for f16 and bf16),
 * never through float, so NaN payloads and signed zeros survive.
 *
 * One work-item per element (t, h, c) of the new rows, flattened: n = num_tokens * kv_heads * D; a grid
 * capped by the host loops over the rest. A slot outside [0, num_blocks * block_size), -1 included, is
 * skipped: the host checked that every (block, head, row) inside that range lies inside each pool, so a
 * slot from the caller's scheduler cannot reach a byte outside them.
 * Defines: DTYPE (0 f32, 1 f16, 2 bf16), WG (work-items per group). */
#if DTYPE == 0
typedef uint bits_t;
#else
typedef ushort bits_t;
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fcl_kv_append(__global const bits_t *k_new, long kn_off, long kn_st, long kn_sh,
                   __global const bits_t *v_new, long vn_off, long vn_st, long vn_sh,
                   __global const long *slots, long n, int kv_heads, int d, long block_size, long num_slots,
                   __global bits_t *k_pool, long kp_off, long kp_sb, long kp_sh, long kp_sr,
                   __global bits_t *v_pool, long vp_off, long vp_sb, long vp_sh, long vp_sr) {
  const long step = (long)get_global_size(0);
  for (long i = (long)get_global_id(0); i < n; i += step) {
    const int c = (int)(i % d);
    const long th = i / d;
    const int h = (int)(th % kv_heads);
    const long t = th / kv_heads;
    const long slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue; /* -1 (skip) and any untrusted index beyond the pools */
    const long block = slot / block_size, row = slot % block_size;
    k_pool[kp_off + block * kp_sb + h * kp_sh + row * kp_sr + c] = k_new[kn_off + t * kn_st + h * kn_sh + c];
    v_pool[vp_off + block * vp_sb + h * vp_sh + row * vp_sr + c] = v_new[vn_off + t * vn_st + h * vn_sh + c];
  }
}
