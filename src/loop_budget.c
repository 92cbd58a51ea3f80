/* The device's per-work-item loop budget, measured once (fcl_measure_device_quirks).
 *
 * Some code generators give each work-item one budget of loop iterations for a whole kernel launch, shared by
 * every loop in the kernel, and silently end all loops once it is spent: llvmpipe (Mesa's gallivm,
 * LP_MAX_TGSI_LOOP_ITERATIONS = 65 535) does, under rusticl and Clover. A kernel then returns wrong results
 * with no error. The library measures the budget with cl/loop_budget.cl (one work-item, a loop of
 * LOOP_PROBE_N iterations; a count below that is the budget) and the planner keeps every launch inside it
 * (loop_bounds.c). The same launch tells whether the profiling clock works (fcl_profiling_time_unusable:
 * rusticl on llvmpipe reports 0, 1, 2, 3 ns as a command's queued, submit, start and end times).
 *
 * The result is a property of the driver, not of the device's name: it is kept in the context and, with a disk
 * cache, in an entry of the binary cache's format keyed by the device identity and library version (as for
 * binaries: fcl_cache_key_compute), the probe's source and the probe's format, so another driver version
 * measures again. FLASHCL_LOOP_BUDGET=N (development) forces the budget without measuring: 0 is "no limit".
 * A probe that cannot run leaves "no limit" and says why in the detail; the context is still created.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOOP_PROBE_N (1 << 20) /* iterations the probe asks for: a budget at or above this is not seen */
#define LOOP_PROBE_FORMAT 2    /* of the record's key options and payload */
#define LOOP_PROBE_PAYLOAD_MAX 256

static const char *probe_source(void) {
  for (int i = 0; i < fcl_embedded_source_count; ++i)
    if (strcmp(fcl_embedded_sources[i].name, "loop_budget.cl") == 0) return fcl_embedded_sources[i].text;
  return NULL;
}

static void record_key(const fcl_device_caps *caps, fcl_cache_key *key) {
  const char *src = probe_source();
  char options[96];
  snprintf(options, sizeof options, "flashcl loop budget %d; n %d", LOOP_PROBE_FORMAT, LOOP_PROBE_N);
  fcl_cache_key_compute(caps, src ? src : "loop_budget.cl (source unavailable)", options, key);
}

char *fcl_loop_budget_file_path(const fcl_device_caps *caps, const char *dir) {
  if (!caps || !dir) return NULL;
  fcl_cache_key key;
  record_key(caps, &key);
  char hex[2 * FCL_CACHE_KEY_SIZE + 1];
  fcl_cache_key_hex(&key, hex);
  const size_t n = strlen(dir) + sizeof hex + 8;
  char *path = malloc(n);
  if (path) snprintf(path, n, "%s/%s.bin", dir, hex);
  return path;
}

/* 0 when the payload is a record of this format: *budget (0: none found) and *clock (1 unusable, 0 works). */
static int parse_record(const unsigned char *data, size_t size, unsigned long long *budget, int *clock) {
  char text[LOOP_PROBE_PAYLOAD_MAX + 1];
  if (size == 0 || size > LOOP_PROBE_PAYLOAD_MAX) return -1;
  memcpy(text, data, size);
  text[size] = '\0';
  int format = 0, n = 0;
  if (sscanf(text, "flashcl loop budget %d n %d budget %llu clock_unusable %d", &format, &n, budget, clock) != 4)
    return -1;
  return format == LOOP_PROBE_FORMAT && n == LOOP_PROBE_N && *budget < (unsigned long long)LOOP_PROBE_N &&
                 (*clock == 0 || *clock == 1)
             ? 0
             : -1;
}

static double wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

int fcl_profiling_time_unusable(cl_ulong start, cl_ulong end, double wall) {
  return start == 0 || end <= start || (double)(end - start) * 1000.0 < wall;
}

fcl_status fcl_run_loop_probe(cl_context context, cl_device_id device, int n, int *count, int *clock_unusable) {
  const char *src = probe_source();
  if (!src) return fcl_fail(FCL_ERROR_BUILD, "the loop budget probe's source is not embedded in the library");
  cl_int err;
  cl_program program = NULL;
  cl_kernel kernel = NULL;
  cl_command_queue queue = NULL;
  cl_mem one = NULL, out = NULL;
  cl_event ev = NULL;
  const cl_int ones[2] = {1, 1};
  cl_int result = -1;
  fcl_status st = FCL_SUCCESS;
#define PROBE_STEP(call, text)                                 \
  do {                                                         \
    if (!st && (err = (call)) != CL_SUCCESS) st = fcl_cl_failure(text, err); \
  } while (0)
  program = clCreateProgramWithSource(context, 1, &src, NULL, &err);
  if (err != CL_SUCCESS) st = fcl_cl_failure("clCreateProgramWithSource(loop_budget.cl)", err);
  PROBE_STEP(clBuildProgram(program, 1, &device, "", NULL, NULL), "clBuildProgram(loop_budget.cl)");
  if (!st) {
    kernel = clCreateKernel(program, "fcl_loop_budget", &err);
    if (err != CL_SUCCESS) st = fcl_cl_failure("clCreateKernel(fcl_loop_budget)", err);
  }
  if (!st) {
    queue = clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) st = fcl_cl_failure("clCreateCommandQueue", err);
  }
  if (!st) {
    one = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ones, (void *)ones, &err);
    if (err != CL_SUCCESS) st = fcl_cl_failure("clCreateBuffer", err);
  }
  if (!st) {
    out = clCreateBuffer(context, CL_MEM_WRITE_ONLY, sizeof result, NULL, &err);
    if (err != CL_SUCCESS) st = fcl_cl_failure("clCreateBuffer", err);
  }
  const size_t global = 1;
  PROBE_STEP(clSetKernelArg(kernel, 0, sizeof one, &one), "clSetKernelArg");
  PROBE_STEP(clSetKernelArg(kernel, 1, sizeof n, &n), "clSetKernelArg");
  PROBE_STEP(clSetKernelArg(kernel, 2, sizeof out, &out), "clSetKernelArg");
  const double t0 = wall_ns();
  PROBE_STEP(clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, &global, 0, NULL, &ev),
             "clEnqueueNDRangeKernel(fcl_loop_budget)");
  PROBE_STEP(clEnqueueReadBuffer(queue, out, CL_TRUE, 0, sizeof result, &result, 0, NULL, NULL),
             "clEnqueueReadBuffer");
  const double wall = wall_ns() - t0;
