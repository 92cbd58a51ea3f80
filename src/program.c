/* Kernel variants built from the embedded .cl sources with -D defines, kept per context. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fcl_program_entry {
  char *key; /* kernel name, files and full build options */
  cl_program program;
  cl_kernel kernel;
  fcl_program_entry *next;
};

static char *read_text_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *text = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1))) {
      if (fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
      } else {
        text[n] = '\0';
      }
    }
  }
  fclose(f);
  return text;
}

/* The text of one .cl file: from $FLASHCL_KERNEL_DIR when set (development), else the embedded copy. */
static fcl_status source_text(const char *file, char **out) {
  const char *dir = getenv("FLASHCL_KERNEL_DIR");
  if (dir && *dir) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *path = malloc(n);
    if (!path) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
    snprintf(path, n, "%s/%s", dir, file);
    *out = read_text_file(path);
    if (!*out) {
      fcl_status st = fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "FLASHCL_KERNEL_DIR is set but %s cannot be read", path);
      free(path);
      return st;
    }
    free(path);
    return FCL_SUCCESS;
  }
  for (int i = 0; i < fcl_embedded_source_count; ++i) {
    if (strcmp(fcl_embedded_sources[i].name, file) == 0) {
      *out = strdup(fcl_embedded_sources[i].text);
      return *out ? FCL_SUCCESS : fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
    }
  }
  return fcl_fail(FCL_ERROR_BUILD, "no embedded kernel source named %s", file);
}

/* Concatenates the files, each preceded by a #line directive so build logs name the right file. */
static fcl_status program_source(const char *const *files, int num_files, char **out) {
  size_t cap = 1, len = 0;
  char *text = malloc(cap);
  if (!text) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  text[0] = '\0';
  for (int i = 0; i < num_files; ++i) {
    char *part = NULL;
    fcl_status st = source_text(files[i], &part);
    if (st) {
      free(text);
      return st;
    }
    char header[300];
    int hn = snprintf(header, sizeof header, "#line 1 \"%s\"\n", files[i]);
    size_t pn = strlen(part);
    char *grown = realloc(text, cap = len + (size_t)hn + pn + 2);
    if (!grown) {
      free(part);
      free(text);
      return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
    }
    text = grown;
    memcpy(text + len, header, (size_t)hn);
    memcpy(text + len + hn, part, pn);
    len += (size_t)hn + pn;
    text[len++] = '\n';
    text[len] = '\0';
    free(part);
  }
  *out = text;
  return FCL_SUCCESS;
}

static fcl_status build_log_failure(fcl_context *ctx, cl_program program, const char *options) {
  size_t n = 0;
  char *log = NULL;
  if (clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) == CL_SUCCESS &&
      (log = malloc(n + 1))) {
    if (clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
      log[n] = '\0';
    } else { /* a log that could not be read is no log */
      free(log);
      log = NULL;
    }
  }
  fcl_status st = fcl_fail(FCL_ERROR_BUILD, "kernel build failed (options: %s):\n%s", options, log ? log : "(no build log)");
  free(log);
  return st;
}

/* Loads from the disk cache, else builds, the program for source + options and creates its kernel `name`.
   A cached program that fails after loading is a miss (fcl_cache_load): built from source and rewritten. */
static fcl_status build_program(fcl_context *ctx, const char *source, const char *options, const char *name,
                                cl_program *out, cl_kernel *kernel) {
  cl_int err;
  fcl_cache_key cache_key;
  if ((*out = fcl_cache_load(ctx, source, options, name, &cache_key, kernel))) return FCL_SUCCESS;
  cl_program program = clCreateProgramWithSource(ctx->context, 1, &source, NULL, &err);
  if (err != CL_SUCCESS) return fcl_cl_failure("clCreateProgramWithSource", err);
  err = clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    fcl_status st = err == CL_BUILD_PROGRAM_FAILURE || err == CL_INVALID_BUILD_OPTIONS
                        ? build_log_failure(ctx, program, options)
                        : fcl_cl_failure("clBuildProgram", err);
    clReleaseProgram(program);
    return st;
  }
  *kernel = clCreateKernel(program, name, &err);
  if (err != CL_SUCCESS) {
    clReleaseProgram(program);
    return fcl_cl_failure("clCreateKernel", err);
  }
  fcl_cache_store(ctx, &cache_key, name, options, program);
  *out = program;
  return FCL_SUCCESS;
}

