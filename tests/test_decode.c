/* Decode-shaped forward calls (few query rows, many keys) against the float64 host reference, through
 * whatever split-KV the planner or FLASHCL_FORWARD_SPLITS picks; determinism of the split path; and
 * fcl_attention_merge: the forward over all keys equals the merge of forwards over a partition of them.
 * Usage: test_decode [--small] [--list | --case NAME]
 *   --small              a few cases, for Oclgrind
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "forward_check.h"
#include "test_cases.h"
#include "internal.h" /* fcl_describe_plan's splits are public; FCL_MAX_SPLITS */

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fcl_dtype dtypes[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};

static int add(fwd_case *list, int n, fwd_case c) {
  list[n] = c;
  return n + 1;
}

static int small_cases(fwd_case *list) {
  int n = 0;
  n = add(list, n, (fwd_case){1, 4, 1, 1, 37, 16, FCL_DTYPE_F32, 1, LAYOUT_BNHD, 0, 1});
  n = add(list, n, (fwd_case){2, 2, 2, 3, 50, 8, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1, {0.5f, 2, 0, 0, 1, 20, 0, 1}});
  return n;
}

static int full_cases(fwd_case *list) {
  int n = 0;
  static const long long nqs[] = {1, 2, 3, 4, 8, 16};
  static const long long nks[] = {1, 7, 255, 4097};
  static const long long groups[][2] = {{4, 4}, {8, 2}, {8, 1}}; /* H, Hkv: 1:1, 4:1, MQA */
  int i = 0;
  for (size_t a = 0; a < sizeof nqs / sizeof nqs[0]; ++a)
    for (size_t b = 0; b < sizeof nks / sizeof nks[0]; ++b, ++i) {
      const long long *g = groups[i % 3];
      n = add(list, n, (fwd_case){1 + i % 2, g[0], g[1], nqs[a], nks[b], 64, dtypes[i % 3], i % 2, LAYOUT_BNHD, 0, 1});
    }
  /* 8:1 GQA, a long cache, a causal window, sinks. */
  const test_mods window = {0, 0, 0, 0, 1, 1000, 0, 0}, sinks = {0, 0, 0, 0, 0, 0, 0, 1};
  n = add(list, n, (fwd_case){1, 16, 2, 1, 65537, 128, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 0, 1});
  n = add(list, n, (fwd_case){2, 8, 1, 4, 20000, 64, FCL_DTYPE_BF16, 1, LAYOUT_BNHD, 0, 1, window});
  n = add(list, n, (fwd_case){1, 4, 4, 5, 3000, 128, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, sinks});
  /* GQA packing with per-head modifiers: each packed row takes its own head's slope, mask row and sink. */
  const test_mods per_head = {0.8f, 2, MASK_FULL_F32, 1, 1, 40, 1, 1}, head_mask = {0, 1, MASK_HEAD_BF16, 0, 0, 0, 0, 1};
  n = add(list, n, (fwd_case){2, 8, 2, 3, 517, 64, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 0, 1, per_head});
  n = add(list, n, (fwd_case){1, 16, 2, 1, 300, 40, FCL_DTYPE_BF16, 0, LAYOUT_PADDED, 0, 1, head_mask});
  n = add(list, n, (fwd_case){3, 6, 3, 5, 77, 32, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1, per_head});
  const test_mods all = {1.5f, 1, MASK_GGML_F16, 0, 1, 300, -1, 1};
  n = add(list, n, (fwd_case){2, 4, 2, 8, 999, 96, FCL_DTYPE_F32, 0, LAYOUT_PADDED, 0.2f, 1, all});
  /* f16 and bf16 with GQA at the tensor-core kernel's decode shapes (head_dim 64 to 256, packed tiles of one to
     four warps): on NVIDIA it packs a group's query heads into one tile as the portable kernel does, so each
     row must keep its own position, ALiBi slope, mask row and sink (per-head slopes and masks). */
  const test_mods mma_head = {1.5f, 2, MASK_HEAD_BF16, 1, 1, 300, -1, 1}, causal_mods = {0, 1, MASK_FULL_F32, 0, 0, 0, 0, 1};
  const test_mods band = {0, 0, 0, 0, 1, 100, 0, 0}, ggml = {0, 0, MASK_GGML_F16, 0, 0, 0, 0, 1};
  const test_mods near = {0, 1, 0, 0, 1, 50, 3, 0};
  n = add(list, n, (fwd_case){2, 8, 2, 3, 700, 128, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1, mma_head});
  n = add(list, n, (fwd_case){1, 12, 3, 5, 2000, 64, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1, causal_mods});
  n = add(list, n, (fwd_case){1, 16, 2, 16, 1500, 64, FCL_DTYPE_F16, 1, LAYOUT_BNHD, 0, 1, band});
  n = add(list, n, (fwd_case){2, 8, 1, 2, 3001, 256, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 1, ggml});
  n = add(list, n, (fwd_case){1, 8, 2, 7, 999, 128, FCL_DTYPE_F16, 0, LAYOUT_BHND, 0, 1, near});
  /* Per-head masks whose rows start on 16 bytes (f32 rows of 704, bf16 rows of 704) without a sliding window, so
     that whole tiles of packed rows take NVIDIA's 16-byte mask runs, each row from its own head's mask. */
  const test_mods head_f32 = {0, 1, MASK_FULL_F32, 0, 0, 0, 0, 0}, head_bf16 = {0, 0, MASK_HEAD_BF16, 0, 0, 0, 0, 0};
  n = add(list, n, (fwd_case){1, 8, 2, 2, 701, 128, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1, head_f32});
  n = add(list, n, (fwd_case){1, 8, 2, 3, 704, 64, FCL_DTYPE_BF16, 1, LAYOUT_BHND, 0, 1, head_bf16});
  /* A window whose first key is odd over a ggml mask of 16-byte rows: rounded down to the mask loads' alignment. */
  const test_mods window_ggml = {0, 0, MASK_GGML_F16, 0, 1, 601, 0, 0};
  n = add(list, n, (fwd_case){1, 8, 2, 1, 1501, 128, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1, window_ggml});
  return n;
}

