/* Links against the installed library and runs one small forward pass on the first device. */
#include <flashcl.h>
#include <stdio.h>

int main(void) {
  cl_platform_id platform;
  cl_device_id device;
  cl_int err = clGetPlatformIDs(1, &platform, NULL);
  if (err == CL_SUCCESS) err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
  if (err != CL_SUCCESS) return 1;
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
  fcl_context *ctx = NULL;
  fcl_status st = fcl_context_create(context, device, NULL, &ctx);
  float host[2 * 3 * 8];
  for (int i = 0; i < 2 * 3 * 8; ++i) host[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  cl_mem buf[4];
  for (int i = 0; i < 4; ++i)
    buf[i] = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
  fcl_attention_desc desc = {0};
  desc.batch = 2, desc.num_heads = 1, desc.seqlen_q = 3, desc.seqlen_k = 3, desc.head_dim = 8;
  desc.dtype = FCL_DTYPE_F32;
  if (st == FCL_SUCCESS) st = fcl_attention_forward(ctx, queue, &desc, buf[0], buf[1], buf[2], buf[3], NULL, 0, NULL, NULL);
  clFinish(queue);
  printf("flashcl %s: forward %s %s\n", fcl_version(), fcl_status_string(st), fcl_last_error());
  for (int i = 0; i < 4; ++i) clReleaseMemObject(buf[i]);
  fcl_context_release(ctx);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
  return st == FCL_SUCCESS ? 0 : 1;
}
