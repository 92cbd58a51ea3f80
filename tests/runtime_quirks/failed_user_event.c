/* A runtime check outside the library (docs/testing.md, "Devices and their quirks"): a fill and a marker wait on
 * a user event that is then set to -1. Both should end with a negative execution status, and the fill should not
 * run. Intel's CPU runtime 2026.2 skipped the fill but reported both CL_COMPLETE (0); PoCL reports -1.
 *   cc -O2 tests/runtime_quirks/failed_user_event.c -lOpenCL -o /tmp/failed_user_event && /tmp/failed_user_event */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>

int main(void) {
  cl_platform_id plat;
  cl_device_id dev;
  cl_int err;
  if (clGetPlatformIDs(1, &plat, NULL) || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL)) {
    fprintf(stderr, "no OpenCL device\n");
    return 2;
  }
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  int host[256] = {0};
  const int pattern = 7;
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
  clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL);
  cl_event user = clCreateUserEvent(ctx, &err), fill, marker;
  clEnqueueFillBuffer(q, buf, &pattern, sizeof pattern, 0, sizeof host, 1, &user, &fill);
  clEnqueueMarkerWithWaitList(q, 1, &user, &marker);
  clSetUserEventStatus(user, -1);
  clFinish(q);
  cl_int fill_status = 1, marker_status = 1;
  clGetEventInfo(fill, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof fill_status, &fill_status, NULL);
  clGetEventInfo(marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof marker_status, &marker_status, NULL);
  clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL);
  printf("fill status %d, marker status %d (negative: the failure reached them); the fill %s\n", fill_status,
         marker_status, host[0] == pattern ? "ran" : "did not run");
  return fill_status >= 0 || marker_status >= 0 || host[0] == pattern;
}
