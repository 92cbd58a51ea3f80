/* Long key (and query) ranges through the forward and the backward, against the float64 host reference.
 *
 * The regression test of a driver quirk: llvmpipe (rusticl) ends every loop of a work-item silently once
 * it has run 65 535 iterations in one launch, and a long key range then gave inf or wrong output. On every
 * device each case must either be right or be refused with FCL_ERROR_UNSUPPORTED (reported as a skip,
 * with the library's message naming the loop budget); a wrong answer fails. A sliding window keeps
 * each launch short, so those cases run everywhere. Public API only.
 * Usage: test_long_keys */
#include "backward_check.h"
#include "forward_check.h"

#include <string.h>

int main(void) {
  test_seed();
  test_env env;
  if (test_open(&env, NULL)) return 1;
  /* Key ranges of 10 000 and more: hundreds of key tiles per work-group, non-causal and bottom-right causal. */
  static const fwd_case fwd[] = {
      {1, 2, 0, 64, 10000, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1},
      {1, 2, 1, 33, 12345, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1},
      {1, 1, 0, 1, 20000, 32, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 1},
      /* A sliding window over a long range: each block streams only the keys its rows see, so a device with
         a loop budget runs it too. */
      {1, 2, 0, 256, 10000, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, {.window = 1, .left = 128, .right = 0}},
      /* Long query ranges as well: the shapes a planner keeps for long rows (on NVIDIA at head_dim 64 from 1024
         query rows, FlashAttention-2's 128-row, 128-key tile) run only on problems that long. */
      {1, 1, 0, 4103, 4103, 64, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1},
      {1, 2, 1, 4100, 4133, 64, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1},
  };
  for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; ++i)
    run_forward_case(&env, env.queue, &fwd[i], fcl_attention_forward, "forward long keys");
  /* The materialized reference path: its softmax and CLBlast's GEMMs loop over the keys too. */
  run_forward_case(&env, env.queue, &fwd[0], fcl_attention_reference, "reference long keys");
  /* The backward: dQ streams 10 000 keys; dK/dV streams 10 000 query rows (times the group of 2). */
  static const bwd_case bwd[] = {
      {1, 2, 0, 48, 10000, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 0},
      {1, 2, 1, 10000, 40, 32, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 0}, /* not causal: every row sees every key */
      {1, 2, 0, 256, 10000, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 0, {.window = 1, .left = 128, .right = 0}},
  };
  for (size_t i = 0; i < sizeof bwd / sizeof bwd[0]; ++i)
    run_backward_case(&env, env.queue, &bwd[i], 0, "backward long range");
  test_close(&env);
  const int rc = test_summary("test_long_keys");
  return rc == 0 && test_passed == 0 && test_skipped > 0 ? 77 : rc;
}
