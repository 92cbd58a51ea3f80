/* libFuzzer target: descriptor validation. The fuzz bytes fill the whole fcl_attention_desc (fields added
 * later are fuzzed too; bytes past the input are zero), then every check that needs no OpenCL object runs:
 * fcl_resolve_problem, the byte range of each tensor, the output overlap rule and the row count. Any
 * crash, sanitizer report or broken invariant below is a finding. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void require(int ok) {
  if (!ok) abort(); /* an invariant of an accepted descriptor does not hold */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  memcpy(&desc, data, size < sizeof desc ? size : sizeof desc);
  fcl_problem p;
  if (fcl_resolve_problem(&desc, &p) != FCL_SUCCESS) {
    require(fcl_last_error()[0] != '\0');
    return 0;
  }
  require(p.batch >= 1 && p.heads >= 1 && p.kv_heads >= 1 && p.heads % p.kv_heads == 0 && p.nq >= 1 &&
          p.nk >= 1 && p.d >= 1 && p.d <= FCL_MAX_HEAD_DIM && (p.elem_size == 2 || p.elem_size == 4));
  const int64_t *strides[4] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride};
  const int64_t offsets[4] = {p.q_offset, p.k_offset, p.v_offset, p.o_offset};
  for (int t = 0; t < 4; ++t) {
    const int64_t *counts = t == 1 || t == 2 ? p.kv_counts : p.q_counts;
    for (int i = 0; i < 3; ++i) require(strides[t][i] >= 0 && counts[i] >= 1);
    require(counts[1] == (t == 1 || t == 2 ? p.kv_heads : p.heads));
    require(offsets[t] >= 0);
    uint64_t first = 0, end = 0;
    if (fcl_tensor_bytes(&p, "t", counts, strides[t], offsets[t], &first, &end) == FCL_SUCCESS)
      require(first < end && end <= SIZE_MAX && (end - first) % p.elem_size == 0);
    if (t == 3) (void)fcl_check_no_overlap("o", &p, counts, strides[t], "o");
  }
  /* Sequences: packed sides count their rows in int32; paged keys fit the table. */
  require(!p.cu_q || (p.total_q >= 1 && p.total_q <= INT32_MAX && p.q_counts[2] == p.total_q));
  require(!p.cu_k || (p.total_k >= 1 && p.total_k <= INT32_MAX && !p.block_table));
  require(!p.block_table || (p.block_size >= 1 && p.block_size <= 1024 && p.num_blocks >= 1 &&
                             p.table_stride * p.block_size >= p.nk));
  uint64_t seq[4][2];
  fcl_sequence_bytes(&p, seq);
  size_t rows = 0, padded = 0;
  if (fcl_row_count(&p, &rows) == FCL_SUCCESS) require(rows >= 1);
  if (fcl_padded_rows(&p, &padded) == FCL_SUCCESS) require(padded >= 1);
  return 0;
}
