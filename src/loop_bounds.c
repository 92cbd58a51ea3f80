/* Loop bounds of one launch, against the device's loop budget (loop_budget.c).
 *
 * Each fcl_*_loop_iterations function is a conservative upper bound of the loop iterations one work-item
 * executes in one launch of a kernel, counting every loop in its source (cl/flash_fwd.cl, cl/flash_bwd.cl,
 * cl/softmax.cl, cl/combine.cl, with LOAD_TILE from cl/common.cl). Every pass of every loop costs one, the
 * small constant-bound ones a compiler usually unrolls included (nest: n * (1 + body)), since a driver's
 * counter may run before unrolling. A loop whose trip count is known only at run time (a bound from an
 * argument, or a start from the work-item's id) also costs two for entering and leaving it (loop): llvmpipe
 * charges one such loop its passes + 1 and n passes over a run-time inner loop of three 5 n + 2
 * (docs/testing.md), so a nest of them costs more than its passes, by one for every time an inner loop is
 * entered. The streamed tiles (key tiles of the forward and of dQ, query tiles of dK/dV) are the only
 * quantity that grows with the sequence; the rest is a fixed cost per launch.
 *
 * fcl_forward_max_key_tiles and fcl_backward_max_tiles turn a budget into the most streamed tiles one launch
 * may process: what a split into bounded launches (split-KV) needs. They return 0 when the budget is 0 (no
 * limit) and -1 when not even one tile fits. When these change, the kernels' loops changed: keep them in step.
 */
#include "internal.h"

#include <stdint.h>

static uint64_t ceil_div(uint64_t a, uint64_t b) { return b ? (a + b - 1) / b : a; }
/* n passes of a loop with constant bounds whose body runs `body` iterations of inner loops. */
static uint64_t nest(uint64_t n, uint64_t body) { return n * (1 + body); }
/* Entering and leaving a loop whose trip count is known at run time only. */
#define LOOP_ENTRY 2
/* n passes of such a loop. */
static uint64_t loop(uint64_t n, uint64_t body) { return nest(n, body) + LOOP_ENTRY; }

/* LOAD_TILE of `rows` rows: a work-item's share of rows * DP elements, from its id on. */
static uint64_t tile_load(const fcl_tile_plan *p, uint64_t rows) {
  return loop(ceil_div(rows * (uint64_t)p->dp, (uint64_t)p->wg), 0);
}

/* Passes of a loop that halves wg down to 1 (a reduction), or doubles 1 up to wg. */
static uint64_t halvings(size_t wg) {
  uint64_t n = 0;
  for (size_t s = wg / 2; s > 0; s >>= 1) ++n;
  return n;
}

/* ---- forward: cl/flash_fwd.cl, one key tile of BC keys per pass of the k0 loop ---- */

static uint64_t forward_per_tile(const fcl_tile_plan *p, int paged) {
  const uint64_t rm = (uint64_t)p->rm, rn = (uint64_t)p->rn, dn = (uint64_t)p->dn, tc = (uint64_t)p->tc;
  /* Paged keys: the tile's block rows (FCL_PAGE_ROWS). */
  const uint64_t page_rows = paged ? loop(ceil_div((uint64_t)p->bc, (uint64_t)p->wg), 0) : 0;
  const uint64_t k_load = tile_load(p, (uint64_t)p->bc);              /* K, transposed or not */
  const uint64_t s_init = nest(rm, rn);
  /* S over head_dim: a column a pass with K transposed or read from global memory (DIRECT), else four. */
  const uint64_t s = nest(p->kt || p->direct ? (uint64_t)p->dp : (uint64_t)p->dp / 4, rn + nest(rm, rn));
  const uint64_t mask = nest(rm, rn);
  const uint64_t alpha = nest(rm, tc + rn);
  const uint64_t v_load = tile_load(p, (uint64_t)p->bc);
  const uint64_t rescale = nest(rm, tc + dn);
  const uint64_t pv = nest((uint64_t)p->bc / 4, rm + nest(4, dn + nest(rm, dn)));
  return 1 + page_rows + k_load + s_init + s + mask + alpha + v_load + rescale + pv;
}

static uint64_t forward_fixed(const fcl_tile_plan *p) {
  const uint64_t rm = (uint64_t)p->rm, dn = (uint64_t)p->dn;
  return halvings((size_t)p->tc) /* the sub-group layout's check */ + tile_load(p, (uint64_t)p->br) +
         nest(rm, dn) /* init */ + rm /* packed rows' modifiers */ + nest(rm, dn + dn) /* sinks' rescale, store */;
}

