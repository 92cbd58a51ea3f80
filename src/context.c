/* fcl_context: the caller's device, its capabilities, the kernel map and the lock that guards it. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The disk cache directory by the documented precedence; NULL when turned off or unknown. */
static char *resolve_cache_dir(const fcl_context_options *options) {
  if (options && options->cache_dir) return options->cache_dir[0] ? strdup(options->cache_dir) : NULL;
  const char *env = getenv("FLASHCL_CACHE_DIR");
  if (env) return env[0] ? strdup(env) : NULL;
  const char *base = getenv("XDG_CACHE_HOME");
  const char *suffix = "/flashcl";
  if (!base || !base[0]) {
    base = getenv("HOME");
    suffix = "/.cache/flashcl";
  }
  if (!base || !base[0]) return NULL;
  size_t n = strlen(base) + strlen(suffix) + 1;
  char *dir = malloc(n);
  if (dir) snprintf(dir, n, "%s%s", base, suffix);
  return dir;
}

static fcl_status device_in_context(cl_context context, cl_device_id device) {
  size_t n = 0;
  cl_int err = clGetContextInfo(context, CL_CONTEXT_DEVICES, 0, NULL, &n);
  if (err != CL_SUCCESS)
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "context is not a valid cl_context: %s (%d)", fcl_cl_error_name(err), (int)err);
  cl_device_id *devices = malloc(n ? n : 1);
  if (!devices) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  err = clGetContextInfo(context, CL_CONTEXT_DEVICES, n, devices, NULL);
  int found = 0;
  for (size_t i = 0; err == CL_SUCCESS && i < n / sizeof *devices; ++i) found |= devices[i] == device;
  free(devices);
  if (err != CL_SUCCESS) return fcl_cl_failure("clGetContextInfo(CL_CONTEXT_DEVICES)", err);
  if (!found) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "device is not one of context's devices");
  return FCL_SUCCESS;
}

fcl_status fcl_context_create(cl_context context, cl_device_id device, const fcl_context_options *options,
                              fcl_context **out) {
  if (!out) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  *out = NULL;
  if (!context) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "context is NULL");
  if (!device) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "device is NULL");
  fcl_status st = device_in_context(context, device);
  if (st) return st;

  fcl_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  if ((st = fcl_probe_device(device, &ctx->caps))) {
    free(ctx);
    return st;
  }
  fcl_read_plan_overrides(&ctx->overrides);
  ctx->build_options = strdup(options && options->build_options ? options->build_options : "");
  ctx->cache_dir = resolve_cache_dir(options);
  if (ctx->cache_dir && fcl_cache_dir_check(ctx->cache_dir, ctx->cache_refused, sizeof ctx->cache_refused) != 0) {
    free(ctx->cache_dir);
    ctx->cache_dir = NULL;
  }
  /* Only the public flags: bits the header does not define are ignored, as they always were (the planners
     take internal bits such as FCL_PLAN_RULE in the same word). */
  ctx->flags = options ? options->flags & FCL_FLAG_PORTABLE_ONLY : 0;
  const char *portable = getenv("FLASHCL_PORTABLE_ONLY");
  if (portable && portable[0] && strcmp(portable, "0") != 0) ctx->flags |= FCL_FLAG_PORTABLE_ONLY;
  int locks = 0;
  if (ctx->build_options && pthread_mutex_init(&ctx->lock, NULL) == 0 && ++locks &&
      pthread_mutex_init(&ctx->stats_lock, NULL) == 0)
    ++locks;
  if (locks < 2) {
    if (locks) pthread_mutex_destroy(&ctx->lock);
    free(ctx->build_options);
    free(ctx->cache_dir);
    free(ctx);
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  }
  cl_int err = clRetainContext(context);
  if (err == CL_SUCCESS && (err = clRetainDevice(device)) != CL_SUCCESS) clReleaseContext(context);
  if (err != CL_SUCCESS) {
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->stats_lock);
    free(ctx->build_options);
    free(ctx->cache_dir);
    free(ctx);
    return fcl_cl_failure("clRetainContext/clRetainDevice", err);
  }
  ctx->context = context;
  ctx->device = device;
  fcl_measure_device_quirks(context, device, ctx->cache_dir, &ctx->caps);
  *out = ctx;
  return FCL_SUCCESS;
}

void fcl_context_release(fcl_context *ctx) {
  if (!ctx) return;
  fcl_release_programs(ctx);
  fcl_scratch_release_all(ctx);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->stats_lock);
  clReleaseDevice(ctx->device);
  clReleaseContext(ctx->context);
  free(ctx->build_options);
  free(ctx->cache_dir);
  free(ctx);
}
