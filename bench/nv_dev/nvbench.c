/* Development harness of the NVIDIA tensor-core forward, not part of the library (bench/nv_dev/run.sh
 * builds it): register report, shape sweep and timing on an NVIDIA device. Usage:
 *   nvbench verbose                  build log (-cl-nv-verbose) of each config
 *   nvbench bench [rows...]          library forward, all 24 rows (or "dtype:d:n:causal" rows)
 *   nvbench sweep                    configs NW:MT:BC at N=4096 against the library's output */
#include "internal.h"
#include "dev_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cl_device_id dev;
static cl_context cctx;
static cl_command_queue queue;
static fcl_context *fctx;

static void open_dev(void) {
  cl_platform_id plats[8];
  cl_uint np = 0;
  CK(clGetPlatformIDs(8, plats, &np));
  for (cl_uint i = 0; i < np && !dev; ++i) {
    cl_device_id ds[8];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 8, ds, &nd) != CL_SUCCESS) continue;
    for (cl_uint j = 0; j < nd; ++j) {
      char name[256];
      clGetDeviceInfo(ds[j], CL_DEVICE_NAME, sizeof name, name, NULL);
      if (strstr(name, "H200")) {
        dev = ds[j];
        break;
      }
    }
  }
  if (!dev) {
    fprintf(stderr, "no H200\n");
    exit(1);
  }
  dev_open(dev, &cctx, &queue, &fctx);
}

/* A source file of the tree, or exit. */
static char *readf(const char *path) {
  char *s = dev_slurp(path);
  if (!s) exit(1);
  return s;
}

static cl_program build_raw(const char *defines, int verbose) {
  char *a = readf("cl/common.cl"), *b = readf("cl/nvidia/flash_fwd_mma.cl");
  const char *srcs[2] = {a, b};
  cl_int err;
  cl_program p = clCreateProgramWithSource(cctx, 2, srcs, NULL, &err);
  CK(err);
  char opts[512];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 %s %s", defines, verbose == 1 ? "-cl-nv-verbose" : "");
  err = clBuildProgram(p, 1, &dev, opts, NULL, NULL);
  char *log = dev_build_log(p, dev);
  if (err != CL_SUCCESS || verbose == 1) printf("[%s] build %d:\n%s\n", defines, err, log);
  if (err == CL_SUCCESS && verbose == 2) {
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
      if (strstr(line, "registers") || strstr(line, "spill")) printf("   # %s\n", line);
  }
  free(log);
  free(a);
  free(b);
  if (err != CL_SUCCESS) return NULL;
  return p;
}

typedef struct cfg {
  int nw, mt, bc;
} cfg;

static void defines_for(int dtype, int d, cfg c, char *out, size_t n) {
  int dp = (d + 15) / 16 * 16;
  snprintf(out, n, "-DDTYPE=%d -DD=%d -DDP=%d -DDS=%d -DNW=%d -DMT=%d -DBC=%d", dtype, d, dp, dp + 8, c.nw, c.mt, c.bc);
}

/* Buffers sized for the largest row, filled with random values of the dtype. */
static cl_mem bq, bk, bv, bo, bo2, blse;
static size_t cap_elems;
static int filled_dtype = -1;

static unsigned short enc(float x, int dtype) {
  unsigned u;
  memcpy(&u, &x, 4);
  if (dtype == 2) return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  /* f16 from float, values in [-1,1) */
  unsigned sign = (u >> 16) & 0x8000;
  int ex = (int)((u >> 23) & 0xff) - 127 + 15;
  unsigned man = u & 0x7fffff;
  if (ex <= 0) return (unsigned short)sign;
  return (unsigned short)(sign | (ex << 10) | (man >> 13));
}

static void fill(int dtype, size_t elems) {
  if (filled_dtype == dtype && elems <= cap_elems) return;
  if (elems > cap_elems) {
    if (bq) {
      clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bo);
      clReleaseMemObject(bo2), clReleaseMemObject(blse);
    }
    cl_int err;
    bq = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems * 2, NULL, &err);
    CK(err);
    bk = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems * 2, NULL, &err);
    CK(err);
    bv = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems * 2, NULL, &err);
    CK(err);
    bo = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems * 2, NULL, &err);
    CK(err);
    bo2 = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems * 2, NULL, &err);
    CK(err);
    blse = clCreateBuffer(cctx, CL_MEM_READ_WRITE, elems / 16 * 4 + 4096, NULL, &err);
    CK(err);
    cap_elems = elems;
  }
  unsigned short *h = malloc(cap_elems * 2);
  unsigned long long s = 88172645463325252ull;
  cl_mem bufs[3] = {bq, bk, bv};
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < cap_elems; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      float x = (float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
      h[i] = enc(x, dtype);
    }
    CK(clEnqueueWriteBuffer(queue, bufs[t], CL_TRUE, 0, cap_elems * 2, h, 0, NULL, NULL));
  }
  free(h);
  filled_dtype = dtype;
}

