/* What the standalone GPU development programs of bench/nv_dev share (not part of the library). */
#ifndef FLASHCL_NV_DEV_UTIL_H
#define FLASHCL_NV_DEV_UTIL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include "flashcl.h"
#include <stdio.h>
#include <stdlib.h>

/* An OpenCL call that must succeed, or exit with its status. */
#define CK(x)                                                            \
  do {                                                                   \
    cl_int e_ = (x);                                                     \
    if (e_ != CL_SUCCESS) {                                              \
      fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, e_); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

/* A whole file as a NUL-terminated string (malloc'd), or NULL with the reason on stderr. */
static inline char *dev_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return NULL;
  }
  char *text = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)))
    text[fread(text, 1, (size_t)n, f)] = '\0';
  fclose(f);
  return text;
}

/* The first GPU of the first platform (of at most eight) that has one, or NULL. */
static inline cl_device_id dev_first_gpu(void) {
  cl_platform_id platforms[8];
  cl_uint np = 0;
  cl_device_id dev = NULL;
  if (clGetPlatformIDs(8, platforms, &np) != CL_SUCCESS) np = 0;
  if (np > 8) np = 8;
  for (cl_uint i = 0; i < np && !dev; ++i)
    if (clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) != CL_SUCCESS) dev = NULL;
  return dev;
}

/* A context and a profiling queue on dev, and a flashcl context on them without the disk cache; exits on
   failure. */
static inline void dev_open(cl_device_id dev, cl_context *cctx, cl_command_queue *queue, fcl_context **fctx) {
  cl_int err;
  *cctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CK(err);
  *queue = clCreateCommandQueue(*cctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CK(err);
  fcl_context_options o = {0};
  o.cache_dir = "";
  if (fcl_context_create(*cctx, dev, &o, fctx) != FCL_SUCCESS) {
    fprintf(stderr, "flashcl context: %s\n", fcl_last_error());
    exit(1);
  }
}

/* The build log of p on dev, NUL-terminated (malloc'd). */
static inline char *dev_build_log(cl_program p, cl_device_id dev) {
  size_t n = 0;
  clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
  char *log = malloc(n + 1);
  if (!log) exit(1);
  if (clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) n = 0;
  log[n] = 0;
  return log;
}

/* A finished command's run time in ms, from its profiling event's start and end. */
static inline double dev_event_ms(cl_event e) {
  cl_ulong a = 0, b = 0;
  CK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL));
  CK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL));
  return (double)(b - a) * 1e-6;
}

/* qsort's comparison of doubles, for medians of timings. */
static inline int dev_cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#endif
