/* How much local memory a work-group gets on this OpenCL device: the device's reported limit, then a kernel
 * whose local buffer is a kernel argument (clSetKernelArg with a size and NULL) and one whose buffer is a
 * static __local array, at sizes around and beyond the limit. Each work-group writes every word of its buffer
 * with a value of its own (index and group), reads the buffer back R times in another order and counts the
 * words that differ; it also counts how many work-groups were resident at once (an atomic counter), which
 * shows whether the hardware really set the memory aside (fewer groups a unit as the size grows).
 * Not part of the library (docs/notes-nvidia.md, v37).
 * Build (GPU machine, repository root):
 *   gcc -O2 -Iinclude -Ibench/nv_dev bench/nv_dev/local_limit.c -lOpenCL -o local_limit
 * Run:  ./local_limit   (the first GPU, else the first platform's first device) */
#include <stdio.h>
#include <stdlib.h>

#include "dev_util.h"

#define KERNEL_BODY                                                                         \
  "  const int lid = get_local_id(0), ls = get_local_size(0);\n"                            \
  "  const uint gid = get_group_id(0);\n"                                                   \
  "  if (lid == 0) { int c = atomic_inc(&ctr[0]) + 1; atomic_max(&ctr[1], c); }\n"          \
  "  for (int i = lid; i < n; i += ls) buf[i] = ((uint)i * 2654435761u) ^ (gid << 20);\n" \
  "  barrier(CLK_LOCAL_MEM_FENCE);\n"                                                       \
  "  uint bad = 0;\n"                                                                       \
  "  for (int r = 0; r < 8; ++r)\n"                                                         \
  "    for (int i = lid; i < n; i += ls) {\n"                                               \
  "      const int j = n - 1 - i;\n"                                                        \
  "      bad += buf[j] != (((uint)j * 2654435761u) ^ (gid << 20));\n"                       \
  "    }\n"                                                                                 \
  "  barrier(CLK_LOCAL_MEM_FENCE);\n"                                                       \
  "  if (lid == 0) atomic_dec(&ctr[0]);\n"                                                  \
  "  out[get_global_id(0)] = bad;\n"                                                        \
  "}\n"

static const char *dyn_src =
    "__kernel void fill_read(__global uint *out, __global int *ctr, __local uint *buf, int n) {\n" KERNEL_BODY;
/* The same with a static array of N words (-DN=...). */
static const char *static_src =
    "__kernel void fill_read(__global uint *out, __global int *ctr, int n) {\n"
    "  __local uint buf[N];\n" KERNEL_BODY;

enum { LOCAL = 128, GROUPS = 1056 };

static void try_size(cl_context ctx, cl_command_queue q, cl_device_id dev, size_t bytes, int dynamic) {
  const int n = (int)(bytes / sizeof(cl_uint));
  const char *kind = dynamic ? "arg" : "static";
  cl_int err;
  char opts[64];
  snprintf(opts, sizeof opts, "-DN=%d", n);
  const char *src = dynamic ? dyn_src : static_src;
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  CK(err);
  err = clBuildProgram(prog, 1, &dev, dynamic ? "" : opts, NULL, NULL);
  if (err != CL_SUCCESS) {
    char log[512] = "";
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    printf("%-7s %7zu B: build %d (%.160s)\n", kind, bytes, err, log);
    clReleaseProgram(prog);
    return;
  }
  cl_kernel k = clCreateKernel(prog, "fill_read", &err);
  CK(err);
  cl_ulong klocal = 0;
  clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof klocal, &klocal, NULL);
  const size_t global = (size_t)GROUPS * LOCAL, local = LOCAL;
  cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, global * sizeof(cl_uint), NULL, &err);
  CK(err);
  cl_int zero[2] = {0, 0};
  cl_mem ctr = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, zero, &err);
  CK(err);
  int a = 0;
  CK(clSetKernelArg(k, a++, sizeof out, &out));
  CK(clSetKernelArg(k, a++, sizeof ctr, &ctr));
  if (dynamic) {
    err = clSetKernelArg(k, a++, bytes, NULL);
    if (err != CL_SUCCESS) {
      printf("%-7s %7zu B: clSetKernelArg %d\n", kind, bytes, err);
      goto done;
    }
  }
  CK(clSetKernelArg(k, a++, sizeof n, &n));
  err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL);
  cl_int fin = clFinish(q);
  if (err != CL_SUCCESS || fin != CL_SUCCESS) {
    printf("%-7s %7zu B: enqueue %d, finish %d (kernel reports %llu B local)\n", kind, bytes, err, fin,
           (unsigned long long)klocal);
    goto done;
  }
  cl_uint *h = malloc(global * sizeof(cl_uint));
  cl_int c[2];
  CK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, global * sizeof(cl_uint), h, 0, NULL, NULL));
  CK(clEnqueueReadBuffer(q, ctr, CL_TRUE, 0, sizeof c, c, 0, NULL, NULL));
  unsigned long long wrong = 0;
  for (size_t i = 0; i < global; ++i) wrong += h[i];
  printf("%-7s %7zu B: ran, %llu words read wrong, at most %d of %d work-groups resident at once (kernel reports "
         "%llu B local)\n",
         kind, bytes, wrong, c[1], GROUPS, (unsigned long long)klocal);
  free(h);
done:
  clReleaseMemObject(ctr);
  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(prog);
}

int main(void) {
  cl_device_id dev = dev_first_gpu();
  cl_platform_id plat;
  if (!dev && (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
               clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS)) {
    fprintf(stderr, "no OpenCL device\n");
    return 1;
  }
  char name[256] = "";
  cl_ulong lmem = 0;
  cl_uint units = 0;
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
  printf("%s: CL_DEVICE_LOCAL_MEM_SIZE %llu B, %u compute units\n", name, (unsigned long long)lmem, units);
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
  CK(err);
  const size_t sizes[] = {16384, 32768, 49136, 49152, 65536, 98304, 101376, 116736, 166912, 200704, 232444, 232448};
  for (int dynamic = 1; dynamic >= 0; --dynamic)
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) try_size(ctx, q, dev, sizes[i], dynamic);
  return 0;
}