#undef PROBE_STEP
  /* A clock that cannot be read times nothing either: counted as zero. */
  cl_ulong start = 0, end = 0;
  if (!st && (clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) != CL_SUCCESS ||
              clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) != CL_SUCCESS))
    start = end = 0;
  if (!st && (result < 0 || result > n))
    st = fcl_fail(FCL_ERROR_OPENCL, "the loop budget probe counted %d of %d iterations", (int)result, n);
  if (!st) {
    *count = result;
    *clock_unusable = fcl_profiling_time_unusable(start, end, wall);
  }
  if (ev) clReleaseEvent(ev);
  if (out) clReleaseMemObject(out);
  if (one) clReleaseMemObject(one);
  if (queue) clReleaseCommandQueue(queue);
  if (kernel) clReleaseKernel(kernel);
  if (program) clReleaseProgram(program);
  return st;
}

void fcl_measure_device_quirks(cl_context context, cl_device_id device, const char *cache_dir, fcl_device_caps *caps) {
  caps->loop_budget = 0;
  caps->profiling_clock_unusable = -1;
  const char *forced = getenv("FLASHCL_LOOP_BUDGET");
  if (forced && *forced) {
    char *end;
    const unsigned long long v = strtoull(forced, &end, 10);
    if (*end == '\0' && forced[0] != '-') {
      caps->loop_budget = v;
      caps->loop_budget_source = FCL_QUIRK_FORCED;
      snprintf(caps->quirk_detail, sizeof caps->quirk_detail, "FLASHCL_LOOP_BUDGET=%s (development override)", forced);
      return;
    }
  }
  fcl_cache_key key;
  record_key(caps, &key);
  if (cache_dir) {
    size_t size = 0;
    unsigned char *data = fcl_cache_read_entry(cache_dir, &key, FCL_LOOP_BUDGET_ENTRY_NAME, "", &size);
    unsigned long long budget = 0;
    int clock = 0;
    const int found = data && parse_record(data, size, &budget, &clock) == 0;
    free(data);
    if (found) {
      caps->loop_budget = budget;
      caps->profiling_clock_unusable = clock;
      caps->loop_budget_source = FCL_QUIRK_CACHED;
      snprintf(caps->quirk_detail, sizeof caps->quirk_detail, "measured earlier, read from the cache directory");
      return;
    }
  }
  int count = 0, clock = 0;
  if (fcl_run_loop_probe(context, device, LOOP_PROBE_N, &count, &clock) != FCL_SUCCESS) {
    caps->loop_budget_source = FCL_QUIRK_UNKNOWN;
    snprintf(caps->quirk_detail, sizeof caps->quirk_detail, "the probe failed: %s", fcl_last_error());
    fcl_clear_error();
    return;
  }
  caps->loop_budget = count < LOOP_PROBE_N ? (unsigned long long)count : 0;
  caps->profiling_clock_unusable = clock;
  caps->loop_budget_source = FCL_QUIRK_MEASURED;
  snprintf(caps->quirk_detail, sizeof caps->quirk_detail, "measured: a loop of %d iterations completed %d", LOOP_PROBE_N,
           count);
  if (cache_dir) {
    char payload[LOOP_PROBE_PAYLOAD_MAX];
    const int n = snprintf(payload, sizeof payload, "flashcl loop budget %d\nn %d\nbudget %llu\nclock_unusable %d\n",
                           LOOP_PROBE_FORMAT, LOOP_PROBE_N, (unsigned long long)caps->loop_budget, clock);
    unsigned char tag[FCL_CACHE_TAG_SIZE];
    fcl_cache_device_tag(caps, tag);
    if (n > 0 && n < (int)sizeof payload)
      fcl_cache_write_entry(cache_dir, &key, tag, FCL_LOOP_BUDGET_ENTRY_NAME, "", payload, (size_t)n);
  }
}

fcl_status fcl_context_device_quirks(fcl_context *ctx, fcl_device_quirks *out) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  if (!out) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  memset(out, 0, sizeof *out);
  out->loop_budget = ctx->caps.loop_budget;
  out->profiling_clock_unusable = ctx->caps.profiling_clock_unusable;
  out->source = (fcl_quirk_source)ctx->caps.loop_budget_source;
  snprintf(out->detail, sizeof out->detail, "%s", ctx->caps.quirk_detail);
  return FCL_SUCCESS;
}
