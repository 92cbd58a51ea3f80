/* Packed (varlen) queries, packed keys, per-sequence key counts and paged K/V pools, against the float64
 * host reference run on each sequence's own dense tensors (gathered on the host): sequences of lengths 1,
 * 15, 16, 17 and 1000 in one batch; decode (1 query row), speculative (5) and whole prompts; block sizes 1,
 * 3, 16, 64 and 256; block tables in random order with blocks shared between sequences (prefix sharing)
 * and garbage in the unused entries; every score modifier; and planted bad indices (a block outside the
 * pool, a key count beyond seqlen_k, packed offsets past the end, packed offsets that decrease so that a later
 * range valid on its own overlaps earlier rows), whose documented outcome is checked
 * element by element: NaN in exactly the rows that see a bad block, NaN in every row of a sequence with a
 * bad key count, and nothing written for a sequence whose query offsets do not fit. The inputs come from
 * sequence_inputs.c, shared with test_sequences_backward.c.
 * Usage: test_sequences [--small] [--reference | --budget-edge] [--list | --case NAME]
 *   --reference          the same cases, planted bad indices included, through fcl_attention_reference
 *                        (CLBlast), which must give the forward's documented outcome
 *   --budget-edge        on a device with a loop budget: paged keys at the most tiles a launch admits
 *   --small              a few small cases, for Oclgrind (which proves no access leaves a buffer)
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "forward_check.h"
#include "host_reference.h"
#include "internal.h" /* fcl_reference_scratch_bytes */
#include "sequence_inputs.h"
#include "test_cases.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Runs case c through fn (fcl_attention_forward or fcl_attention_reference); label names fn in messages. */
static void run_sequence_case(test_env *env, const seq_case *c, fwd_fn fn, const char *label) {
  char name[TEST_CASE_NAME_MAX];
  seq_case_name(c, name, sizeof name);
  const int B = c->b, H = c->h, D = c->d;
  seq_inputs in;
  int setup = seq_inputs_create(env, c, &in);
  const size_t q_elems = in.q_elems, lse_rows = (size_t)in.total_q * H;
  cl_mem o = seq_dtype_buffer(env, NULL, q_elems, c->dtype, NAN), lse = create_float_buffer(env, lse_rows, NAN);
  setup |= !o || !lse;

  float *got = malloc(q_elems * sizeof(float)), *got_lse = malloc(lse_rows * sizeof(float));
  fcl_status st = FCL_ERROR_OPENCL;
  if (!setup) {
    cl_event ev = NULL;
    st = fn(env->fcl, env->queue, &in.desc, in.q, in.k, in.v, o, lse, 0, NULL, &ev);
    if (st == FCL_SUCCESS) {
      clWaitForEvents(1, &ev);
      clReleaseEvent(ev);
      if (seq_read_dtype(env, o, got, q_elems, c->dtype) || read_floats(env, lse, got_lse, lse_rows))
        st = FCL_ERROR_OPENCL;
    }
  }

  /* The host reference, sequence by sequence, on its own dense tensors. Planted bad indices (seq_bad_for) and
     what each must give: NaN in exactly the rows that see a bad block, NaN in every row of a
     sequence with a bad key count or key offsets, nothing written for one whose query offsets do not fit. */
  double err2 = 0, ref2 = 0, max_abs = 0, lse_max = 0;
  long nan_wrong = 0, checked_rows = 0;
  if (st == FCL_SUCCESS) {
    for (int b = 0; b < B; ++b) {
      const int nq = in.nq[b];
      seq_reference r;
      seq_reference_make(&in, b, &r);
      double *ro = malloc((size_t)H * nq * D * sizeof(double) + 1), *rl = malloc((size_t)H * nq * sizeof(double) + 1);
      reference_forward(&r.desc, &r.mods, r.q, r.k, r.v, ro, rl);
      const int bad = seq_bad_for(c, b);
      const int whole_nan = bad == BAD_SEQLEN || bad == BAD_CU_K;
      const int unwritten = bad == BAD_CU_Q; /* still the NaN poison */
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < nq; ++i) {
          ++checked_rows;
          const size_t row = seq_q_at(&in, b, h, i), lrow = seq_lse_at(&in, b, h, i);
          const double rlse = rl[(size_t)h * nq + i];
          const float gl = got_lse[lrow];
          if (whole_nan || unwritten || isnan(rlse)) nan_wrong += !isnan(gl);
          else if (rlse == -INFINITY) nan_wrong += gl != -INFINITY;
          else lse_max = fmax(lse_max, isnan(gl) ? INFINITY : fabs(gl - rlse));
          for (int d = 0; d < D; ++d) {
            const double x = ro[((size_t)h * nq + i) * D + d];
            const float g = got[row + d];
            if (whole_nan || unwritten || isnan(x)) {
              nan_wrong += !isnan(g);
              continue;
            }
            const double e = isnan(g) ? INFINITY : fabs(g - x);
            err2 += e * e, ref2 += x * x, max_abs = fmax(max_abs, e);
          }
        }
      free(ro), free(rl);
      seq_reference_free(&r);
    }
  }
  const double rel = sqrt(err2) / fmax(sqrt(ref2), 1e-30), tol = forward_tolerance(c->dtype);
  /* The reference may refuse only as a build or device limit, never the sequences themselves. */
  if (st == FCL_ERROR_UNSUPPORTED && fn == fcl_attention_reference &&
      (strstr(fcl_last_error(), "without CLBlast") || strstr(fcl_last_error(), "loop budget")))
    skip("%s %s: %s", label, name, fcl_last_error());
  else if (st != FCL_SUCCESS) check(0, "%s %s: %s: %s", label, name, fcl_status_string(st), fcl_last_error());
  else
    check(rel <= tol && lse_max <= FWD_TOL_LSE && nan_wrong == 0,
          "%s %s: rel %.2e (bound %.1e) max abs %.2e, lse max abs %.2e (bound %.0e), %ld rows, %ld elements "
          "where the expected NaN, -inf or poison differs",
          label, name, rel, tol, max_abs, lse_max, FWD_TOL_LSE, checked_rows, nan_wrong);

  free(got), free(got_lse);
  if (o) clReleaseMemObject(o);
  if (lse) clReleaseMemObject(lse);
  seq_inputs_release(&in);
}

