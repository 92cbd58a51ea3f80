/* What a second kernel in the same call costs on its own (docs/notes-nvidia.md, v13): two nearly empty
 * kernels back to back on one in-order profiling queue, timed from the end of a gate command to the end of
 * the last kernel, against one alone. As flashcl-bench times with --flush: a 256 MiB fill runs before the gate,
 * so the kernels are submitted while it runs and the host's part is left out (with `user`, everything also
 * waits on a user event released after the enqueues); the second kernel waiting on the first's event explicitly (as
 * flashcl's event chains do), or only through the queue's order, or the first enqueued without an event.
 * Median of 50 after 5 warm-ups. Not part of the library.
 * Build (GPU machine, repository root):  gcc -O2 bench/nv_dev/launch_gap.c -lOpenCL -o launch_gap
 * Run:  ./launch_gap [work-groups [user]]   (default 512 work-groups of 32, gate without a user event) */
#include <stdio.h>
#include <stdlib.h>

#include "dev_util.h"

static const char *src = "__kernel void nearly_empty(__global int *x) { if (x[0] == 12345) x[1] = 0; }\n";

static double span_us(cl_event from, cl_event to) {
  cl_ulong a = 0, b = 0;
  clGetEventProfilingInfo(from, CL_PROFILING_COMMAND_END, sizeof a, &a, NULL);
  clGetEventProfilingInfo(to, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
  return (double)(b - a) / 1000.0;
}

int main(int argc, char **argv) {
  const size_t groups = argc > 1 ? (size_t)atoi(argv[1]) : 512, local = 32, global = groups * local;
  const int user = argc > 2;
  cl_device_id dev = dev_first_gpu();
  if (!dev || !groups) {
    fprintf(stderr, "%s\n", dev ? "work-groups must be positive" : "no OpenCL GPU");
    return 1;
  }
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
    fprintf(stderr, "build failed\n");
    return 1;
  }
  cl_kernel k = clCreateKernel(prog, "nearly_empty", &err);
  const int zero[2] = {0, 0};
  cl_mem x = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, (void *)zero, &err);
  cl_mem gate_buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4, NULL, &err);
  const size_t flush_bytes = (size_t)256 << 20;
  cl_mem flush = clCreateBuffer(ctx, CL_MEM_READ_WRITE, flush_bytes, NULL, &err);
  clSetKernelArg(k, 0, sizeof x, &x);
  static const char *names[4] = {"one kernel", "two, the second waits on the first's event",
                                 "two, in queue order only", "two, the first without an event"};
  printf("%zu work-groups of %zu%s: us from the gate's end to the last kernel's end (median of 50)\n", groups, local,
         user ? ", behind a user event" : "");
  for (int c = 0; c < 4; ++c) {
    double t[50];
    for (int it = -5; it < 50; ++it) {
      cl_event gate, a = NULL, b = NULL, hold = user ? clCreateUserEvent(ctx, &err) : NULL;
      clEnqueueFillBuffer(q, flush, zero, 4, 0, flush_bytes, 0, NULL, NULL);
      clEnqueueFillBuffer(q, gate_buf, zero, 4, 0, 4, user ? 1 : 0, user ? &hold : NULL, &gate);
      clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, c == 3 ? NULL : &a);
      if (c == 1) clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 1, &a, &b);
      if (c >= 2) clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, &b);
      if (hold) clSetUserEventStatus(hold, CL_COMPLETE), clReleaseEvent(hold);
      clFinish(q);
      if (it >= 0) t[it] = span_us(gate, c == 0 ? a : b);
      clReleaseEvent(gate);
      if (a) clReleaseEvent(a);
      if (b) clReleaseEvent(b);
    }
    qsort(t, 50, sizeof t[0], dev_cmp_double);
    printf("%-45s %8.2f us (min %.2f)\n", names[c], t[25], t[0]);
  }
  return 0;
}
