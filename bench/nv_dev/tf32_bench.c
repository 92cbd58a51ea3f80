/* Development harness of the 3xTF32 forward prototype (bench/nv_dev/tf32_fwd.cl; docs/notes-portable.md v9),
 * not part of the library. On the first GPU it finds:
 *   tf32_bench verbose   registers and spills of each shape (-cl-nv-verbose)
 *   tf32_bench check     every shape at awkward sizes against a float64 host reference, beside the library's
 *                        f32 forward (its float-FMA kernel) on the same inputs: max |error| of O and lse
 *   tf32_bench bench     B=4, H=16, N=4096, d 64 and 128, causal and not: median ms of 10 event-timed runs
 *                        after 2 warm-ups, TFLOP/s, and the library's f32 forward on the same problem
 * Build (repository root, after building the library into BUILD): gcc -O2 -std=c11 -Iinclude
 * bench/nv_dev/tf32_bench.c BUILD/libflashcl.a -lOpenCL -lpthread -lm -o tf32_bench */
#include "flashcl.h"
#include "dev_util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static cl_device_id dev;
static cl_context cctx;
static cl_command_queue queue;
static fcl_context *fctx;
static char *src_ptx, *src_kernel;

/* One kernel shape: warps, key tile, head_dim, causal, 3xTF32 or 1xTF32. */
typedef struct shape {
  int nw, bc, d, causal, split3;
} shape;

static const char *name(shape s) {
  static char buf[64];
  snprintf(buf, sizeof buf, "%d,%d,%d,%d,%d", s.nw, s.bc, s.d, s.causal, s.split3);
  return buf;
}

static cl_kernel build(shape s, int verbose) {
  const char *srcs[2] = {src_ptx, src_kernel};
  cl_int err;
  cl_program p = clCreateProgramWithSource(cctx, 2, srcs, NULL, &err);
  CK(err);
  char opts[256];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDTYPE=1 -DD=%d -DNW=%d -DBC=%d -DCAUSAL=%d -DSPLIT3=%d%s", s.d, s.nw,
           s.bc, s.causal, s.split3, verbose ? " -cl-nv-verbose" : "");
  err = clBuildProgram(p, 1, &dev, opts, NULL, NULL);
  char *log = dev_build_log(p, dev);
  if (err != CL_SUCCESS) {
    printf("[%s] build failed (%d):\n%s\n", opts, err, log);
    exit(1);
  }
  if (verbose) {
    printf("%s\n", opts);
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
      if (strstr(line, "registers") || strstr(line, "spill")) printf("   %s\n", line);
  }
  free(log);
  cl_kernel kn = clCreateKernel(p, "tf32_fwd", &err);
  CK(err);
  clReleaseProgram(p);
  return kn;
}

static double lcg_state = 1;
static float urand(void) { /* uniform in [-1, 1), reproducible */
  lcg_state = fmod(lcg_state * 48271.0, 2147483647.0);
  return (float)(lcg_state / 2147483647.0 * 2.0 - 1.0);
}

static cl_mem upload(const float *x, size_t n) {
  cl_int err;
  cl_mem m = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 4, (void *)x, &err);
  CK(err);
  return m;
}

static cl_mem device_buffer(size_t n) {
  cl_int err;
  cl_mem m = clCreateBuffer(cctx, CL_MEM_READ_WRITE, n * 4, NULL, &err);
  CK(err);
  return m;
}

static void poison(cl_mem m, size_t n) {
  const float nan = NAN;
  CK(clEnqueueFillBuffer(queue, m, &nan, 4, 0, n * 4, 0, NULL, NULL));
}

/* Enqueues the prototype on [bh][n][d] buffers; *ev (optional) times it. */
static void run_tf32(cl_kernel kn, shape s, int bh, int n, cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse,
                     cl_event *ev) {
  const float scale = 1.0f / sqrtf((float)s.d);
  CK(clSetKernelArg(kn, 0, sizeof q, &q));
  CK(clSetKernelArg(kn, 1, sizeof k, &k));
  CK(clSetKernelArg(kn, 2, sizeof v, &v));
  CK(clSetKernelArg(kn, 3, sizeof o, &o));
  CK(clSetKernelArg(kn, 4, sizeof lse, &lse));
  CK(clSetKernelArg(kn, 5, sizeof n, &n));
  CK(clSetKernelArg(kn, 6, sizeof scale, &scale));
  const int br = s.nw * 16;
  size_t local = (size_t)s.nw * 32, global[2] = {(size_t)((n + br - 1) / br) * local, (size_t)bh};
  size_t lws[2] = {local, 1};
  CK(clEnqueueNDRangeKernel(queue, kn, 2, NULL, global, lws, 0, NULL, ev));
}