static void run_forward(test_env *env, const void *c) { run_sequence_case(env, c, fcl_attention_forward, "forward"); }
static void run_reference(test_env *env, const void *c) {
  run_sequence_case(env, c, fcl_attention_reference, "reference");
}

/* The reference's scratch counts the gathered tensors: packed queries and paged keys add float32 copies of Q, K
   and O (padded to the longest sequence) to what the same shape on dense contiguous float32 tensors needs (which
   CLBlast reads in place), and nothing else. */
static void run_reference_scratch(test_env *env, const void *unused) {
  (void)unused;
  if (getenv("FLASHCL_REFERENCE_CHUNK")) {
    skip("reference scratch: FLASHCL_REFERENCE_CHUNK changes the chunk this check assumes");
    return;
  }
  enum { B = 2, H = 2, NQ = 5, NK = 7, D = 8 };
  fcl_attention_desc dense;
  memset(&dense, 0, sizeof dense);
  dense.batch = B, dense.num_heads = H, dense.seqlen_q = NQ, dense.seqlen_k = NK, dense.head_dim = D;
  dense.dtype = FCL_DTYPE_F32;
  const int cu[B + 1] = {0, 3, 8}, table[B * 2] = {0, 1, 2, 3};
  cl_mem cuq = seq_int_buffer(env, cu, B + 1), tab = seq_int_buffer(env, table, B * 2);
  fcl_attention_desc seq = dense;
  seq.cu_seqlens_q = cuq, seq.total_q = 8;
  seq.block_table = tab, seq.block_table_stride = 2, seq.block_size = 4, seq.num_blocks = 4;
  const size_t base = fcl_reference_scratch_bytes(env->fcl, &dense), with = fcl_reference_scratch_bytes(env->fcl, &seq);
  const size_t copies = (size_t)B * H * (2 * NQ + NK) * D * sizeof(float);
  if (base == 0 && with == 0) skip("reference scratch: 0 bytes (built without CLBlast)");
  else
    check(cuq && tab && base > 0 && with == base + copies,
          "reference scratch: %zu bytes dense, %zu packed and paged (expected %zu more: the Q, K and O copies)", base,
          with, copies);
  if (cuq) clReleaseMemObject(cuq);
  if (tab) clReleaseMemObject(tab);
}

/* The paged edge's case: one sequence of *lens keys, 8 query rows, blocks of 16. */
static seq_case paged_edge_case(const int *lens) {
  return (seq_case){1, 2, 2, 64, FCL_DTYPE_F32, 0, 0, KV_PAGED, 16, 0, 8, lens, 0, {0}};
}

