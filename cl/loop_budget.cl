/* Loop budget probe (src/loop_budget.c). One work-item runs a loop of n iterations whose trip count the
 * compiler cannot know and writes how many it completed. A driver that silently ends every loop once a
 * work-item has run a fixed number of iterations (llvmpipe: 65 535, shared by all loops of a kernel)
 * writes fewer than n. one[] holds {1, 1}: the load keeps the loop from being folded into a formula. */
__kernel void fcl_loop_budget(__global const int *one, int n, __global int *count) {
  int c = 0;
  for (int i = 0; i < n; ++i) c += one[i & 1];
  count[0] = c;
}
