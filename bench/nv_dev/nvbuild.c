/* Builds one OpenCL program from source files with the given options on the first GPU and prints the
 * build status and log (with -cl-nv-verbose, NVIDIA's compiler reports registers and spills there), then each
 * kernel's CL_KERNEL_WORK_GROUP_SIZE and local memory.
 * usage: nvbuild "OPTIONS" FILE...   (files are concatenated in order, as the library passes them; OPTIONS
 * follow the ones every tensor-core program gets from the library, -cl-std=CL1.2 -DFCL_PTX=1, without which
 * the kernels do not build)
 * Exit status: 0 when the build succeeded, 1 otherwise. */
#include "dev_util.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s \"OPTIONS\" FILE...\n", argv[0]);
    return 2;
  }
  cl_device_id dev = dev_first_gpu();
  if (!dev) {
    fprintf(stderr, "no OpenCL GPU\n");
    return 1;
  }
  cl_int err = CL_SUCCESS;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "clCreateContext: %d\n", err);
    return 1;
  }
  const char *src[16];
  cl_uint n = 0;
  for (int i = 2; i < argc && n < 16; ++i)
    if (!(src[n++] = dev_slurp(argv[i]))) return 1;
  cl_program prog = clCreateProgramWithSource(ctx, n, src, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "clCreateProgramWithSource: %d\n", err);
    return 1;
  }
  char options[4096];
  snprintf(options, sizeof options, "-cl-std=CL1.2 -DFCL_PTX=1 %s", argv[1]);
  const cl_int rc = clBuildProgram(prog, 1, &dev, options, NULL, NULL);
  size_t len = 0;
  clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
  char *log = malloc(len + 1);
  if (log && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, len, log, NULL) == CL_SUCCESS) log[len] = '\0';
  else if (log) log[0] = '\0';
  printf("rc=%d\n%s\n", rc, log ? log : "");
  /* Each kernel's work-items a work-group may have as compiled: below the device's limit, the registers bound it,
     so it tells how many such work-groups a multiprocessor's register file holds. */
  cl_kernel kernels[16];
  cl_uint nk = 0;
  if (rc == CL_SUCCESS && clCreateKernelsInProgram(prog, 16, kernels, &nk) == CL_SUCCESS)
    for (cl_uint i = 0; i < nk; ++i) {
      char name[128] = "";
      size_t wg = 0;
      cl_ulong local = 0;
      clGetKernelInfo(kernels[i], CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
      clGetKernelWorkGroupInfo(kernels[i], dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
      clGetKernelWorkGroupInfo(kernels[i], dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
      printf("kernel %s: CL_KERNEL_WORK_GROUP_SIZE %zu, local %llu B\n", name, wg, (unsigned long long)local);
    }
  return rc == CL_SUCCESS ? 0 : 1;
}