/* The plan ctx's forward takes for c (and its resolved problem); FCL_SUCCESS or why not. */
static fcl_status paged_edge_plan(test_env *env, fcl_context *ctx, const seq_case *c, fcl_problem *p,
                                  fcl_tile_plan *plan) {
  seq_inputs in;
  fcl_status st = seq_inputs_create(env, c, &in) == 0 ? FCL_SUCCESS : FCL_ERROR_OPENCL;
  cl_kernel kernel;
  if (!st) {
    pthread_mutex_lock(&ctx->lock);
    st = fcl_resolve_problem(&in.desc, p);
    if (!st) st = fcl_select_forward(ctx, p, plan, &kernel);
    pthread_mutex_unlock(&ctx->lock);
  }
  seq_inputs_release(&in);
  return st;
}

/* On a device with a loop budget (llvmpipe): paged keys at the most key tiles one launch of the forward admits,
   in a context that splits no key range for occupancy (the plan must run it unsplit), and one tile more (split by
   the budget), against the reference: the count (loop_bounds.c, block rows a tile included) must not admit a
   launch llvmpipe cuts short. */
static void run_paged_edge(test_env *env, const void *unused) {
  (void)unused;
  const unsigned long long budget = env->fcl->caps.loop_budget;
  if (!budget) {
    skip("paged keys at the budget's edge: %s has no loop budget", env->device_name);
    return;
  }
  fcl_context *one = test_context_unsplit(env), *own = env->fcl;
  if (!one) {
    check(0, "paged keys at the budget's edge: context: %s", fcl_last_error());
    return;
  }
  int lens[1] = {64};
  const seq_case c = paged_edge_case(lens);
  fcl_problem p;
  fcl_tile_plan plan;
  fcl_status st = paged_edge_plan(env, one, &c, &p, &plan);
  const uint64_t prefix = st ? 0 : fcl_prefix_loop_iterations(&p);
  const int64_t tiles = st ? -1 : fcl_forward_max_key_tiles(&plan, 1, prefix < budget ? budget - prefix : 0);
  if (st) check(0, "paged keys at the budget's edge: no plan: %s", fcl_last_error());
  else if (tiles < 1)
    check(0, "paged keys at the budget's edge: no key tile of %d fits the budget of %llu", plan.bc, budget);
  else {
    lens[0] = (int)(tiles * plan.bc);
    st = paged_edge_plan(env, one, &c, &p, &plan);
    check(!st && plan.splits == 1, "paged keys at the budget's edge: %d keys in one launch (splits %d)", lens[0],
          st ? -1 : plan.splits);
    env->fcl = one;
    run_sequence_case(env, &c, fcl_attention_forward, "forward at the edge");
    lens[0] += plan.bc;
    run_sequence_case(env, &c, fcl_attention_forward, "forward one tile past the edge");
    env->fcl = own;
  }
  fcl_context_release(one);
}

/* ---- the case lists ---- */

static const int lens_mixed[5] = {1, 15, 16, 17, 1000};
static const int lens_short[3] = {5, 1, 17};
static const int lens_two[2] = {40, 33};

static int add(seq_case *list, int n, seq_case c) {
  list[n] = c;
  return n + 1;
}

static int small_cases(seq_case *list) {
  int n = 0;
  const test_mods none = {0};
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F32, 1, 1, KV_PAGED, 3, 0, 0, lens_short, BAD_NONE, none});
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F16, 1, 1, KV_PAGED, 4, 0, 0, lens_short, BAD_BLOCK, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 2, lens_short, BAD_CU_Q, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_BF16, 0, 0, KV_DENSE, 0, 0, 1, lens_short, BAD_SEQLEN, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K, none});
  n = add(list, n, (seq_case){3, 2, 2, 8, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 2, lens_short, BAD_CU_Q_ORDER, none});
  n = add(list, n, (seq_case){3, 2, 1, 8, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K_ORDER, none});
  return n;
}