uint64_t fcl_forward_loop_iterations(const fcl_tile_plan *p, int paged, int64_t key_tiles) {
  /* The key tiles' loop: its entry, then a tile a pass (forward_per_tile counts the pass). */
  return forward_fixed(p) + LOOP_ENTRY + (uint64_t)(key_tiles > 0 ? key_tiles : 0) * forward_per_tile(p, paged);
}

static int64_t max_tiles(uint64_t fixed, uint64_t per_tile, uint64_t budget) {
  if (budget == 0) return 0;
  if (fixed + per_tile > budget) return -1;
  const uint64_t n = (budget - fixed) / per_tile;
  return n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
}

int64_t fcl_forward_max_key_tiles(const fcl_tile_plan *p, int paged, uint64_t budget) {
  return max_tiles(forward_fixed(p) + LOOP_ENTRY, forward_per_tile(p, paged), budget);
}

/* ---- backward: cl/flash_bwd.cl; BM = TR*RM rows owned, BN = TC*RN rows streamed per pass ---- */

static uint64_t backward_per_tile(const fcl_tile_plan *p) {
  const uint64_t rm = (uint64_t)p->rm, rn = (uint64_t)p->rn, dn = (uint64_t)p->dn;
  const uint64_t bn = (uint64_t)p->tc * rn;
  const uint64_t loads = 2 * tile_load(p, bn);          /* Q and dO (dK/dV), or K and V (dQ) */
  const uint64_t rows = loop(ceil_div(bn, (uint64_t)p->wg), 0); /* lse and Dvec of the streamed rows (dK/dV only) */
  const uint64_t s_init = nest(rm, rn);
  const uint64_t s = nest((uint64_t)p->dp / 4, rn + nest(rm, rn));
  const uint64_t ds = nest(rm, rn);
  const uint64_t acc = nest(bn / 4, rm + nest(4, dn + nest(rm, dn)));
  return 1 + loads + rows + s_init + s + ds + acc;
}

static uint64_t backward_fixed(const fcl_tile_plan *p, int64_t group) {
  const uint64_t rm = (uint64_t)p->rm, dn = (uint64_t)p->dn, bm = (uint64_t)p->tr * rm;
  /* Owned tiles (K, V or Q, dO), lse and Dvec of owned rows (dQ), init, store, and dK/dV's loop over the
     group's query heads, each pass entering the loop over that head's tiles (counted whole, as if every head had
     no tile; dQ's single key loop is counted as one such pass). */
  return 2 * tile_load(p, bm) + loop(ceil_div(bm, (uint64_t)p->wg), 0) + nest(rm, dn) + nest(rm, dn) +
         loop((uint64_t)(group > 0 ? group : 1), LOOP_ENTRY);
}

uint64_t fcl_backward_loop_iterations(const fcl_tile_plan *p, int which, int64_t group, int64_t tiles) {
  (void)which; /* both kernels have the same loop structure per streamed tile */
  return backward_fixed(p, group) + (uint64_t)(tiles > 0 ? tiles : 0) * backward_per_tile(p);
}

int64_t fcl_backward_max_tiles(const fcl_tile_plan *p, int which, int64_t group, uint64_t budget) {
  (void)which;
  return max_tiles(backward_fixed(p, group), backward_per_tile(p), budget);
}

/* ---- the backward's d_sinks: cl/flash_bwd.cl BWD_KIND 3, one work-group of wg per head ---- */

uint64_t fcl_dsinks_loop_iterations(int64_t batch, int64_t nq, size_t wg) {
  /* One pass per sequence, and a work-item's share of its rows (at most nq, whatever cu_q holds). */
  const uint64_t b = (uint64_t)(batch > 0 ? batch : 0);
  return loop(b, loop(ceil_div((uint64_t)(nq > 0 ? nq : 0), wg ? wg : 1), 0)) + halvings(wg);
}

/* ---- the combine of split-KV chunks and of fcl_attention_merge's parts: cl/combine.cl, wg per row slice ---- */