static fcl_attention_desc make_desc(int dtype, int d, int n, int causal) {
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = 4;
  desc.num_heads = 16;
  desc.seqlen_q = desc.seqlen_k = n;
  desc.head_dim = d;
  desc.dtype = (fcl_dtype)dtype;
  desc.causal = causal;
  return desc;
}

static double flops(int d, int n, int causal) {
  double f = 4.0 * 4 * 16 * (double)n * n * d;
  return causal ? f / 2 : f;
}

/* Times the library forward (kernel==NULL) or a raw kernel with the library's argument list. */
static double time_it(const fcl_attention_desc *desc, cl_kernel kernel, int br, int wg, cl_mem out, int iters) {
  double t[64];
  for (int i = 0; i < iters + 3; ++i) {
    cl_event e;
    if (!kernel) {
      fcl_status st = fcl_attention_forward(fctx, queue, desc, bq, bk, bv, out, blse, 0, NULL, &e);
      if (st) {
        fprintf(stderr, "forward: %s\n", fcl_last_error());
        exit(1);
      }
    } else {
      fcl_problem p;
      if (fcl_resolve_problem(desc, &p)) exit(1);
      cl_uint a = 0;
      cl_mem bufs[5] = {bq, bk, bv, out, blse};
      for (int j = 0; j < 5; ++j) CK(clSetKernelArg(kernel, a++, sizeof(cl_mem), &bufs[j]));
      const int64_t *strides[4] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride};
      const int64_t offs[4] = {p.q_offset, p.k_offset, p.v_offset, p.o_offset};
      for (int j = 0; j < 4; ++j) {
        cl_long vals[4] = {offs[j], strides[j][0], strides[j][1], strides[j][2]};
        for (int m = 0; m < 4; ++m) CK(clSetKernelArg(kernel, a++, sizeof(cl_long), &vals[m]));
      }
      cl_int ints[5] = {(cl_int)p.heads, (cl_int)p.group, (cl_int)p.nq, (cl_int)p.nk, p.causal};
      for (int j = 0; j < 5; ++j) CK(clSetKernelArg(kernel, a++, sizeof(cl_int), &ints[j]));
      CK(clSetKernelArg(kernel, a++, sizeof(cl_float), &p.scale));
      size_t blocks = (p.nq + br - 1) / br;
      size_t global[3] = {blocks * wg, (size_t)p.heads, (size_t)p.batch}, local[3] = {(size_t)wg, 1, 1};
      CK(clEnqueueNDRangeKernel(queue, kernel, 3, NULL, global, local, 0, NULL, &e));
    }
    CK(clWaitForEvents(1, &e));
    if (i >= 3) t[i - 3] = dev_event_ms(e);
    clReleaseEvent(e);
  }
  qsort(t, iters, sizeof t[0], dev_cmp_double);
  return t[iters / 2];
}