/* Two runs of one split decode case give bitwise the same O; and two split calls enqueued back to back
   without waiting (the second reuses the queue's scratch) give each the O it gives alone. */
static void determinism(test_env *env) {
  const long long B = 1, H = 8, Hkv = 2, Nq = 2, Nk = 3001, D = 64;
  const size_t elems = (size_t)(B * H * Nq * D);
  test_tensor q, q2, k, v, o, o2;
  int setup = tensor_create(env, &q, B, H, Nq, D, LAYOUT_BHND, FCL_DTYPE_F32, 1) |
              tensor_create(env, &q2, B, H, Nq, D, LAYOUT_BHND, FCL_DTYPE_F32, 1) |
              tensor_create(env, &k, B, Hkv, Nk, D, LAYOUT_BHND, FCL_DTYPE_F32, 1) |
              tensor_create(env, &v, B, Hkv, Nk, D, LAYOUT_BHND, FCL_DTYPE_F32, 1) |
              tensor_create(env, &o, B, H, Nq, D, LAYOUT_BHND, FCL_DTYPE_F32, 0) |
              tensor_create(env, &o2, B, H, Nq, D, LAYOUT_BHND, FCL_DTYPE_F32, 0);
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = B, desc.num_heads = H, desc.num_kv_heads = Hkv, desc.seqlen_q = Nq, desc.seqlen_k = Nk, desc.head_dim = D;
  desc.dtype = FCL_DTYPE_F32;
  float *first = malloc(elems * sizeof(float)), *alone2 = malloc(elems * sizeof(float));
  int same = !setup && first && alone2, ran = 0;
  fcl_plan_info info;
  memset(&info, 0, sizeof info);
  fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &desc, &info);
  for (int run = 0; run < 2 && same; ++run) {
    if (tensor_poison(env, &o) ||
        fcl_attention_forward(env->fcl, env->queue, &desc, q.buf, k.buf, v.buf, o.buf, NULL, 0, NULL, NULL) ||
        tensor_read(env, &o)) {
      same = 0;
      break;
    }
    ++ran;
    if (run == 0) memcpy(first, o.host, elems * sizeof(float));
    else same = memcmp(first, o.host, elems * sizeof(float)) == 0;
  }
  check(same && ran == 2, "decode determinism (B=1 H=8 Hkv=2 Nq=2 Nk=3001, %d splits): two runs bitwise equal",
        info.splits);
  int apart = same;
  if (apart &&
      (tensor_poison(env, &o2) ||
       fcl_attention_forward(env->fcl, env->queue, &desc, q2.buf, k.buf, v.buf, o2.buf, NULL, 0, NULL, NULL) ||
       tensor_read(env, &o2)))
    apart = 0;
  if (apart) memcpy(alone2, o2.host, elems * sizeof(float));
  if (apart && (tensor_poison(env, &o) || tensor_poison(env, &o2) ||
                fcl_attention_forward(env->fcl, env->queue, &desc, q.buf, k.buf, v.buf, o.buf, NULL, 0, NULL, NULL) ||
                fcl_attention_forward(env->fcl, env->queue, &desc, q2.buf, k.buf, v.buf, o2.buf, NULL, 0, NULL, NULL) ||
                tensor_read(env, &o) || tensor_read(env, &o2)))
    apart = 0;
  check(apart && memcmp(first, o.host, elems * sizeof(float)) == 0 && memcmp(alone2, o2.host, elems * sizeof(float)) == 0,
        "decode back to back (%d splits): two calls enqueued without waiting give each its O alone, bitwise",
        info.splits);
  free(first), free(alone2);
  tensor_release(&q), tensor_release(&q2), tensor_release(&k), tensor_release(&v), tensor_release(&o);
  tensor_release(&o2);
}

