/* Development overrides of the plans (FLASHCL_FORWARD_SHAPE, FLASHCL_FORWARD_MMA_SHAPE, FLASHCL_FORWARD_SPLITS,
 * FLASHCL_BACKWARD_SHAPE, FLASHCL_PORTABLE_BACKWARD_SHAPE): read
 * from the environment once per context, kept apart from the device's capabilities, and given to every planner
 * beside them. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Largest work-items per dimension and rows or keys per work-item an override may ask for: far above any
   device's limits, far below where tr * rm or tr * tc could overflow an int. */
#define FCL_SHAPE_MAX_ITEMS 4096
#define FCL_SHAPE_MAX_PER_ITEM 256

/* Up to max comma-separated integers from text into v, the i-th within [lo[i], hi[i]] and a multiple of step[i]:
   their count, or -1 for anything else (v may then be partly written). */
static int parse_list(const char *text, int *v, int max, const long *lo, const long *hi, const long *step) {
  int n = 0;
  const char *p = text;
  for (;;) {
    char *end;
    errno = 0;
    const long x = strtol(p, &end, 10);
    if (end == p || errno != 0 || n == max || x < lo[n] || x > hi[n] || x % step[n] != 0) return -1;
    v[n++] = (int)x;
    p = end;
    if (*p == '\0') return n;
    if (*p++ != ',') return -1;
  }
}

int fcl_parse_forward_shape(const char *text, int shape[5]) {
  static const long lo[5] = {1, 1, 1, 1, -1}, hi[5] = {FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_PER_ITEM,
                                                       FCL_SHAPE_MAX_PER_ITEM, 1},
                    step[5] = {1, 1, 1, 1, 1};
  int v[5] = {0, 0, 0, 0, -1};
  if (parse_list(text, v, 5, lo, hi, step) < 4) return -1;
  memcpy(shape, v, sizeof v);
  return 0;
}

int fcl_parse_backward_shape(const char *text, int shape[7]) {
  static const long lo[7] = {1, 16, 1, 16, 0, 1, 1}, hi[7] = {8, 128, 8, 128, 2, 2, 2},
                    step[7] = {1, 16, 1, 16, 1, 1, 1};
  int v[7] = {0, 0, 0, 0, 0, 1, 1};
  if (parse_list(text, v, 7, lo, hi, step) < 4) return -1;
  memcpy(shape, v, sizeof v);
  return 0;
}

int fcl_parse_forward_mma_shape(const char *text, int shape[6]) {
  static const long lo[6] = {1, 1, 16, 0, 2, 0}, hi[6] = {8, 4, 128, 1, 8, 15}, step[6] = {1, 1, 16, 1, 1, 1};
  int v[6] = {0, 0, 0, 0, 2, 0};
  if (parse_list(text, v, 6, lo, hi, step) < 4) return -1;
  memcpy(shape, v, sizeof v);
  return 0;
}

int fcl_parse_portable_backward_shape(const char *text, int shape[8]) {
  static const long lo[8] = {1, 1, 1, 1, 1, 1, 1, 1},
                    hi[8] = {FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_PER_ITEM, FCL_SHAPE_MAX_PER_ITEM,
                             FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_ITEMS, FCL_SHAPE_MAX_PER_ITEM, FCL_SHAPE_MAX_PER_ITEM},
                    step[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int v[8];
  const int n = parse_list(text, v, 8, lo, hi, step);
  if (n != 4 && n != 8) return -1;
  if (n == 4) memcpy(v + 4, v, 4 * sizeof v[0]);
  memcpy(shape, v, sizeof v);
  return 0;
}

void fcl_read_plan_overrides(fcl_plan_overrides *out) {
  memset(out, 0, sizeof *out);
  /* FLASHCL_FORWARD_SHAPE=tr,tc,rm,rn[,kt]; anything else is ignored (the default plan). */
  const char *shape = getenv("FLASHCL_FORWARD_SHAPE");
  if (shape) (void)fcl_parse_forward_shape(shape, out->forward_shape);
  /* FLASHCL_FORWARD_MMA_SHAPE=warps,tiles,keys,qsmem[,stages[,qregs]]: the tensor-core forward's first shape; anything
     else is ignored. */
  const char *mshape = getenv("FLASHCL_FORWARD_MMA_SHAPE");
  if (mshape) (void)fcl_parse_forward_mma_shape(mshape, out->forward_mma_shape);
  /* FLASHCL_FORWARD_SPLITS=n forces split-KV on every forward (1..128; anything else: the planner decides). */
  const char *splits = getenv("FLASHCL_FORWARD_SPLITS");
  if (splits && atoi(splits) >= 1 && atoi(splits) <= FCL_MAX_SPLITS) out->forward_splits = atoi(splits);
  /* FLASHCL_BACKWARD_SHAPE=dkdv_warps,dkdv_rows,dq_warps,dq_keys[,kv_resident[,dq_tiles[,dkdv_tiles]]]: the
     tensor-core backward's first shapes (the measurements of docs/notes-nvidia.md, v10, without rebuilding;
     kv_resident 1: the dK/dV kernel keeps K and V in local memory, KV_RESIDENT; 2: also FlashAttention-2's warp
     tiles, WARP2D; dq_tiles 2: each dQ warp owns two m16 tiles of query rows, QT; dkdv_tiles 2: each dK/dV warp
     owns two m16 tiles of keys, with kv_resident 1); anything else is ignored. */
  const char *bshape = getenv("FLASHCL_BACKWARD_SHAPE");
  if (bshape) (void)fcl_parse_backward_shape(bshape, out->backward_shape);
  /* FLASHCL_PORTABLE_BACKWARD_SHAPE=tr,tc,rm,rn[,tr,tc,rm,rn]: the portable backward's shapes (dK/dV, dQ) for
     measuring them on a device without rebuilding; anything else is ignored. */
  const char *pshape = getenv("FLASHCL_PORTABLE_BACKWARD_SHAPE");
  if (pshape) (void)fcl_parse_portable_backward_shape(pshape, out->portable_backward_shape);
}
