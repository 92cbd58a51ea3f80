/* A runtime check outside the library (docs/testing.md, "Devices and their quirks"): one thread, two in-order
 * queues of one device. Each round writes a poison value into a small buffer with a blocking write on queue A,
 * runs a kernel on queue B that writes that buffer and a second one (not written before), waits for the
 * kernel's event, and reads both back with blocking reads on queue A. Every round should read the kernel's
 * values. Intel's CPU runtime 2026.2 returned the poison in the first buffer in about a quarter of the rounds;
 * PoCL in none.
 *   cc -O2 tests/runtime_quirks/cross_queue_write.c -lOpenCL -o /tmp/cross_queue_write && /tmp/cross_queue_write
 * (OCL_ICD_VENDORS selects the implementation; N=4096 floats instead of 99 hides the effect there.) */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include "quirk_device.h"
#include <stdio.h>

enum { N = 99, ROUNDS = 2000 };
static const char *src =
    "__kernel void w(__global float *o, float x, __global float *l) {"
    "  size_t i = get_global_id(0); o[i] = x; l[i] = x + 1.0f; }";

int main(void) {
  cl_device_id dev;
  cl_int err;
  if (quirk_device(&dev)) {
    fprintf(stderr, "no OpenCL device\n");
    return 2;
  }
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue qa = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  cl_command_queue qb = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  if (clBuildProgram(prog, 1, &dev, "", NULL, NULL)) return 2;
  cl_kernel kern = clCreateKernel(prog, "w", &err);
  float poison[N], o_host[N], l_host[N];
  for (int i = 0; i < N; ++i) poison[i] = -12345.0f;
  int lost_l = 0, lost_o = 0;
  for (int r = 0; r < ROUNDS; ++r) {
    cl_mem o = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof o_host, NULL, &err);
    cl_mem l = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof l_host, NULL, &err);
    clEnqueueWriteBuffer(qa, l, CL_TRUE, 0, sizeof poison, poison, 0, NULL, NULL);
    const float x = (float)r;
    const size_t global = N;
    cl_event ev;
    clSetKernelArg(kern, 0, sizeof o, &o);
    clSetKernelArg(kern, 1, sizeof x, &x);
    clSetKernelArg(kern, 2, sizeof l, &l);
    clEnqueueNDRangeKernel(qb, kern, 1, NULL, &global, NULL, 0, NULL, &ev);
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    clEnqueueReadBuffer(qa, o, CL_TRUE, 0, sizeof o_host, o_host, 0, NULL, NULL);
    clEnqueueReadBuffer(qa, l, CL_TRUE, 0, sizeof l_host, l_host, 0, NULL, NULL);
    int bad_o = 0, bad_l = 0;
    for (int i = 0; i < N; ++i) bad_o |= o_host[i] != x, bad_l |= l_host[i] != x + 1.0f;
    lost_o += bad_o, lost_l += bad_l;
    clReleaseMemObject(o);
    clReleaseMemObject(l);
  }
  printf("rounds whose kernel writes were not read back: %d of %d (buffer written before on the other queue), "
         "%d (buffer not written before)\n", lost_l, ROUNDS, lost_o);
  return lost_l || lost_o;
}