/* The forward over all keys against fcl_attention_merge of forwards over disjoint key ranges: three
   ([0,123) [123,124) [124,700), one part of a single key), or `many` of nearly equal length (many parts in
   each of the combine's part lanes). One more part that saw no key (lse -inf) holds NaN in O: the merge
   leaves it out. Not causal and no position-dependent modifier (a key range's rows would be aligned
   differently); sinks are left out of the parts and added by the merge. */
static void merge_property(test_env *env, fcl_dtype dt, int with_sinks, int many, long long D) {
  const long long B = 2, H = 4, Hkv = 2, Nq = 5, Nk = 700;
  const int nparts = many ? many : 3, all_parts = nparts + 1;
  long long cut[701] = {0, 123, 124, Nk};
  if (many)
    for (int p = 0; p <= many; ++p) cut[p] = Nk * p / many;
  test_tensor q, k, v, o_all, o_merged;
  int setup = tensor_create(env, &q, B, H, Nq, D, LAYOUT_BNHD, dt, 1) |
              tensor_create(env, &k, B, Hkv, Nk, D, LAYOUT_BNHD, dt, 1) |
              tensor_create(env, &v, B, Hkv, Nk, D, LAYOUT_BNHD, dt, 1) |
              tensor_create(env, &o_all, B, H, Nq, D, LAYOUT_BNHD, dt, 0) |
              tensor_create(env, &o_merged, B, H, Nq, D, LAYOUT_BNHD, dt, 0);
  const size_t rows = (size_t)(B * H * Nq), part_elems = o_all.elems;
  cl_int err;
  cl_mem o_parts = clCreateBuffer(env->context, CL_MEM_READ_WRITE, all_parts * part_elems * dtype_size(dt), NULL, &err);
  cl_mem lse_parts = create_float_buffer(env, all_parts * rows, -INFINITY), lse_one = create_float_buffer(env, rows, NAN);
  cl_mem lse_all = create_float_buffer(env, rows, NAN), lse_merged = create_float_buffer(env, rows, NAN);
  fcl_attention_desc desc;
  fwd_case c = {B, H, Hkv, Nq, Nk, D, dt, 0, LAYOUT_BNHD, 0, 1, {0, 0, 0, 0, 0, 0, 0, with_sinks}};
  case_desc(&c, &q, &k, &v, &o_all, &desc);
  mod_buffers mb;
  fcl_status st = setup || mods_create(env, &c.mods, &desc, &mb) ? FCL_ERROR_OUT_OF_RESOURCES : FCL_SUCCESS;
  if (!st) st = fcl_attention_forward(env->fcl, env->queue, &desc, q.buf, k.buf, v.buf, o_all.buf, lse_all, 0, NULL, NULL);
  /* The empty part's O: NaN in the dtype. */
  const unsigned short nan16 = dt == FCL_DTYPE_F16 ? 0x7e00 : 0x7fc0;
  const float nan32 = NAN;
  if (!st && clEnqueueFillBuffer(env->queue, o_parts, dt == FCL_DTYPE_F32 ? (const void *)&nan32 : (const void *)&nan16,
                                 dtype_size(dt), nparts * part_elems * dtype_size(dt), part_elems * dtype_size(dt), 0,
                                 NULL, NULL) != CL_SUCCESS)
    st = FCL_ERROR_OPENCL;
  for (int part = 0; part < nparts && !st; ++part) {
    fcl_attention_desc d = desc;
    d.sinks = NULL;
    d.seqlen_k = cut[part + 1] - cut[part];
    d.k_offset += cut[part] * d.k_stride[2];
    d.v_offset += cut[part] * d.v_stride[2];
    d.o_offset = part * (int64_t)part_elems + desc.o_offset;
    st = fcl_attention_forward(env->fcl, env->queue, &d, q.buf, k.buf, v.buf, o_parts, lse_one, 0, NULL, NULL);
    if (!st && clEnqueueCopyBuffer(env->queue, lse_one, lse_parts, 0, part * rows * sizeof(float), rows * sizeof(float),
                                   0, NULL, NULL) != CL_SUCCESS)
      st = FCL_ERROR_OPENCL;
  }
  if (!st)
    st = fcl_attention_merge(env->fcl, env->queue, &desc, (cl_uint)all_parts, o_parts, (int64_t)part_elems, lse_parts, o_merged.buf,
                             lse_merged, 0, NULL, NULL);
  double max_o = INFINITY, max_lse = INFINITY;
  if (!st && tensor_read(env, &o_all) == 0 && tensor_read(env, &o_merged) == 0) {
    float *a = malloc(rows * sizeof(float)), *m = malloc(rows * sizeof(float));
    double *ref = to_double(o_all.host, rows * (size_t)D);
    rel_error(o_merged.host, ref, rows * (size_t)D, &max_o);
    free(ref);
    if (read_floats(env, lse_all, a, rows) == 0 && read_floats(env, lse_merged, m, rows) == 0) {
      ref = to_double(a, rows);
      rel_error(m, ref, rows, &max_lse);
      free(ref);
    }
    free(a), free(m);
  }
  /* Both sides round O to the dtype: allow its rounding (plus float32 arithmetic). */
  const double tol = dt == FCL_DTYPE_F32 ? 1e-5 : dt == FCL_DTYPE_F16 ? 2e-3 : 1.6e-2;
  check(!st && max_o <= tol && max_lse <= 1e-5,
        "merge of forwards over keys %s%d parts and an empty part = forward over all keys, %s%s: max |O| diff %.2e "
        "(bound %.1e), max |lse| diff %.2e (bound 1e-5)%s%s",
        many ? "[0,700) in " : "[0,123) [123,124) [124,700): ", nparts, dtype_name(dt), with_sinks ? ", sinks added by the merge" : "", max_o, tol, max_lse, st ? ": " : "",
        st ? fcl_last_error() : "");
  mods_release(&mb);
  tensor_release(&q), tensor_release(&k), tensor_release(&v), tensor_release(&o_all), tensor_release(&o_merged);
  clReleaseMemObject(o_parts), clReleaseMemObject(lse_parts), clReleaseMemObject(lse_one);
  clReleaseMemObject(lse_all), clReleaseMemObject(lse_merged);
}

