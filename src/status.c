/* Status strings and the calling thread's last error message. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Large enough for a typical build log (FCL_ERROR_BUILD returns it); longer ones are cut. */
static _Thread_local char last_error[32768];
static _Thread_local unsigned long failures; /* fcl_fail calls on this thread */

const char *fcl_version(void) { return FLASHCL_VERSION_STRING; }

const char *fcl_status_string(fcl_status status) {
  switch (status) {
    case FCL_SUCCESS: return "FCL_SUCCESS";
    case FCL_ERROR_INVALID_ARGUMENT: return "FCL_ERROR_INVALID_ARGUMENT";
    case FCL_ERROR_UNSUPPORTED: return "FCL_ERROR_UNSUPPORTED";
    case FCL_ERROR_OPENCL: return "FCL_ERROR_OPENCL";
    case FCL_ERROR_BUILD: return "FCL_ERROR_BUILD";
    case FCL_ERROR_OUT_OF_RESOURCES: return "FCL_ERROR_OUT_OF_RESOURCES";
    case FCL_ERROR_CLBLAST: return "FCL_ERROR_CLBLAST";
  }
  return "unknown fcl_status";
}

const char *fcl_last_error(void) { return last_error; }

void fcl_clear_error(void) { last_error[0] = '\0'; }

unsigned long fcl_failure_count(void) { return failures; }

fcl_status fcl_fail(fcl_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  ++failures;
  return status;
}

const char *fcl_cl_error_name(cl_int code) {
  switch (code) {
#define NAME(c) case c: return #c;
    NAME(CL_SUCCESS) NAME(CL_DEVICE_NOT_FOUND) NAME(CL_DEVICE_NOT_AVAILABLE)
    NAME(CL_COMPILER_NOT_AVAILABLE) NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE) NAME(CL_OUT_OF_RESOURCES)
    NAME(CL_OUT_OF_HOST_MEMORY) NAME(CL_PROFILING_INFO_NOT_AVAILABLE) NAME(CL_MEM_COPY_OVERLAP)
    NAME(CL_IMAGE_FORMAT_MISMATCH) NAME(CL_IMAGE_FORMAT_NOT_SUPPORTED) NAME(CL_BUILD_PROGRAM_FAILURE)
    NAME(CL_MAP_FAILURE) NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) NAME(CL_COMPILE_PROGRAM_FAILURE)
    NAME(CL_LINKER_NOT_AVAILABLE) NAME(CL_LINK_PROGRAM_FAILURE) NAME(CL_DEVICE_PARTITION_FAILED)
    NAME(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) NAME(CL_INVALID_VALUE) NAME(CL_INVALID_DEVICE_TYPE)
    NAME(CL_INVALID_PLATFORM) NAME(CL_INVALID_DEVICE) NAME(CL_INVALID_CONTEXT)
    NAME(CL_INVALID_QUEUE_PROPERTIES) NAME(CL_INVALID_COMMAND_QUEUE) NAME(CL_INVALID_HOST_PTR)
    NAME(CL_INVALID_MEM_OBJECT) NAME(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) NAME(CL_INVALID_IMAGE_SIZE)
    NAME(CL_INVALID_SAMPLER) NAME(CL_INVALID_BINARY) NAME(CL_INVALID_BUILD_OPTIONS)
    NAME(CL_INVALID_PROGRAM) NAME(CL_INVALID_PROGRAM_EXECUTABLE) NAME(CL_INVALID_KERNEL_NAME)
    NAME(CL_INVALID_KERNEL_DEFINITION) NAME(CL_INVALID_KERNEL) NAME(CL_INVALID_ARG_INDEX)
    NAME(CL_INVALID_ARG_VALUE) NAME(CL_INVALID_ARG_SIZE) NAME(CL_INVALID_KERNEL_ARGS)
    NAME(CL_INVALID_WORK_DIMENSION) NAME(CL_INVALID_WORK_GROUP_SIZE) NAME(CL_INVALID_WORK_ITEM_SIZE)
    NAME(CL_INVALID_GLOBAL_OFFSET) NAME(CL_INVALID_EVENT_WAIT_LIST) NAME(CL_INVALID_EVENT)
    NAME(CL_INVALID_OPERATION) NAME(CL_INVALID_GL_OBJECT) NAME(CL_INVALID_BUFFER_SIZE)
    NAME(CL_INVALID_MIP_LEVEL) NAME(CL_INVALID_GLOBAL_WORK_SIZE) NAME(CL_INVALID_PROPERTY)
    NAME(CL_INVALID_IMAGE_DESCRIPTOR) NAME(CL_INVALID_COMPILER_OPTIONS) NAME(CL_INVALID_LINKER_OPTIONS)
    NAME(CL_INVALID_DEVICE_PARTITION_COUNT)
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
#undef NAME
    default: return "unknown OpenCL error";
  }
}

fcl_status fcl_cl_failure(const char *call_text, cl_int code) {
  fcl_status status = (code == CL_MEM_OBJECT_ALLOCATION_FAILURE || code == CL_OUT_OF_RESOURCES ||
                       code == CL_OUT_OF_HOST_MEMORY)
                          ? FCL_ERROR_OUT_OF_RESOURCES
                          : FCL_ERROR_OPENCL;
  /* Keep only the function name of the call text: "clFoo(a, b)" -> "clFoo". */
  size_t n = strcspn(call_text, "(");
  return fcl_fail(status, "%.*s failed: %s (%d)", (int)n, call_text, fcl_cl_error_name(code), (int)code);
}
