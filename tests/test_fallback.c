/* A vendor kernel variant that does not build falls back to the portable one: the device is made to look like
 * an NVIDIA GPU of compute capability 9.0 (so the tensor-core forward and backward planners accept f16 at
 * head_dim 64) while FLASHCL_KERNEL_DIR serves sources in which the tensor-core kernels do not compile. Then:
 * the portable variant runs, with results bitwise equal to a context that never tried the vendor variant; the
 * reason says why; the failure is remembered (the next call neither builds the vendor kernel again nor writes
 * the last error); and the failed build's log does not linger as the thread's last error.
 * And a driver that keeps kernels to the local memory it reports: the tensor-core forward's sources build only
 * where its tile fits 48 KiB, on a device whose kernels' own arrays are taken to reach 227 KiB
 * (caps->nv_static_local). head_dim 128's larger tiles fail to build, and the forward and the backward plan within
 * 48 KiB instead, still on the tensor-core variants, from then on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

/* prefix, then text, into the file at path. */
static int write_text(const char *path, const char *prefix, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const int ok = fputs(prefix, f) >= 0 && fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* A tensor-core forward that builds only where its tile (as flash_fwd_mma.cl counts it, 2-byte elements) fits 48
   KiB; its kernel does nothing (the test only plans and builds). ptx.cl is left out and common.cl's inline PTX
   turned off (FCL_PTX 0), as a CPU's compiler would not take them. */
static const char *const local_limited_forward =
    "#define QDS (DS - QREG * 16)\n"
    "#define LOCAL_BYTES ((STAGES * BC * DS + QSMEM * NW * MT * 16 * QDS) * 2)\n"
    "#if LOCAL_BYTES > 49152 - 16\n"
    "#error \"local memory beyond the 48 KiB the device reports\"\n"
    "#endif\n"
    "__kernel __attribute__((reqd_work_group_size(NW * 32, 1, 1))) void flash_fwd_mma(__global int *unused) {}\n";

/* The tensor-core backward's two kernels likewise, counting their local memory as flash_bwd_mma.cl does (dK/dV:
   step buffers, K and V where they sit, lse and Dvec; dQ: the K and V tiles or the dQ tile). */
static const char *const local_limited_backward =
    "#ifndef KV_RESIDENT\n#define KV_RESIDENT 0\n#endif\n"
    "#define BM (NW * 16)\n"
    "#define EB (DTYPE == 0 ? 4 : 2)\n"
    "#if MMA_KIND == 1\n"
    "#define ROWS (KV_RESIDENT ? 4 * BN + 2 * BM : DTYPE == 0 || (BM > BN && BM <= 2 * BN) ? 4 * BN : "
    "2 * BN + (BM > BN ? 2 * BM : 2 * BN))\n"
    "#define LOCAL_BYTES (ROWS * DS * EB + 4 * BN * 4)\n"
    "#else\n"
    "#define LOCAL_BYTES ((4 * BN > BM ? 4 * BN : BM) * DS * EB)\n"
    "#endif\n"
    "#if LOCAL_BYTES > 49152 - 16\n"
    "#error \"local memory beyond the 48 KiB the device reports\"\n"
    "#endif\n"
    "__kernel __attribute__((reqd_work_group_size(NW * 32, 1, 1))) void flash_bwd_dkdv_mma(__global int *unused) {}\n"
    "__kernel __attribute__((reqd_work_group_size(NW * 32, 1, 1))) void flash_bwd_dq_mma(__global int *unused) {}\n";

/* Every embedded source into dir (and dir/nvidia), the tensor-core kernels replaced by text that does not
   compile (local_limited: by local_limited_forward and local_limited_backward, ptx.cl by an empty file,
   common.cl without inline PTX). Returns 0 on success. */
static int write_sources(const char *dir, int local_limited) {
  char path[512];
  snprintf(path, sizeof path, "%s/nvidia", dir);
  if (mkdir(path, 0700) != 0) return -1;
  for (int i = 0; i < fcl_embedded_source_count; ++i) {
    const char *name = fcl_embedded_sources[i].name;
    const int fwd = strcmp(name, "nvidia/flash_fwd_mma.cl") == 0, ptx = strcmp(name, "nvidia/ptx.cl") == 0;
    const int bwd = strcmp(name, "nvidia/flash_bwd_mma.cl") == 0;
    const char *text = local_limited && fwd ? local_limited_forward
                       : local_limited && bwd ? local_limited_backward
                       : local_limited && ptx ? "\n"
                       : fwd || bwd           ? "this is not OpenCL C;\n"
                                              : fcl_embedded_sources[i].text;
    const int no_ptx = local_limited && strcmp(name, "common.cl") == 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (write_text(path, no_ptx ? "#undef FCL_PTX\n#define FCL_PTX 0\n" : "", text)) return -1;
  }
  return 0;
}

static void remove_sources(const char *dir) {
  char path[512];
  for (int i = 0; i < fcl_embedded_source_count; ++i) {
    snprintf(path, sizeof path, "%s/%s", dir, fcl_embedded_sources[i].name);
    remove(path);
  }
  snprintf(path, sizeof path, "%s/nvidia", dir);
  rmdir(path);
  rmdir(dir);
}

static uint64_t source_builds(fcl_context *ctx) {
  fcl_cache_stats s;
  return fcl_context_cache_stats(ctx, &s) == FCL_SUCCESS ? s.source_builds : 0;
}

static int same_bits(test_env *env, cl_mem a, cl_mem b, size_t bytes) {
  unsigned char *x = malloc(bytes), *y = malloc(bytes);
  int same = x && y && clEnqueueReadBuffer(env->queue, a, CL_TRUE, 0, bytes, x, 0, NULL, NULL) == CL_SUCCESS &&
             clEnqueueReadBuffer(env->queue, b, CL_TRUE, 0, bytes, y, 0, NULL, NULL) == CL_SUCCESS &&
             memcmp(x, y, bytes) == 0;
  free(x);
  free(y);
  return same;
}

/* What the faked context describes for one operation: on the first call (which tries the vendor kernel) and
   on the next. */
static void check_operation(fcl_context *faked, fcl_operation op, const fcl_attention_desc *desc,
                            const char *name) {
  fcl_plan_info info;
  fcl_describe_plan(NULL, op, desc, &info); /* a failure whose message must survive what follows */
  char before[256];
  snprintf(before, sizeof before, "%s", fcl_last_error());

  const uint64_t builds0 = source_builds(faked);
  fcl_status st = fcl_describe_plan(faked, op, desc, &info);
  check(st == FCL_SUCCESS && strcmp(info.kernel, "portable") == 0 && strstr(info.reason, "failed to build") &&
            strstr(info.reason, "portable only") == NULL,
        "%s: a tensor-core kernel that does not build falls back to the portable one: %s %s, \"%s\"", name,
        fcl_status_string(st), info.kernel, info.reason);
  check(fcl_last_error()[0] == '\0' || strcmp(fcl_last_error(), before) == 0,
        "%s: the failed build's log is not left as the last error: \"%.120s\"", name, fcl_last_error());

  fcl_describe_plan(NULL, op, desc, &info);
  const uint64_t builds1 = source_builds(faked);
  st = fcl_describe_plan(faked, op, desc, &info);
  check(st == FCL_SUCCESS && strcmp(info.kernel, "portable") == 0 && strstr(info.reason, "failed to build earlier"),
        "%s: the failure is remembered: %s %s, \"%s\"", name, fcl_status_string(st), info.kernel, info.reason);
  check(source_builds(faked) == builds1 && builds1 > builds0,
        "%s: the second call builds nothing (%llu programs built by the first, %llu by the second)", name,
        (unsigned long long)(builds1 - builds0), (unsigned long long)(source_builds(faked) - builds1));
  check(strcmp(fcl_last_error(), before) == 0, "%s: passing over the remembered failure keeps the last error: \"%s\"",
        name, fcl_last_error());
}

/* Work-items a kernel of 128 required work-items admits on env's device (CL_KERNEL_WORK_GROUP_SIZE; llvmpipe's
   kernels admit 32), 0 where it does not build. */
static size_t kernel_admits(test_env *env) {
  const char *src = "__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void k(__global int *x) {}\n";
  cl_int err;
  size_t wg = 0;
  cl_program prog = clCreateProgramWithSource(env->context, 1, &src, NULL, &err);
  if (prog && clBuildProgram(prog, 1, &env->device, "", NULL, NULL) == CL_SUCCESS) {
    cl_kernel k = clCreateKernel(prog, "k", &err);
    if (k && clGetKernelWorkGroupInfo(k, env->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS)
      wg = 0;
    if (k) clReleaseKernel(k);
  }
  if (prog) clReleaseProgram(prog);
  return wg;
}

/* The driver that keeps kernels to the local memory it reports (above): B=4, H=16, N=4096, f16 (512 blocks of 128
   rows: not a small grid), head_dim 128, whose default tiles do not build there: the forward's 68 KiB, the
   backward's dK/dV kernel's 103 KiB (K and V resident). Each operation in a context of its own. */
static void local_limited_case(test_env *env) {
  const size_t admits = kernel_admits(env);
  if (admits < 128) {
    skip("a driver that keeps kernels to the local memory it reports: this device's kernels admit %zu work-items, "
         "fewer than the tensor-core kernels' 128", admits);
    return;
  }
  char dir[] = "/tmp/flashcl-local-XXXXXX";
  if (!mkdtemp(dir) || write_sources(dir, 1)) {
    check(0, "writing the local-limited kernel sources to a temporary directory");
    return;
  }
  setenv("FLASHCL_KERNEL_DIR", dir, 1);
  for (int op = FCL_OP_FORWARD; op <= FCL_OP_BACKWARD; ++op) {
    const char *name = op == FCL_OP_FORWARD ? "forward" : "backward";
    fcl_context *ctx = NULL;
    fcl_context_options opts = {"", "", 0};
    fcl_status st = fcl_context_create(env->context, env->device, &opts, &ctx);
    check(st == FCL_SUCCESS, "a context with the local-limited tensor-core sources: %s", fcl_status_string(st));
    if (st != FCL_SUCCESS) continue;
    ctx->caps.vendor = FCL_VENDOR_NVIDIA;
    ctx->caps.nv_cc_major = 9, ctx->caps.nv_cc_minor = 0;
    ctx->caps.local_mem_size = 48 << 10;
    ctx->caps.nv_static_local = fcl_nvidia_block_local(9, 0);
    ctx->caps.compute_units = 132;
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 4, desc.num_heads = 16, desc.seqlen_q = desc.seqlen_k = 4096, desc.head_dim = 128;
    desc.dtype = FCL_DTYPE_F16;
    fcl_plan_info info;
    fcl_clear_error();
    st = fcl_describe_plan(ctx, (fcl_operation)op, &desc, &info);
    /* The forward's plan within 48 KiB has 32-key tiles; the backward's dK/dV kernel 32-row steps (its reason). */
    const int within = op == FCL_OP_FORWARD ? info.block_k == 32 : strstr(info.reason, "32 query rows a step") != NULL;
    check(st == FCL_SUCCESS && strcmp(info.kernel, "nvidia_mma") == 0 && within &&
              info.local_mem_bytes + 16 <= (48 << 10) && ctx->caps.nv_static_local == 0 && fcl_last_error()[0] == '\0',
          "%s at head_dim 128 whose default tiles do not build within the reported 48 KiB: the tensor-core kernels "
          "within it (%s %s, %zu B local; last error \"%.80s\"; %.150s)",
          name, fcl_status_string(st), info.kernel, info.local_mem_bytes, fcl_last_error(), info.reason);
    const uint64_t builds = source_builds(ctx);
    st = fcl_describe_plan(ctx, (fcl_operation)op, &desc, &info);
    check(st == FCL_SUCCESS && strcmp(info.kernel, "nvidia_mma") == 0 && info.local_mem_bytes + 16 <= (48 << 10) &&
              source_builds(ctx) == builds,
          "%s: the next call plans within 48 KiB at once and builds nothing (%s %s, %zu B local)", name,
          fcl_status_string(st), info.kernel, info.local_mem_bytes);
    fcl_context_release(ctx);
  }
  unsetenv("FLASHCL_KERNEL_DIR");
  remove_sources(dir);
}

int main(void) {
  test_seed();
  test_env env;
  if (test_open(&env, NULL)) return 1;

  char dir[] = "/tmp/flashcl-fallback-XXXXXX";
  if (!mkdtemp(dir) || write_sources(dir, 0)) {
    check(0, "writing the kernel sources to a temporary directory");
    return test_summary("test_fallback");
  }
  /* Sources are read when a kernel is built, so the folder stays in force until the end; its portable sources
     are the embedded ones. The plain context is portable-only, so that it never tries the vendor variant on a
     device where the real one would apply. */
  setenv("FLASHCL_KERNEL_DIR", dir, 1);
  fcl_context *faked = NULL, *plain = NULL;
  fcl_context_options opts = {"", "", 0}; /* no disk cache: the broken sources must be built, not loaded */
  const fcl_context_options plain_opts = {"", "", FCL_FLAG_PORTABLE_ONLY};
  fcl_status st = fcl_context_create(env.context, env.device, &opts, &faked);
  if (st == FCL_SUCCESS) st = fcl_context_create(env.context, env.device, &plain_opts, &plain);
  check(st == FCL_SUCCESS, "contexts with the broken tensor-core sources: %s", fcl_status_string(st));
  if (st) {
    fcl_context_release(faked);
    unsetenv("FLASHCL_KERNEL_DIR");
    remove_sources(dir);
    return test_summary("test_fallback");
  }
  faked->caps.vendor = FCL_VENDOR_NVIDIA;
  faked->caps.nv_cc_major = 9, faked->caps.nv_cc_minor = 0;

  const long long B = 1, H = 2, N = 70, D = 64;
  test_tensor q, k, v, o1, o2, dout, dq1, dk1, dv1, dq2, dk2, dv2;
  test_tensor *all[12] = {&q, &k, &v, &o1, &o2, &dout, &dq1, &dk1, &dv1, &dq2, &dk2, &dv2};
  for (int i = 0; i < 12; ++i) memset(all[i], 0, sizeof *all[i]);
  int bad = tensor_create(&env, &q, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 1) ||
            tensor_create(&env, &k, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 1) ||
            tensor_create(&env, &v, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 1) ||
            tensor_create(&env, &dout, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 1) ||
            tensor_create(&env, &o1, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 0) ||
            tensor_create(&env, &o2, B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 0);
  test_tensor *grads[6] = {&dq1, &dk1, &dv1, &dq2, &dk2, &dv2};
  for (int i = 0; i < 6 && !bad; ++i) bad = tensor_create(&env, grads[i], B, H, N, D, LAYOUT_BHND, FCL_DTYPE_F16, 0);
  cl_mem lse1 = create_float_buffer(&env, (size_t)(B * H * N), NAN), lse2 = create_float_buffer(&env, (size_t)(B * H * N), NAN);
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = B, desc.num_heads = H, desc.num_kv_heads = H, desc.seqlen_q = N, desc.seqlen_k = N, desc.head_dim = D;
  desc.dtype = FCL_DTYPE_F16, desc.causal = 1;
  tensor_to_desc(&q, desc.q_stride, &desc.q_offset);
  tensor_to_desc(&k, desc.k_stride, &desc.k_offset);
  tensor_to_desc(&v, desc.v_stride, &desc.v_offset);
  tensor_to_desc(&o1, desc.o_stride, &desc.o_offset);
  if (bad || !lse1 || !lse2) {
    check(0, "creating the tensors");
  } else {
    check_operation(faked, FCL_OP_FORWARD, &desc, "forward");
    check_operation(faked, FCL_OP_BACKWARD, &desc, "backward");

    /* The portable kernels run, and give what a context that never tried the tensor-core ones gives. */
    st = fcl_attention_forward(faked, env.queue, &desc, q.buf, k.buf, v.buf, o1.buf, lse1, 0, NULL, NULL);
    fcl_status st2 = fcl_attention_forward(plain, env.queue, &desc, q.buf, k.buf, v.buf, o2.buf, lse2, 0, NULL, NULL);
    clFinish(env.queue);
    check(st == FCL_SUCCESS && st2 == FCL_SUCCESS && same_bits(&env, o1.buf, o2.buf, o1.elems * 2) &&
              same_bits(&env, lse1, lse2, (size_t)(B * H * N) * sizeof(float)),
          "forward after the fallback: bitwise the plain context's O and lse (%s, %s)", fcl_status_string(st),
          fcl_status_string(st2));
    size_t ws = fcl_attention_backward_workspace_size(plain, &desc);
    cl_int err;
    cl_mem work = clCreateBuffer(env.context, CL_MEM_READ_WRITE, ws ? ws : 4, NULL, &err);
    st = fcl_attention_backward(faked, env.queue, &desc, q.buf, k.buf, v.buf, o2.buf, lse2, dout.buf, dq1.buf, dk1.buf,
                                dv1.buf, work, 0, NULL, NULL);
    st2 = fcl_attention_backward(plain, env.queue, &desc, q.buf, k.buf, v.buf, o2.buf, lse2, dout.buf, dq2.buf,
                                 dk2.buf, dv2.buf, work, 0, NULL, NULL);
    clFinish(env.queue);
    check(st == FCL_SUCCESS && st2 == FCL_SUCCESS && same_bits(&env, dq1.buf, dq2.buf, dq1.elems * 2) &&
              same_bits(&env, dk1.buf, dk2.buf, dk1.elems * 2) && same_bits(&env, dv1.buf, dv2.buf, dv1.elems * 2),
          "backward after the fallback: bitwise the plain context's dQ, dK, dV (%s, %s: %s)", fcl_status_string(st),
          fcl_status_string(st2), fcl_last_error());
    if (work) clReleaseMemObject(work);
  }
  for (int i = 0; i < 12; ++i) tensor_release(all[i]);
  if (lse1) clReleaseMemObject(lse1);
  if (lse2) clReleaseMemObject(lse2);
  fcl_context_release(faked);
  fcl_context_release(plain);
  unsetenv("FLASHCL_KERNEL_DIR");
  remove_sources(dir);
  local_limited_case(&env);
  const int rc = test_summary("test_fallback");
  test_close(&env);
  return rc;
}