static double max_diff(int dtype, size_t elems) {
  unsigned short *a = malloc(elems * 2), *b = malloc(elems * 2);
  CK(clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, elems * 2, a, 0, NULL, NULL));
  CK(clEnqueueReadBuffer(queue, bo2, CL_TRUE, 0, elems * 2, b, 0, NULL, NULL));
  double m = 0;
  for (size_t i = 0; i < elems; ++i) {
    float x, y;
    unsigned ux, uy;
    if (dtype == 2) {
      ux = (unsigned)a[i] << 16, uy = (unsigned)b[i] << 16;
    } else {
      /* f16 -> f32 for normal numbers (outputs are |x| < 1, denormals flushed is fine here) */
      unsigned ha = a[i], hb = b[i];
      ux = ((ha & 0x8000) << 16) | ((ha & 0x7c00) ? ((((ha >> 10) & 0x1f) - 15 + 127) << 23) | ((ha & 0x3ff) << 13) : 0);
      uy = ((hb & 0x8000) << 16) | ((hb & 0x7c00) ? ((((hb >> 10) & 0x1f) - 15 + 127) << 23) | ((hb & 0x3ff) << 13) : 0);
      if ((ha & 0x7c00) == 0x7c00 || (hb & 0x7c00) == 0x7c00) return INFINITY;
    }
    memcpy(&x, &ux, 4);
    memcpy(&y, &uy, 4);
    double dd = fabs((double)x - y);
    if (!(dd <= m)) m = dd;
  }
  free(a);
  free(b);
  return m;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  open_dev();
  const char *mode = argv[1];
  if (!strcmp(mode, "verbose")) {
    static const int cf[][5] = {{1, 64, 4, 2, 64}, {1, 128, 4, 1, 64}, {2, 128, 4, 1, 64}, {1, 128, 8, 1, 64},
                                {1, 128, 4, 2, 32}, {1, 64, 4, 1, 128}, {1, 64, 4, 2, 128}, {1, 256, 4, 1, 32},
                                {1, 40, 4, 2, 64}};
    for (size_t i = 0; i < sizeof cf / sizeof cf[0]; ++i) {
      char def[256];
      defines_for(cf[i][0], cf[i][1], (cfg){cf[i][2], cf[i][3], cf[i][4]}, def, sizeof def);
      cl_program p = build_raw(def, 1);
      if (p) clReleaseProgram(p);
    }
    return 0;
  }
  if (!strcmp(mode, "bench")) {
    int iters = 10;
    printf("%-5s %4s %6s %6s %9s %8s  %s\n", "dtype", "d", "N", "causal", "ms", "TFLOP/s", "kernel");
    for (int dt = 1; dt <= 2; ++dt)
      for (int d = 64; d <= 128; d *= 2)
        for (int n = 1024; n <= 16384; n *= 4)
          for (int causal = 0; causal < 2; ++causal) {
            fcl_attention_desc desc = make_desc(dt, d, n, causal);
            fill(dt, (size_t)4 * 16 * n * d > (size_t)4 * 16 * 16384 * 128 ? (size_t)4 * 16 * n * d : (size_t)4 * 16 * 16384 * 128);
            fcl_plan_info info;
            fcl_describe_plan(fctx, FCL_OP_FORWARD, &desc, &info);
            double ms = time_it(&desc, NULL, 0, 0, bo, iters);
            printf("%-5s %4d %6d %6d %9.3f %8.1f  %s %dx%d\n", dt == 1 ? "f16" : "bf16", d, n, causal, ms,
                   flops(d, n, causal) / ms * 1e-9, info.kernel, info.block_q, info.block_k);
            fflush(stdout);
          }
    return 0;
  }
  if (!strcmp(mode, "sweep")) {
    static const struct {
      int d, nw, mt, bc;
      const char *defs, *opts;
    } cf[] = {
        {128, 2, 2, 32, "-DQSMEM=1 -DSTAGES=2", ""}, {128, 2, 2, 32, "-DQSMEM=1 -DSTAGES=3", ""},
        {64, 4, 2, 64, "-DQSMEM=1 -DSTAGES=2", ""}, {64, 4, 2, 64, "-DQSMEM=1 -DSTAGES=3", ""},
    };
    printf("%-5s %4s %6s %3s %3s %3s %4s %-20s %-24s %9s %8s %10s\n", "dtype", "d", "N", "cau", "NW", "MT", "BC", "defs",
           "opts", "ms", "TFLOP/s", "maxdiff");
    const int dt = 1;
    for (size_t i = 0; i < sizeof cf / sizeof cf[0]; ++i) {
      const int d = cf[i].d;
      cfg c = {cf[i].nw, cf[i].mt, cf[i].bc};
      char def[512];
      defines_for(dt, d, c, def, sizeof def);
      snprintf(def + strlen(def), sizeof def - strlen(def), " %s %s -cl-nv-verbose", cf[i].defs, cf[i].opts);
      cl_program p = build_raw(def, 2);
      if (!p) continue;
      cl_int err;
      cl_kernel kern = clCreateKernel(p, "flash_fwd_mma", &err);
      CK(err);
      fill(dt, (size_t)4 * 16 * 16384 * (d > 128 ? d : 128));
      for (int n = 1024; n <= 16384; n *= 4)
        for (int causal = 0; causal < 2; ++causal) {
          fcl_attention_desc desc = make_desc(dt, d, n, causal);
          time_it(&desc, NULL, 0, 0, bo, 1);
          double ms = time_it(&desc, kern, c.nw * c.mt * 16, c.nw * 32, bo2, 10);
          double md = max_diff(dt, (size_t)4 * 16 * n * d);
          printf("%-5s %4d %6d %3d %3d %3d %4d %-20s %-24s %9.3f %8.1f %10.2e\n", "f16", d, n, causal, c.nw, c.mt, c.bc,
                 cf[i].defs, cf[i].opts, ms, flops(d, n, causal) / ms * 1e-9, md);
          fflush(stdout);
        }
      clReleaseKernel(kern);
      clReleaseProgram(p);
    }
    return 0;
  }
  return 2;
}