/* fcl_attention_forward_with_workspace: the size it reports is enough, one byte less is refused. */
static void caller_workspace(test_env *env) {
  fwd_case c = {1, 4, 1, 1, 900, 32, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1};
  test_tensor q, k, v, o;
  int setup = tensor_create(env, &q, c.b, c.h, c.nq, c.d, c.layout, c.dtype, 1) |
              tensor_create(env, &k, c.b, c.hkv, c.nk, c.d, c.layout, c.dtype, 1) |
              tensor_create(env, &v, c.b, c.hkv, c.nk, c.d, c.layout, c.dtype, 1) |
              tensor_create(env, &o, c.b, c.h, c.nq, c.d, c.layout, c.dtype, 0);
  fcl_attention_desc desc;
  case_desc(&c, &q, &k, &v, &o, &desc);
  const size_t bytes = fcl_attention_forward_workspace_size(env->fcl, &desc);
  fcl_plan_info info;
  memset(&info, 0, sizeof info);
  fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &desc, &info);
  if (setup) {
    check(0, "caller workspace: could not allocate test buffers");
  } else if (info.splits <= 1) {
    check(bytes == 0, "caller workspace: this call does not split here (1 chunk), workspace size %zu (expect 0)", bytes);
  } else {
    cl_int err;
    cl_mem small = clCreateBuffer(env->context, CL_MEM_READ_WRITE, bytes - 4, NULL, &err);
    cl_mem enough = clCreateBuffer(env->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    fcl_status s1 = fcl_attention_forward_with_workspace(env->fcl, env->queue, &desc, q.buf, k.buf, v.buf, o.buf, NULL,
                                                         small, 0, NULL, NULL);
    fcl_status s2 = fcl_attention_forward_with_workspace(env->fcl, env->queue, &desc, q.buf, k.buf, v.buf, o.buf, NULL,
                                                         enough, 0, NULL, NULL);
    clFinish(env->queue);
    check(s1 == FCL_ERROR_INVALID_ARGUMENT && s2 == FCL_SUCCESS,
          "caller workspace of %zu bytes for %d chunks: %zu - 4 refused (%s), %zu accepted (%s)", bytes, info.splits,
          bytes, fcl_status_string(s1), bytes, fcl_status_string(s2));
    clReleaseMemObject(small), clReleaseMemObject(enough);
  }
  tensor_release(&q), tensor_release(&k), tensor_release(&v), tensor_release(&o);
}

