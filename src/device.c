/* Capability probe: the device facts the planner and the kernel choice depend on. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cl_vendor.h"

/* OpenCL 2.1's query, for the 1.2 headers this library builds against. */
#define FCL_DEVICE_MAX_NUM_SUB_GROUPS 0x105C

static int contains_ci(const char *haystack, const char *needle) {
  size_t n = strlen(needle);
  for (const char *h = haystack; *h; ++h) {
    size_t i = 0;
    while (i < n && h[i] && (h[i] | 32) == (needle[i] | 32)) ++i;
    if (i == n) return 1;
  }
  return 0;
}

/* 1 when the space-separated list names ext whole (cl_khr_subgroup_shuffle is not cl_khr_subgroup_shuffle_relative). */
static int has_extension(const char *list, const char *ext) {
  const size_t n = strlen(ext);
  for (const char *p = list; (p = strstr(p, ext)) != NULL; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return 1;
  return 0;
}

static fcl_status device_string(cl_device_id device, cl_device_info what, char *out, size_t size) {
  out[0] = '\0';
  FCL_CL_CHECK(clGetDeviceInfo(device, what, size, out, NULL));
  out[size - 1] = '\0';
  return FCL_SUCCESS;
}

static fcl_status platform_string(cl_platform_id platform, cl_platform_info what, char *out, size_t size) {
  out[0] = '\0';
  FCL_CL_CHECK(clGetPlatformInfo(platform, what, size, out, NULL));
  out[size - 1] = '\0';
  return FCL_SUCCESS;
}

fcl_status fcl_probe_device(cl_device_id device, fcl_device_caps *caps) {
  memset(caps, 0, sizeof *caps);
  fcl_status st;
  cl_platform_id platform;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL));
  if ((st = platform_string(platform, CL_PLATFORM_NAME, caps->platform_name, sizeof caps->platform_name)) ||
      (st = platform_string(platform, CL_PLATFORM_VERSION, caps->platform_version,
                            sizeof caps->platform_version)) ||
      (st = device_string(device, CL_DEVICE_NAME, caps->device_name, sizeof caps->device_name)) ||
      (st = device_string(device, CL_DEVICE_VERSION, caps->device_version, sizeof caps->device_version)) ||
      (st = device_string(device, CL_DRIVER_VERSION, caps->driver_version, sizeof caps->driver_version)) ||
      (st = device_string(device, CL_DEVICE_VENDOR, caps->vendor_name, sizeof caps->vendor_name)))
    return st;

  cl_device_type type;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL));
  caps->is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  caps->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof caps->compute_units,
                               &caps->compute_units, NULL));
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof caps->local_mem_size,
                               &caps->local_mem_size, NULL));
  cl_device_local_mem_type lmt;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_TYPE, sizeof lmt, &lmt, NULL));
  caps->local_mem_dedicated = lmt == CL_LOCAL;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof caps->global_mem_size,
                               &caps->global_mem_size, NULL));
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof caps->max_alloc_size,
                               &caps->max_alloc_size, NULL));
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof caps->max_work_group_size,
                               &caps->max_work_group_size, NULL));
  size_t item_sizes[3] = {0, 0, 0};
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof item_sizes, item_sizes, NULL));
  caps->max_work_item_size0 = item_sizes[0];

  size_t ext_size = 0;
  FCL_CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_size));
  char *ext = malloc(ext_size + 1);
  if (!ext) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory probing the device");
  cl_int err = clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, ext_size, ext, NULL);
  ext[err == CL_SUCCESS ? ext_size : 0] = '\0';
  caps->has_fp16 = has_extension(ext, "cl_khr_fp16");
  caps->has_fp64 = has_extension(ext, "cl_khr_fp64");
  /* The shuffles flash_fwd.cl takes: Intel's, or Khronos's where the device has sub-groups (the extension, or
     OpenCL 3.0's optional feature, which CL_DEVICE_MAX_NUM_SUB_GROUPS reports). The kernel also checks the
     compiler's extension macros, and reduces through local memory without them. */
  cl_uint max_sub_groups = 0;
  if (clGetDeviceInfo(device, FCL_DEVICE_MAX_NUM_SUB_GROUPS, sizeof max_sub_groups, &max_sub_groups, NULL) != CL_SUCCESS)
    max_sub_groups = 0;
  const int subgroups =
      has_extension(ext, "cl_khr_subgroups") || has_extension(ext, "cl_intel_subgroups") || max_sub_groups > 0;
  /* Intel's CPU runtime runs a sub-group's work-items as the lanes of SIMD vectors, which the planners' shapes for
     it are made for. PoCL's CPU devices may report sub-groups too, but emulate each shuffle through local memory
     and a work-group barrier, slower than the kernel's own local-memory reductions: other CPUs take neither. */
  caps->cpu_simd_subgroups = caps->is_cpu && subgroups && contains_ci(caps->platform_name, "intel");
  if ((has_extension(ext, "cl_intel_subgroups") || (has_extension(ext, "cl_khr_subgroup_shuffle") && subgroups)) &&
      (!caps->is_cpu || caps->cpu_simd_subgroups))
    caps->sg_shuffle = FCL_SG_OPENCL;
  int nv_attrs = has_extension(ext, "cl_nv_device_attribute_query");
  int amd_attrs = has_extension(ext, "cl_amd_device_attribute_query");
  free(ext);
  if (err != CL_SUCCESS) return fcl_cl_failure("clGetDeviceInfo(CL_DEVICE_EXTENSIONS)", err);

  if (contains_ci(caps->platform_name, "nvidia") || contains_ci(caps->vendor_name, "nvidia"))
    caps->vendor = FCL_VENDOR_NVIDIA;
  else if (contains_ci(caps->vendor_name, "advanced micro") || contains_ci(caps->vendor_name, "amd"))
    caps->vendor = FCL_VENDOR_AMD;
  else if (contains_ci(caps->vendor_name, "intel"))
    caps->vendor = FCL_VENDOR_INTEL;
  else
    caps->vendor = FCL_VENDOR_OTHER;
  /* Development switches that emulate a smaller device, so they adjust the capabilities themselves: plan as if
     the device had less local memory or smaller work-groups, to exercise small-device tilings on any machine.
     Overrides of the plans themselves are not the device's: overrides.c. */
  const char *lim = getenv("FLASHCL_LOCAL_MEM_LIMIT");
  const unsigned long long local_limit = lim && *lim ? strtoull(lim, NULL, 10) : 0; /* 0: none */
  if (local_limit > 0 && local_limit < caps->local_mem_size) caps->local_mem_size = local_limit;
  const char *wgl = getenv("FLASHCL_MAX_WORK_GROUP_SIZE");
  if (wgl && *wgl && strtoull(wgl, NULL, 10) > 0 && strtoull(wgl, NULL, 10) < caps->max_work_group_size)
    caps->max_work_group_size = (size_t)strtoull(wgl, NULL, 10);

  /* Warp or wavefront width where the vendor reports it; else 32 for GPUs (NVIDIA, AMD RDNA in wave32),
     16 for Intel GPUs, 8 for CPUs (one AVX-256 vector of floats). */
  caps->preferred_multiple = caps->is_cpu ? 8 : 32;
  if (nv_attrs) {
    cl_uint v = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof v, &v, NULL) == CL_SUCCESS)
      caps->nv_cc_major = (int)v;
    if (clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof v, &v, NULL) == CL_SUCCESS)
      caps->nv_cc_minor = (int)v;
    if (clGetDeviceInfo(device, CL_DEVICE_WARP_SIZE_NV, sizeof v, &v, NULL) == CL_SUCCESS && v)
      caps->preferred_multiple = v;
    caps->nv_static_local = fcl_nvidia_block_local(caps->nv_cc_major, caps->nv_cc_minor);
    if (local_limit > 0 && local_limit < caps->nv_static_local) caps->nv_static_local = local_limit;
  } else if (amd_attrs) {
    cl_uint v = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_WAVEFRONT_WIDTH_AMD, sizeof v, &v, NULL) == CL_SUCCESS && v)
      caps->preferred_multiple = v;
  } else if (caps->vendor == FCL_VENDOR_INTEL && caps->is_gpu) {
    caps->preferred_multiple = 16;
  }
  /* FLASHCL_SUBGROUPS: "off" plans the row reductions without sub-group shuffles (the shapes stay); "on" adds NVIDIA's warp shuffles
     (not taken by default until measured); "required" is "on", and a kernel planned with shuffles that cannot
     take them writes NaN, so tests know they ran. Anything else: the default. */
  const char *sg = getenv("FLASHCL_SUBGROUPS");
  if (sg && (!strcmp(sg, "on") || !strcmp(sg, "required")) && !caps->sg_shuffle && caps->nv_cc_major >= 7)
    caps->sg_shuffle = FCL_SG_NVIDIA_WARP;
  if (sg && !strcmp(sg, "required")) caps->sg_required = 1;
  if (sg && !strcmp(sg, "off")) caps->sg_shuffle = FCL_SG_NONE;
  return FCL_SUCCESS;
}