static fcl_attention_desc lib_desc(int b, int h, int n, int d, int causal) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = b, desc.num_heads = h, desc.seqlen_q = n, desc.seqlen_k = n, desc.head_dim = d;
  desc.dtype = FCL_DTYPE_F32, desc.causal = causal;
  return desc;
}

static void run_lib(int b, int h, int n, int d, int causal, cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse,
                    cl_event *ev) {
  fcl_attention_desc desc = lib_desc(b, h, n, d, causal);
  if (fcl_attention_forward(fctx, queue, &desc, q, k, v, o, lse, 0, NULL, ev) != FCL_SUCCESS) {
    fprintf(stderr, "library forward: %s\n", fcl_last_error());
    exit(1);
  }
}

/* Max |error| of o (and lse) against the float64 reference over every row. */
static void errors(const float *q, const float *k, const float *v, const float *o, const float *lse, int bh, int n,
                   int d, int causal, double *eo, double *el) {
  const double scale = 1.0 / sqrt((double)d);
  double *sc = malloc(sizeof(double) * (size_t)n), *acc = malloc(sizeof(double) * (size_t)d);
  *eo = *el = 0;
  for (int x = 0; x < bh; ++x)
    for (int i = 0; i < n; ++i) {
      const float *qi = q + ((size_t)x * n + i) * d;
      const int nk = causal ? i + 1 : n;
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < nk; ++j) {
        const float *kj = k + ((size_t)x * n + j) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += (double)qi[c] * kj[c];
        sc[j] = dot * scale;
        if (sc[j] > mx) mx = sc[j];
      }
      for (int c = 0; c < d; ++c) acc[c] = 0;
      for (int j = 0; j < nk; ++j) {
        const double p = exp(sc[j] - mx);
        sum += p;
        const float *vj = v + ((size_t)x * n + j) * d;
        for (int c = 0; c < d; ++c) acc[c] += p * vj[c];
      }
      for (int c = 0; c < d; ++c) {
        const double e = fabs(o[((size_t)x * n + i) * d + c] - acc[c] / sum);
        if (!(e <= *eo)) *eo = e; /* NaN propagates */
      }
      const double e = fabs(lse[(size_t)x * n + i] - (mx + log(sum)));
      if (!(e <= *el)) *el = e;
    }
  free(sc);
  free(acc);
}

static const shape shapes[] = {
    {4, 64, 64, 0, 1}, {4, 64, 64, 1, 1}, {4, 32, 64, 0, 1}, {2, 32, 128, 0, 1},
    {2, 32, 128, 1, 1}, {4, 32, 128, 0, 1}, {4, 64, 64, 0, 0}, {2, 32, 128, 0, 0},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static void check(void) {
  const int bh = 3, sizes[] = {1000, 77, 16};
  printf("%-26s %6s %12s %12s %12s %12s\n", "shape (nw,bc,d,causal,x3)", "N", "tf32 |dO|", "tf32 |dlse|",
         "float |dO|", "float |dlse|");
  for (size_t si = 0; si < NSHAPES; ++si) {
    const shape s = shapes[si];
    cl_kernel kn = build(s, 0);
    for (size_t ni = 0; ni < sizeof sizes / sizeof sizes[0]; ++ni) {
      const int n = sizes[ni];
      const size_t elems = (size_t)bh * n * s.d;
      float *hq = malloc(elems * 4), *hk = malloc(elems * 4), *hv = malloc(elems * 4), *ho = malloc(elems * 4);
      float *hl = malloc((size_t)bh * n * 4);
      for (size_t i = 0; i < elems; ++i) hq[i] = 2.0f * urand(), hk[i] = 2.0f * urand(), hv[i] = urand();
      cl_mem q = upload(hq, elems), k = upload(hk, elems), v = upload(hv, elems), o = device_buffer(elems);
      cl_mem lse = device_buffer((size_t)bh * n);
      double e[4];
      poison(o, elems), poison(lse, (size_t)bh * n);
      run_tf32(kn, s, bh, n, q, k, v, o, lse, NULL);
      CK(clEnqueueReadBuffer(queue, o, CL_TRUE, 0, elems * 4, ho, 0, NULL, NULL));
      CK(clEnqueueReadBuffer(queue, lse, CL_TRUE, 0, (size_t)bh * n * 4, hl, 0, NULL, NULL));
      errors(hq, hk, hv, ho, hl, bh, n, s.d, s.causal, &e[0], &e[1]);
      poison(o, elems), poison(lse, (size_t)bh * n);
      run_lib(1, bh, n, s.d, s.causal, q, k, v, o, lse, NULL);
      CK(clEnqueueReadBuffer(queue, o, CL_TRUE, 0, elems * 4, ho, 0, NULL, NULL));
      CK(clEnqueueReadBuffer(queue, lse, CL_TRUE, 0, (size_t)bh * n * 4, hl, 0, NULL, NULL));
      errors(hq, hk, hv, ho, hl, bh, n, s.d, s.causal, &e[2], &e[3]);
      printf("%-26s %6d %12.3e %12.3e %12.3e %12.3e\n", name(s), n, e[0], e[1], e[2], e[3]);
      clReleaseMemObject(q), clReleaseMemObject(k), clReleaseMemObject(v), clReleaseMemObject(o);
      clReleaseMemObject(lse);
      free(hq), free(hk), free(hv), free(ho), free(hl);
    }
    clReleaseKernel(kn);
  }
}

static double event_ms(cl_event ev) {
  cl_ulong a = 0, b = 0;
  CK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL));
  CK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL));
  clReleaseEvent(ev);
  return (double)(b - a) * 1e-6;
}