static int full_cases(seq_case *list) {
  int n = 0;
  const test_mods none = {0};
  static const fcl_dtype dt[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  /* Paged decode, speculative and chunked prefill over every block size; prefix sharing. */
  static const int block_sizes[5] = {1, 3, 16, 64, 256};
  for (int i = 0; i < 5; ++i) {
    n = add(list, n, (seq_case){5, 8, 2, 64, dt[i % 3], 1, 0, KV_PAGED, block_sizes[i], i % 2, 1, lens_mixed, 0, none});
    n = add(list, n, (seq_case){5, 4, 4, 40, dt[(i + 1) % 3], 1, 1, KV_PAGED, block_sizes[i], 0, 5, lens_mixed, 0, none});
  }
  n = add(list, n, (seq_case){2, 4, 1, 64, FCL_DTYPE_F16, 1, 1, KV_PAGED, 16, 1, 0, lens_two, 0, none});
  /* Varlen prefill: packed queries and keys, whole prompts, causal and not. */
  for (int t = 0; t < 3; ++t) {
    n = add(list, n, (seq_case){5, 4, 2, 64, dt[t], 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, none});
    n = add(list, n, (seq_case){3, 2, 2, 33, dt[t], 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, none});
  }
  /* Dense [batch] keys with per-sequence counts (a padded KV cache), decode and 5 rows. */
  n = add(list, n, (seq_case){5, 8, 1, 128, FCL_DTYPE_F16, 1, 0, KV_DENSE, 0, 0, 1, lens_mixed, 0, none});
  n = add(list, n, (seq_case){5, 2, 2, 16, FCL_DTYPE_F32, 0, 0, KV_DENSE, 0, 0, 5, lens_mixed, 0, none});
  /* Packed keys whose ranges hold spare rows past each sequence's seqlens_k (FA2's seqused_k). */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, 0, none, 3});
  n = add(list, n, (seq_case){3, 4, 2, 32, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 4, lens_short, BAD_SEQLEN, none, 2});
  /* Every modifier with each layout. */
  const test_mods all = {1.5f, 2, MASK_FULL_F32, 0, 1, 9, 2, 1}, ggml = {0, 1, MASK_GGML_F16, 1, 0, 0, 0, 1};
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PAGED, 16, 0, 0, lens_short, 0, all});
  n = add(list, n, (seq_case){3, 4, 2, 64, FCL_DTYPE_F16, 0, 1, KV_PACKED, 0, 0, 0, lens_short, 0, ggml});
  n = add(list, n, (seq_case){3, 4, 4, 32, FCL_DTYPE_BF16, 1, 0, KV_DENSE, 0, 0, 3, lens_short, 0, all});
  /* Planted bad indices. */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PAGED, 16, 0, 0, lens_mixed, BAD_BLOCK, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 0, KV_PAGED, 16, 0, 1, lens_mixed, BAD_BLOCK, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 0, KV_PAGED, 16, 0, 1, lens_mixed, BAD_SEQLEN, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K, none});
  /* Packed offsets that decrease once: the sequences from there on, each valid alone, overlap earlier rows. */
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F32, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q_ORDER, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_BF16, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K_ORDER, none});
  /* The decrease two ranges before the last, so that the last one is in order with its neighbour; with one query
     row a sequence it lands on a skipped sequence's row. A negative first entry: every sequence untrusted. */
  n = add(list, n, (seq_case){5, 8, 2, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 1, lens_mixed, BAD_CU_Q_ORDER_EARLY, none});
  n = add(list, n, (seq_case){5, 4, 2, 64, FCL_DTYPE_F16, 1, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_K_ORDER_EARLY, none});
  n = add(list, n, (seq_case){5, 4, 2, 32, FCL_DTYPE_F32, 0, 1, KV_PACKED, 0, 0, 0, lens_mixed, BAD_CU_Q_NEGATIVE, none});
  n = add(list, n, (seq_case){3, 4, 2, 32, FCL_DTYPE_BF16, 1, 1, KV_PACKED, 0, 0, 0, lens_short, BAD_CU_K_NEGATIVE, none});
  return n;
}

int main(int argc, char **argv) {
  int reference = 0, budget_edge = 0;
  test_cli cli = {0, NULL, 0};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--reference")) reference = 1;
    else if (!strcmp(argv[i], "--budget-edge")) budget_edge = 1;
    else if (!test_cli_option(&cli, argc, argv, &i)) {
      fprintf(stderr, "usage: %s [--small] [--reference | --budget-edge] [--list | --case NAME]\n", argv[0]);
      return 2;
    }
  }
  if (budget_edge && reference) {
    fprintf(stderr, "%s: --budget-edge runs the forward, not --reference\n", argv[0]);
    return 2;
  }
  if (budget_edge) {
    test_case edge[1];
    const int one = test_case_add(edge, 0, 1, "", "paged_at_the_budget_edge", run_paged_edge, NULL);
    return test_cases_main("test_sequences", &cli, edge, one);
  }
  enum { MAX = 64 };
  static seq_case cases[MAX];
  static test_case list[MAX];
  const int count = cli.small ? small_cases(cases) : full_cases(cases);
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    seq_case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, reference ? run_reference : run_forward, &cases[i]);
  }
  if (reference && !cli.small) n = test_case_add(list, n, MAX, "", "scratch_counts_gathered_tensors", run_reference_scratch, NULL);
  return test_cases_main("test_sequences", &cli, list, n);
}