uint64_t fcl_combine_loop_iterations(int64_t parts, int64_t d, size_t wg) {
  const fcl_combine_layout c = fcl_combine_layout_of(parts, d, wg);
  const uint64_t n = (uint64_t)(parts > 0 ? parts : 0), vw = (uint64_t)c.vw, lanes = (uint64_t)c.lanes;
  return vw /* A = 0 */ + loop(ceil_div(n, lanes), 2 * vw) /* its parts: loads, update */ + vw /* to local */ +
         lanes /* lanes' maximum */ + vw /* A = 0 */ + nest(lanes, vw) /* lanes' merge */ + vw /* store */;
}

/* ---- the reference path's row softmax: cl/softmax.cl, one work-group of wg per row of nk scores ---- */

uint64_t fcl_softmax_loop_iterations(int64_t nk, size_t wg) {
  const uint64_t per_item = ceil_div((uint64_t)(nk > 0 ? nk : 0), wg ? wg : 1);
  return loop(per_item, 0) /* online max and sum */ + halvings(wg) /* reduction */ + loop(per_item, 0) /* write P */;
}

/* ---- the reference path's exclusion of hidden non-finite V (cl/softmax.cl): fcl_gather_clean_rows reads a
   row's d elements on one work-item; fcl_nonfinite_fixup makes a pass over d for each key of its range ---- */

uint64_t fcl_gather_clean_loop_iterations(int64_t d) { return loop((uint64_t)(d > 0 ? d : 0), 0); }

uint64_t fcl_nonfinite_fixup_loop_iterations(int64_t keys, int64_t d) {
  return loop((uint64_t)(keys > 0 ? keys : 0), loop((uint64_t)(d > 0 ? d : 0), 0));
}

int64_t fcl_nonfinite_fixup_max_keys(int64_t d, uint64_t budget) {
  const uint64_t none = fcl_nonfinite_fixup_loop_iterations(0, d);
  return max_tiles(none, fcl_nonfinite_fixup_loop_iterations(1, d) - none, budget);
}

/* ---- the sequence kernels' check of cu_seqlens (common.cl's fcl_sorted_prefix): once per packed array in every
   work-item, over at most batch + 1 entries, four a pass and up to three after; llvmpipe also charges each of the
   two loops one iteration for entering it, a pass or none. Counted at that measured charge (one an entry, not the
   two of loop() above): the kernels' own run-time loops, counted at two, keep the iteration in hand ---- */

uint64_t fcl_prefix_loop_iterations(const fcl_problem *p) {
  const uint64_t arrays = (uint64_t)(p->cu_q != NULL) + (uint64_t)(p->cu_k != NULL);
  const uint64_t b = (uint64_t)(p->batch > 0 ? p->batch : 0);
  return arrays * ((b + 1) / 4 + 3 + 2);
}

/* ---- the paged cache's append: cl/kv_append.cl, a grid-stride loop from each work-item's id ---- */

uint64_t fcl_kv_append_loop_iterations(int64_t n, size_t global) {
  return loop(ceil_div((uint64_t)(n > 0 ? n : 0), global ? global : 1), 0);
}

/* ---- refusals, with the numbers ---- */

/* The loop iterations a kernel of p has left for its own loops after the cu_seqlens check (0: no budget). */
static fcl_status budget_left(const fcl_device_caps *caps, const fcl_problem *p, uint64_t *left) {
  const uint64_t prefix = fcl_prefix_loop_iterations(p);
  *left = caps->loop_budget;
  if (!caps->loop_budget) return FCL_SUCCESS;
  if (prefix < caps->loop_budget) {
    *left = caps->loop_budget - prefix;
    return FCL_SUCCESS;
  }
  return fcl_fail(FCL_ERROR_UNSUPPORTED,
                  "checking the cu_seqlens entries of %lld sequences takes %llu loop iterations per work-item, but %s "
                  "allows %llu per work-item and launch (%s; beyond it the driver silently ends every loop): refused "
                  "rather than computed wrong",
                  (long long)p->batch, (unsigned long long)prefix, caps->device_name, caps->loop_budget,
                  caps->quirk_detail);
}

/* The most rows of a range of n that a block of `block` rows of the other side sees: the window (wl + wr
   around the diagonal, causal folded in; nk and nq mean unbounded) widened by the block, at most n. The
   kernels stream only that range, from its first tile on. */
static int64_t window_span(int64_t n, int64_t block, const fcl_problem *p) {
  const int64_t span = block + p->wl + p->wr;
  return span < n ? span : n;
}