static void bench(void) {
  const int b = 4, h = 16, n = 4096, iters = 10, warm = 2;
  printf("%-26s %10s %10s %12s %12s\n", "shape (nw,bc,d,causal,x3)", "tf32 ms", "TFLOP/s", "library ms", "TFLOP/s");
  for (size_t si = 0; si < NSHAPES; ++si) {
    const shape s = shapes[si];
    cl_kernel kn = build(s, 0);
    const size_t elems = (size_t)b * h * n * s.d;
    float *hx = malloc(elems * 4);
    cl_mem m[4];
    for (int x = 0; x < 4; ++x) {
      for (size_t i = 0; i < elems; ++i) hx[i] = urand();
      m[x] = upload(hx, elems);
    }
    cl_mem q = m[0], k = m[1], v = m[2], o = m[3], lse = device_buffer((size_t)b * h * n);
    double t[2][16];
    for (int r = 0; r < warm + iters; ++r) {
      cl_event e0, e1;
      run_tf32(kn, s, b * h, n, q, k, v, o, lse, &e0);
      run_lib(b, h, n, s.d, s.causal, q, k, v, o, lse, &e1);
      CK(clFinish(queue));
      const double a = event_ms(e0), c = event_ms(e1);
      if (r >= warm) t[0][r - warm] = a, t[1][r - warm] = c;
    }
    qsort(t[0], iters, sizeof(double), dev_cmp_double);
    qsort(t[1], iters, sizeof(double), dev_cmp_double);
    const double flop = 4.0 * b * h * (double)n * n * s.d * (s.causal ? 0.5 : 1.0);
    const double m0 = (t[0][iters / 2 - 1] + t[0][iters / 2]) / 2, m1 = (t[1][iters / 2 - 1] + t[1][iters / 2]) / 2;
    printf("%-26s %10.3f %10.1f %12.3f %12.1f\n", name(s), m0, flop / m0 * 1e-9, m1, flop / m1 * 1e-9);
    clReleaseMemObject(q), clReleaseMemObject(k), clReleaseMemObject(v), clReleaseMemObject(o);
    clReleaseMemObject(lse);
    free(hx);
    clReleaseKernel(kn);
  }
}

int main(int argc, char **argv) {
  dev = dev_first_gpu();
  if (!dev) {
    fprintf(stderr, "no GPU\n");
    return 1;
  }
  dev_open(dev, &cctx, &queue, &fctx);
  src_ptx = dev_slurp("cl/nvidia/ptx.cl");
  src_kernel = dev_slurp("bench/nv_dev/tf32_fwd.cl");
  if (!src_ptx || !src_kernel) return 1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "verbose"))
      for (size_t si = 0; si < NSHAPES; ++si) clReleaseKernel(build(shapes[si], 1));
    else if (!strcmp(argv[i], "check")) check();
    else if (!strcmp(argv[i], "bench")) bench();
    else {
      fprintf(stderr, "unknown step %s (verbose, check, bench)\n", argv[i]);
      return 2;
    }
  }
  fcl_context_release(fctx);
  clReleaseCommandQueue(queue);
  clReleaseContext(cctx);
  return 0;
}
