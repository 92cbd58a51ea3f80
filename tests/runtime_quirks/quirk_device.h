/* The device a runtime-quirk program runs on, as the test suite picks it: FLASHCL_TEST_DEVICE's index (in the
 * order of platforms and their devices) or the first device whose name contains it, else the first GPU, else the
 * first device; its name printed. Several platforms are common
 * (a GPU's and PoCL), and the first platform is not always the one meant. Each program stays one cc line. */
#ifndef QUIRK_DEVICE_H
#define QUIRK_DEVICE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int quirk_device(cl_device_id *out) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS || np == 0) return -1;
  const char *want = getenv("FLASHCL_TEST_DEVICE");
  char *end = NULL;
  const long index = want && *want ? strtol(want, &end, 10) : -1;
  const int by_index = want && *want && *end == '\0';
  int found = 0, seen = 0;
  for (cl_uint p = 0; p < np && p < 16; ++p) {
    cl_device_id devs[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < nd && d < 16; ++d, ++seen) {
      char name[256] = "";
      cl_device_type type = 0;
      clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof name, name, NULL);
      clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      /* 3: the named device; 2: a GPU; 1: any */
      const int rank = by_index ? (seen == index ? 3 : 0)
                       : want && *want ? (strstr(name, want) ? 3 : 0)
                       : (type & CL_DEVICE_TYPE_GPU) ? 2 : 1;
      if (rank > found) {
        found = rank;
        *out = devs[d];
      }
    }
  }
  if (!found) return -1;
  char name[256] = "";
  clGetDeviceInfo(*out, CL_DEVICE_NAME, sizeof name, name, NULL);
  printf("device: %s\n", name);
  return 0;
}
#endif