static fcl_status refuse(const fcl_device_caps *caps, const char *kernel, const char *what, int64_t needed,
                         int64_t rows_per_tile, int64_t fit, uint64_t iterations) {
  return fcl_fail(FCL_ERROR_UNSUPPORTED,
                  "%s needs %lld %s tiles of %lld in one launch (up to %llu loop iterations per work-item), but %s "
                  "allows %llu loop iterations per work-item and launch (%s; beyond it the driver silently ends "
                  "every loop): at most %lld tiles (%lld %s rows) fit, so the problem is refused rather than "
                  "computed wrong",
                  kernel, (long long)needed, what, (long long)rows_per_tile, (unsigned long long)iterations,
                  caps->device_name, caps->loop_budget, caps->quirk_detail, (long long)(fit > 0 ? fit : 0),
                  (long long)(fit > 0 ? fit * rows_per_tile : 0), what);
}

int fcl_forward_budget_splits(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan *plan) {
  const uint64_t prefix = fcl_prefix_loop_iterations(p);
  /* Past the budget the prefix alone is: fcl_forward_within_budget refuses. */
  if (!caps->loop_budget || plan->variant != FCL_VARIANT_PORTABLE_FORWARD || prefix >= caps->loop_budget) return 1;
  const uint64_t budget = caps->loop_budget - prefix;
  const int64_t tiles = (window_span(p->nk, plan->br, p) + plan->bc - 1) / plan->bc;
  const int64_t fit = fcl_forward_max_key_tiles(plan, p->block_table != NULL, budget);
  if (fit <= 0) return 1; /* not even one tile: fcl_forward_within_budget refuses */
  const int64_t need = (tiles + fit - 1) / fit;
  return need > FCL_MAX_SPLITS ? FCL_MAX_SPLITS : need < 1 ? 1 : (int)need;
}

fcl_status fcl_forward_within_budget(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan *plan) {
  /* The bounds describe the portable kernel; vendor kernels run on drivers without a budget. */
  if (!caps->loop_budget || plan->variant != FCL_VARIANT_PORTABLE_FORWARD) return FCL_SUCCESS;
  uint64_t budget;
  const fcl_status st = budget_left(caps, p, &budget);
  if (st) return st;
  int64_t tiles = (window_span(p->nk, plan->br, p) + plan->bc - 1) / plan->bc;
  /* Split-KV: a work-group streams one chunk of ceil(tiles / splits) tiles (fcl_split_keys in common.cl). */
  if (plan->splits > 1) tiles = (tiles + plan->splits - 1) / plan->splits;
  const int64_t fit = fcl_forward_max_key_tiles(plan, p->block_table != NULL, budget);
  if (fit > 0 && tiles <= fit) return FCL_SUCCESS;
  return refuse(caps, "the forward kernel", "key", tiles, plan->bc, fit,
                fcl_forward_loop_iterations(plan, p->block_table != NULL, tiles) + fcl_prefix_loop_iterations(p));
}