/* The case through the forward, labelled with the number of chunks the planner splits its keys into. */
static void run_decode(test_env *env, const void *arg) {
  const fwd_case *c = arg;
  fcl_plan_info info;
  memset(&info, 0, sizeof info);
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = c->b, desc.num_heads = c->h, desc.num_kv_heads = c->hkv;
  desc.seqlen_q = c->nq, desc.seqlen_k = c->nk, desc.head_dim = c->d, desc.dtype = c->dtype;
  desc.causal = c->causal;
  fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &desc, &info);
  char label[48];
  snprintf(label, sizeof label, "decode (%d chunk%s)", info.splits, info.splits == 1 ? "" : "s");
  run_forward_case(env, env->queue, c, fcl_attention_forward, label);
}

static void run_determinism(test_env *env, const void *unused) {
  (void)unused;
  determinism(env);
}

/* Merge cases: dtype, sinks, parts and head_dim. 300 parts at head_dim 40 give the combine 16 lanes of up to
   19 parts and two column slices, the second part-filled; 60 at head_dim 37 (one column a group) five slices. */
typedef struct merge_case {
  int dtype, sinks, many, d;
} merge_case;

static void run_merge(test_env *env, const void *arg) {
  const merge_case *c = arg;
  merge_property(env, dtypes[c->dtype], c->sinks, c->many, c->d);
}

static void run_caller_workspace(test_env *env, const void *unused) {
  (void)unused;
  caller_workspace(env);
}

int main(int argc, char **argv) {
  test_cli cli = {0, NULL, 0};
  if (test_cli_parse(&cli, argc, argv)) return 2;
  enum { MAX = 72 };
  static fwd_case cases[64];
  static test_case list[MAX];
  static const merge_case merges[5] = {{0, 0, 0, 40}, {1, 1, 0, 40}, {2, 0, 0, 40}, {0, 0, 300, 40}, {0, 0, 60, 37}};
  const int count = cli.small ? small_cases(cases) : full_cases(cases);
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    forward_case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, run_decode, &cases[i]);
  }
  if (!cli.small) {
    n = test_case_add(list, n, MAX, "", "determinism", run_determinism, NULL);
    n = test_case_add(list, n, MAX, "", "merge_f32", run_merge, &merges[0]);
    n = test_case_add(list, n, MAX, "", "merge_f16_sinks", run_merge, &merges[1]);
    n = test_case_add(list, n, MAX, "", "merge_bf16", run_merge, &merges[2]);
    n = test_case_add(list, n, MAX, "", "merge_f32_300_parts", run_merge, &merges[3]);
    n = test_case_add(list, n, MAX, "", "merge_f32_60_parts_d37", run_merge, &merges[4]);
    n = test_case_add(list, n, MAX, "", "caller_workspace", run_caller_workspace, NULL);
  }
  return test_cases_main("test_decode", &cli, list, n);
}
