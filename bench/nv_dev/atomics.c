/* How long the atomic adds of an accumulated dQ take on their own (docs/notes-nvidia.md, v12: whether
 * FlashAttention-2's dQ-by-atomics scheme can pay at the key blocks 48 KiB allows). Times bench/nv_dev/atomics.cl
 * at f32 dQ of B*H heads, seqlen N, head_dim 128, for key blocks of 16, 32, 64 and 128 keys (flashcl's dK/dV
 * warp, its work-group, a four-warp work-group, FlashAttention-2's), one float or four an instruction, or one
 * 64-bit integer (a fixed-point dQ whose sum does not depend on the order of the adds: the deterministic form
 * of the scheme, docs/notes-nvidia.md v38); OpenCL events, median of 5 after one warm-up, and a check that every
 * add landed. Not part of the library.
 * Build (GPU machine, repository root):  gcc -O2 -Iinclude bench/nv_dev/atomics.c -lOpenCL -o atomics
 * Run:  ./atomics [N [heads]]   (defaults 4096 and 64, B=4 x H=16) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_util.h"

int main(int argc, char **argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 4096, heads = argc > 2 ? atoi(argv[2]) : 64, d = 128;
  if (n <= 0 || n % 128 != 0 || heads <= 0) {
    fprintf(stderr, "N must be a positive multiple of 128 (every key block and step whole), heads positive\n");
    return 2;
  }
  cl_device_id dev = dev_first_gpu();
  char *src = dev_slurp("bench/nv_dev/atomics.cl");
  if (!dev || !src) {
    fprintf(stderr, "%s\n", dev ? "run from the repository root (bench/nv_dev/atomics.cl)" : "no OpenCL GPU");
    return 1;
  }
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  const size_t elems = (size_t)heads * n * d;
  cl_mem dq = clCreateBuffer(ctx, CL_MEM_READ_WRITE, elems * sizeof(cl_ulong), NULL, &err);
  cl_ulong *host = malloc(elems * sizeof(cl_ulong));
  if (err != CL_SUCCESS || !host) {
    fprintf(stderr, "buffer of %zu elements: %d\n", elems, err);
    return 1;
  }
  /* keys a work-group, query rows a step, work-items: flashcl's dK/dV warp (16 keys, 16 rows), its
     work-group after adding its two warps' parts in local memory (32, 16), the four-warp work-group that K
     and V over the second step buffer allow at d = 128 (64, 16; v16), FlashAttention-2's (128, 64). */
  static const int cfg[][3] = {{16, 16, 32}, {32, 16, 64}, {64, 16, 128}, {128, 64, 256}};
  printf("N=%d heads=%d d=%d: ms (median of 5), G red instructions/s, instructions, every add landed\n", n, heads, d);
  static const int vecs[] = {1, 4, 0}; /* float, float4, 64-bit integer (shown as vec 0) */
  for (size_t vi = 0; vi < sizeof vecs / sizeof vecs[0]; ++vi)
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; ++c) {
      const int vec = vecs[vi], width = vec == 0 ? 8 : 4, per = vec == 0 ? 1 : vec;
      const int keys = cfg[c][0], rows = cfg[c][1], wg = cfg[c][2];
      char opts[128];
      snprintf(opts, sizeof opts, "-DD=%d -DROWS=%d -DVEC=%d", d, rows, vec);
      cl_program p = clCreateProgramWithSource(ctx, 1, (const char **)&src, NULL, &err);
      if (clBuildProgram(p, 1, &dev, opts, NULL, NULL) != CL_SUCCESS) {
        char log[4096] = "";
        clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("keys %3d rows %2d vec %d: build failed: %.300s\n", keys, rows, vec, log);
        clReleaseProgram(p);
        continue;
      }
      cl_kernel k = clCreateKernel(p, "dq_atomics", &err);
      clSetKernelArg(k, 0, sizeof dq, &dq);
      clSetKernelArg(k, 1, sizeof n, &n);
      const size_t global[2] = {(size_t)(n / keys) * wg, (size_t)heads}, local[2] = {(size_t)wg, 1};
      double t[6];
      int landed = 1;
      for (int it = 0; it < 6; ++it) {
        const cl_ulong zero = 0;
        clEnqueueFillBuffer(q, dq, &zero, sizeof zero, 0, elems * sizeof zero, 0, NULL, NULL);
        cl_event e;
        if ((err = clEnqueueNDRangeKernel(q, k, 2, NULL, global, local, 0, NULL, &e)) != CL_SUCCESS) break;
        clWaitForEvents(1, &e);
        t[it] = dev_event_ms(e);
        clReleaseEvent(e);
        if (it == 5) {
          clEnqueueReadBuffer(q, dq, CL_TRUE, 0, elems * width, host, 0, NULL, NULL);
          const float want = (float)(n / keys) / 1024.0f;
          const cl_ulong want_int = (cl_ulong)(n / keys) << 30;
          const float *f = (const float *)host;
          for (size_t i = 0; i < elems && landed; ++i) landed = vec == 0 ? host[i] == want_int : f[i] == want;
        }
      }
      if (err != CL_SUCCESS) {
        printf("keys %3d rows %2d vec %d: launch failed (%d)\n", keys, rows, vec, err);
        clReleaseKernel(k);
        clReleaseProgram(p);
        continue;
      }
      qsort(t + 1, 5, sizeof t[0], dev_cmp_double);
      const double adds = (double)heads * (n / keys) * n * d / per;
      printf("keys %3d rows %2d vec %d: %8.3f ms %7.1f G/s %.3g adds %s\n", keys, rows, vec, t[3], adds / t[3] * 1e-6,
             adds, landed ? "yes" : "NO");
      clReleaseKernel(k);
      clReleaseProgram(p);
    }
  free(host);
  return 0;
}