fcl_status fcl_backward_within_budget(const fcl_device_caps *caps, const fcl_problem *p, const fcl_tile_plan plans[2],
                                      size_t dsinks_wg) {
  uint64_t budget;
  const fcl_status st = budget_left(caps, p, &budget);
  if (st || !budget) return st;
  const uint64_t prefix = fcl_prefix_loop_iterations(p);
  const fcl_tile_plan *kv = &plans[FCL_BWD_DKDV], *dq = &plans[FCL_BWD_DQ];
  /* dK/dV streams query tiles of every query head of its kv head; dQ streams key tiles. */
  const int64_t kv_tiles = p->group * ((window_span(p->nq, kv->bc, p) + kv->br - 1) / kv->br);
  const int64_t kv_fit = fcl_backward_max_tiles(kv, FCL_BWD_DKDV, p->group, budget);
  if (kv_fit <= 0 || kv_tiles > kv_fit)
    return refuse(caps, "the backward's dK/dV kernel", "query", kv_tiles, kv->br, kv_fit,
                  fcl_backward_loop_iterations(kv, FCL_BWD_DKDV, p->group, kv_tiles) + prefix);
  const int64_t dq_tiles = (window_span(p->nk, dq->br, p) + dq->bc - 1) / dq->bc;
  const int64_t dq_fit = fcl_backward_max_tiles(dq, FCL_BWD_DQ, 1, budget);
  if (dq_fit <= 0 || dq_tiles > dq_fit)
    return refuse(caps, "the backward's dQ kernel", "key", dq_tiles, dq->bc, dq_fit,
                  fcl_backward_loop_iterations(dq, FCL_BWD_DQ, 1, dq_tiles) + prefix);
  /* The pre-pass: ceil(head_dim / lanes) iterations and lanes - 1 more for the row's first work-item, at most
     head_dim in all since lanes <= head_dim (it reads no cu_seqlens). */
  if ((uint64_t)p->d > caps->loop_budget)
    return fcl_fail(FCL_ERROR_UNSUPPORTED, "head_dim %lld exceeds the loop budget of %s (%llu iterations; %s)",
                    (long long)p->d, caps->device_name, caps->loop_budget, caps->quirk_detail);
  /* d_sinks: a work-item's share of each sequence's rows, then the reduction. */
  const uint64_t ds = dsinks_wg ? fcl_dsinks_loop_iterations(p->batch, p->nq, dsinks_wg) : 0;
  if (ds > budget)
    return fcl_fail(FCL_ERROR_UNSUPPORTED,
                    "the backward's d_sinks kernel runs up to %llu loop iterations per work-item over %lld rows, but "
                    "%s allows %llu per work-item and launch (%s; beyond it the driver silently ends every loop): "
                    "refused rather than computed wrong",
                    (unsigned long long)(ds + prefix), (long long)(p->batch * p->nq), caps->device_name, caps->loop_budget,
                    caps->quirk_detail);
  return FCL_SUCCESS;
}

fcl_status fcl_softmax_within_budget(const fcl_device_caps *caps, const fcl_problem *p, size_t wg) {
  uint64_t budget;
  const fcl_status st = budget_left(caps, p, &budget);
  const int64_t nk = p->nk;
  const uint64_t n = fcl_softmax_loop_iterations(nk, wg);
  if (st || !budget || n <= budget) return st;
  return fcl_fail(FCL_ERROR_UNSUPPORTED,
                  "the reference path's softmax over rows of %lld keys runs up to %llu loop iterations per work-item "
                  "(%zu work-items a row), but %s allows %llu per work-item and launch (%s; beyond it the driver "
                  "silently ends every loop): refused rather than computed wrong",
                  (long long)nk, (unsigned long long)(n + fcl_prefix_loop_iterations(p)), wg, caps->device_name,
                  caps->loop_budget, caps->quirk_detail);
}

fcl_status fcl_nonfinite_within_budget(const fcl_device_caps *caps, const fcl_problem *p, int64_t *keys) {
  uint64_t budget;
  const fcl_status st = budget_left(caps, p, &budget);
  if (st) return st;
  const int64_t nk = p->nk, d = p->d;
  const int64_t most = fcl_nonfinite_fixup_max_keys(d, budget);
  if (most < 0 || (budget && fcl_gather_clean_loop_iterations(d) > budget))
    return fcl_fail(FCL_ERROR_UNSUPPORTED,
                    "the reference path's exclusion of non-finite V values runs up to %llu loop iterations per "
                    "work-item for one key of head_dim %lld, but %s allows %llu per work-item and launch (%s; beyond "
                    "it the driver silently ends every loop): refused rather than computed wrong",
                    (unsigned long long)(fcl_nonfinite_fixup_loop_iterations(1, d) + fcl_prefix_loop_iterations(p)),
                    (long long)d, caps->device_name,
                    caps->loop_budget, caps->quirk_detail);
  *keys = most == 0 || most > nk ? nk : most;
  return FCL_SUCCESS;
}

fcl_status fcl_combine_within_budget(const fcl_device_caps *caps, const fcl_problem *p, int64_t parts, size_t wg) {
  uint64_t budget;
  const fcl_status st = budget_left(caps, p, &budget);
  const uint64_t n = fcl_combine_loop_iterations(parts, p->d, wg);
  if (st || !budget || n <= budget) return st;
  return fcl_fail(FCL_ERROR_UNSUPPORTED,
                  "combining %lld parts runs up to %llu loop iterations per work-item, but %s allows %llu per "
                  "work-item and launch (%s; beyond it the driver silently ends every loop): refused rather than "
                  "computed wrong",
                  (long long)parts, (unsigned long long)(n + fcl_prefix_loop_iterations(p)), caps->device_name,
                  caps->loop_budget, caps->quirk_detail);
}
