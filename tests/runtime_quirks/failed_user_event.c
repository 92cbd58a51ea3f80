/* A runtime check outside the library (docs/testing.md, "Devices and their quirks"): on an in-order and on an
 * out-of-order queue, a fill, a marker and a kernel wait on a user event that is then set to -1, a second marker
 * waits on the fill's event (a failure two commands away, as a split forward's combine waits on its partials), and
 * an independent fill and independent kernels wait on nothing (one reads the blocked kernel's input; one has a
 * kernel behind it).
 * Required (the exit status), as OpenCL says of commands that wait on a user event set to a negative status: the
 * fill, the marker and the kernel behind the event end with a negative execution status, and the fill and the
 * kernel do not run. Reported only: the commands behind those (OpenCL leaves what follows a terminated command to
 * the runtime; flashcl's docs/api.md promises a negative status for its calls' events behind a failed one, which
 * the runtimes here give) and the independent commands: on an out-of-order queue PoCL runs them while the event is
 * pending and completes them; NVIDIA's OpenCL (driver 580.159.04) holds every later command of the queue until the
 * event resolves and then fails them with it, as both runtimes do on an in-order queue. Intel's CPU runtime 2026.2
 * skipped the fill but reported the fill and the marker CL_COMPLETE (0); PoCL reports -1.
 *   cc -O2 tests/runtime_quirks/failed_user_event.c -lOpenCL -o /tmp/failed_user_event && /tmp/failed_user_event
 * (FLASHCL_TEST_DEVICE picks the device by index or name, as for the test suite.) */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <time.h>

#include "quirk_device.h"

static const char *source =
    "__kernel void put(__global const int *src, __global int *dst, int v) {"
    "  dst[get_global_id(0)] = src[get_global_id(0)] + v; }";

static cl_int status_of(cl_event e) {
  cl_int s = 1;
  clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL);
  return s;
}

/* 0 when every command ended as it should on a queue with these properties. */
static int run(cl_context ctx, cl_device_id dev, cl_kernel kernel, cl_command_queue_properties props, const char *name) {
  cl_int err;
  const cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, props, 0};
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, qp, &err);
  if (err != CL_SUCCESS) {
    printf("%s queue: not created (%d)\n", name, (int)err);
    return 0;
  }
  int host[256] = {0}, other[256] = {0};
  const int pattern = 7;
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
  cl_mem free_buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof other, NULL, &err);
  clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL);
  clEnqueueWriteBuffer(q, free_buf, CL_TRUE, 0, sizeof other, other, 0, NULL, NULL);
  /* Kernels dst = src + pattern: one behind the event, two independent ones, of which one reads its input. */
  int zeros[256] = {0}, put_host[6][256] = {{0}};
  cl_mem shared_src = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
  cl_mem own_src = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
  cl_mem dst[6];
  for (int i = 0; i < 6; ++i) dst[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
  const size_t n = 256;
  cl_event user = clCreateUserEvent(ctx, &err), fill, marker, behind_fill, free_fill, put[6];
  clEnqueueFillBuffer(q, buf, &pattern, sizeof pattern, 0, sizeof host, 1, &user, &fill);
  clEnqueueMarkerWithWaitList(q, 1, &user, &marker);
  clEnqueueMarkerWithWaitList(q, 1, &fill, &behind_fill);
  clEnqueueFillBuffer(q, free_buf, &pattern, sizeof pattern, 0, sizeof other, 0, NULL, &free_fill);
  /* The blocked kernel (0) and one behind it (3, as a split forward's combine waits on its partials), then the
     independent ones: 1, 2 (reading 0's input), and a pair of its own, 5 behind 4 (a second split forward). */
  clSetKernelArg(kernel, 2, sizeof pattern, &pattern);
  static const int order[6] = {0, 3, 1, 2, 4, 5};
  for (int o = 0; o < 6; ++o) {
    const int i = order[o];
    clSetKernelArg(kernel, 0, sizeof(cl_mem), i == 0 || i == 2 ? &shared_src : &own_src);
    clSetKernelArg(kernel, 1, sizeof(cl_mem), &dst[i]);
    const cl_event *w = i == 0 ? &user : i == 3 ? &put[0] : i == 5 ? &put[4] : NULL;
    clEnqueueNDRangeKernel(q, kernel, 1, NULL, &n, NULL, w ? 1 : 0, w, &put[i]);
  }
  /* Before the failure: the independent pair's second kernel, given up to a second to end. */
  clFlush(q);
  cl_int early = status_of(put[5]);
  for (int t = 0; t < 100 && early > 0; ++t) {
    nanosleep(&(struct timespec){0, 10000000}, NULL);
    early = status_of(put[5]);
  }
  clSetUserEventStatus(user, -1);
  clFinish(q);
  const cl_int s_fill = status_of(fill), s_marker = status_of(marker), s_behind = status_of(behind_fill);
  const cl_int s_free = status_of(free_fill);
  cl_int s_put[6];
  for (int i = 0; i < 6; ++i) s_put[i] = status_of(put[i]);
  clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL);
  clEnqueueReadBuffer(q, free_buf, CL_TRUE, 0, sizeof other, other, 0, NULL, NULL);
  int ran[6];
  for (int i = 0; i < 6; ++i) {
    clEnqueueReadBuffer(q, dst[i], CL_TRUE, 0, sizeof put_host[i], put_host[i], 0, NULL, NULL);
    ran[i] = put_host[i][0] == pattern;
  }
  printf("%s queue: while the user event was pending, the independent pair's second kernel was at %d; behind the "
         "failed event: fill %d (%s), marker %d, marker behind the fill %d, kernel %d (%s), kernel behind that kernel "
         "%d (%s); independent: fill %d (%s), kernel %d (%s), kernel reading the blocked "
         "kernel's input %d (%s), a kernel %d (%s) and one behind it %d (%s)\n",
         name, (int)early, s_fill, host[0] == pattern ? "ran" : "did not run", s_marker, s_behind, s_put[0],
         ran[0] ? "ran" : "did not run", s_put[3], ran[3] ? "ran" : "did not run", s_free,
         other[0] == pattern ? "ran" : "did not run", s_put[1], ran[1] ? "ran" : "did not run", s_put[2],
         ran[2] ? "ran" : "did not run", s_put[4], ran[4] ? "ran" : "did not run", s_put[5],
         ran[5] ? "ran" : "did not run");
  cl_event all[5] = {user, fill, marker, behind_fill, free_fill};
  for (int i = 0; i < 5; ++i) clReleaseEvent(all[i]);
  cl_mem mems[4] = {buf, free_buf, shared_src, own_src};
  for (int i = 0; i < 4; ++i) clReleaseMemObject(mems[i]);
  for (int i = 0; i < 6; ++i) clReleaseMemObject(dst[i]), clReleaseEvent(put[i]);
  clReleaseCommandQueue(q);
  return s_fill >= 0 || s_marker >= 0 || s_put[0] >= 0 || host[0] == pattern || ran[0];
}

int main(void) {
  cl_device_id dev;
  cl_int err;
  if (quirk_device(&dev)) {
    fprintf(stderr, "no OpenCL device\n");
    return 2;
  }
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
  if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
    fprintf(stderr, "the kernel does not build\n");
    return 2;
  }
  cl_kernel kernel = clCreateKernel(prog, "put", &err);
  const int bad = run(ctx, dev, kernel, 0, "in-order") |
                  run(ctx, dev, kernel, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, "out-of-order");
  clReleaseKernel(kernel);
  clReleaseProgram(prog);
  clReleaseContext(ctx);
  return bad;
}