static fcl_program_entry *find_entry(fcl_context *ctx, const char *key) {
  for (fcl_program_entry *e = ctx->programs; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

fcl_status fcl_get_kernel(fcl_context *ctx, const char *const *files, int num_files, const char *name,
                          const char *defines, cl_kernel *out) {
  char *options = NULL, *key = NULL, *source = NULL;
  fcl_status st = FCL_SUCCESS;
  size_t on = strlen(defines) + strlen(ctx->build_options) + 32;
  if (!(options = malloc(on))) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  snprintf(options, on, "-cl-std=CL1.2 %s %s", defines, ctx->build_options);
  size_t kn = strlen(name) + strlen(options) + 2;
  for (int i = 0; i < num_files; ++i) kn += strlen(files[i]) + 1;
  if (!(key = malloc(kn))) {
    free(options);
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  }
  strcpy(key, name);
  for (int i = 0; i < num_files; ++i) strcat(strcat(key, "|"), files[i]);
  strcat(strcat(key, "|"), options);

  /* The caller holds ctx->lock. */
  fcl_program_entry *found = find_entry(ctx, key);
  if (found) {
    fcl_cache_note_memory_hit(ctx);
    *out = found->kernel;
    goto done;
  }
  /* A build takes seconds: other threads' calls on the context go on meanwhile. */
  cl_program program = NULL;
  cl_kernel kernel = NULL;
  pthread_mutex_unlock(&ctx->lock);
  st = program_source(files, num_files, &source);
  if (!st) st = build_program(ctx, source, options, name, &program, &kernel);
  pthread_mutex_lock(&ctx->lock);
  if (st) goto done;
  /* Another thread may have built the same kernel meanwhile: keep the first. */
  if ((found = find_entry(ctx, key))) {
    clReleaseKernel(kernel);
    clReleaseProgram(program);
    *out = found->kernel;
    goto done;
  }
  fcl_program_entry *e = calloc(1, sizeof *e);
  if (!e) {
    clReleaseKernel(kernel);
    clReleaseProgram(program);
    st = fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
    goto done;
  }
  e->key = key;
  key = NULL;
  e->program = program;
  e->kernel = kernel;
  e->next = ctx->programs;
  ctx->programs = e;
  *out = kernel;
done:
  free(options);
  free(key);
  free(source);
  return st;
}

fcl_status fcl_get_kernel_wg(fcl_context *ctx, const char *const *files, int num_files, const char *name,
                             const char *defines, size_t max_wg, cl_kernel *out, size_t *wg) {
  size_t n = max_wg;
  while (n > fcl_work_group_limit(&ctx->caps, 0) && n > 1) n /= 2;
  char *all = malloc(strlen(defines) + 32);
  if (!all) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
  fcl_status st;
  for (;;) {
    sprintf(all, "%s -DWG=%zu", defines, n);
    if ((st = fcl_get_kernel(ctx, files, num_files, name, all, out))) break;
    size_t limit = 0;
    const cl_int err = clGetKernelWorkGroupInfo(*out, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof limit, &limit, NULL);
    if (err != CL_SUCCESS) {
      st = fcl_cl_failure("clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)", err);
      break;
    }
    if (n <= limit) {
      *wg = n;
      break;
    }
    if (n == 1) {
      st = fcl_fail(FCL_ERROR_UNSUPPORTED, "the kernel %s admits no work-group on %s", name, ctx->caps.device_name);
      break;
    }
    n /= 2;
  }
  free(all);
  return st;
}

void fcl_release_programs(fcl_context *ctx) {
  fcl_program_entry *e = ctx->programs;
  while (e) {
    fcl_program_entry *next = e->next;
    clReleaseKernel(e->kernel);
    clReleaseProgram(e->program);
    free(e->key);
    free(e);
    e = next;
  }
  ctx->programs = NULL;
}
