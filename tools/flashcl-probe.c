/* flashcl-probe: what flashcl sees on this machine and what it would run.
 *
 * Lists every OpenCL platform and device with the facts the library uses, the forward plan for each head_dim
 * and dtype on the selected device, the on-disk kernel cache, a self-test of every implemented operation
 * against a float64 host reference, and a quick timed forward. A query that fails is shown in place and the
 * run goes on. Usage: flashcl-probe --help.
 */
#include "backward_check.h"
#include "forward_check.h"
#include "test_util.h"

#include <flashcl.h>

#include <CL/cl_ext.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cl_vendor.h"
#include "internal.h"

#define MAX_DEVICES 64

static const int head_dims[] = {32, 64, 80, 96, 128, 256};
static const fcl_dtype dtypes[] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};

/* ---- output: the same records printed for people or as JSON ---- */

static int json;

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p == '\t') fputs("\\t", f);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

/* One labelled value. kind: string, a JSON number (text already formatted), a boolean, or a failed query. */
enum { V_STRING, V_NUMBER, V_BOOL, V_ERROR };
typedef struct field {
  const char *key, *label;
  int kind;
  char text[1024];  /* the value as people read it (V_ERROR: the error) */
  char number[64];  /* V_NUMBER: the JSON number; V_BOOL: "true"/"false" */
} field;

typedef struct record {
  field f[48];
  int n;
} record;

static field *add(record *r, const char *key, const char *label) {
  field *f = &r->f[r->n < 48 ? r->n++ : 47];
  memset(f, 0, sizeof *f);
  f->key = key;
  f->label = label;
  return f;
}

static void add_text(record *r, const char *key, const char *label, int kind, const char *fmt, va_list ap) {
  field *f = add(r, key, label);
  vsnprintf(f->text, sizeof f->text, fmt, ap);
  f->kind = kind;
}

static void add_string(record *r, const char *key, const char *label, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_text(r, key, label, V_STRING, fmt, ap);
  va_end(ap);
}

static void add_number(record *r, const char *key, const char *label, unsigned long long v, const char *human) {
  field *f = add(r, key, label);
  f->kind = V_NUMBER;
  snprintf(f->number, sizeof f->number, "%llu", v);
  if (human) snprintf(f->text, sizeof f->text, "%.200s", human);
  else snprintf(f->text, sizeof f->text, "%llu", v);
}

static void add_bool(record *r, const char *key, const char *label, int v, const char *detail) {
  field *f = add(r, key, label);
  f->kind = V_BOOL;
  snprintf(f->number, sizeof f->number, "%s", v ? "true" : "false");
  snprintf(f->text, sizeof f->text, "%s%s%s", v ? "yes" : "no", detail && *detail ? ", " : "", detail ? detail : "");
}

static void add_error(record *r, const char *key, const char *label, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_text(r, key, label, V_ERROR, fmt, ap);
  va_end(ap);
}

static void print_record(const record *r, const char *indent) {
  for (int i = 0; i < r->n; ++i) {
    const field *f = &r->f[i];
    if (f->kind == V_ERROR) printf("%s%-30s (query failed: %s)\n", indent, f->label, f->text);
    else printf("%s%-30s %s\n", indent, f->label, f->text);
  }
}

static void json_record(const record *r, const char *indent) {
  printf("{");
  for (int i = 0; i < r->n; ++i) {
    const field *f = &r->f[i];
    printf("%s\n%s  ", i ? "," : "", indent);
    json_string(stdout, f->key);
    printf(": ");
    if (f->kind == V_STRING) json_string(stdout, f->text);
    else if (f->kind == V_NUMBER || f->kind == V_BOOL) printf("%s", f->number);
    else {
      printf("{\"error\": ");
      json_string(stdout, f->text);
      printf("}");
    }
  }
  printf("\n%s}", indent);
}

static void human(const char *fmt, ...) {
  if (json) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
}

static void format_bytes(unsigned long long v, char *out, size_t size) {
  if (v >= (1ull << 30) && v % (1ull << 20) == 0) snprintf(out, size, "%.1f GiB (%llu B)", v / 1073741824.0, v);
  else if (v >= (1ull << 20)) snprintf(out, size, "%.1f MiB (%llu B)", v / 1048576.0, v);
  else if (v >= 1024) snprintf(out, size, "%.1f KiB (%llu B)", v / 1024.0, v);
  else snprintf(out, size, "%llu B", v);
}

/* ---- device queries, each shown in place when it fails ---- */

typedef struct device_ref {
  cl_platform_id platform;
  cl_device_id device;
  int platform_index;
  cl_device_type type;
  char name[256];
} device_ref;

static int dev_string(record *r, cl_device_id d, cl_device_info what, const char *key, const char *label, char *out,
                      size_t size) {
  char buf[1024] = "";
  cl_int e = clGetDeviceInfo(d, what, sizeof buf, buf, NULL);
  buf[sizeof buf - 1] = '\0';
  if (out) snprintf(out, size, "%s", e == CL_SUCCESS ? buf : "");
  if (e != CL_SUCCESS) {
    if (r) add_error(r, key, label, "%s (%d)", fcl_cl_error_name(e), (int)e);
    return -1;
  }
  if (r) add_string(r, key, label, "%s", buf);
  return 0;
}

/* Reads a scalar of `size` bytes (cl_uint, cl_ulong, size_t, cl_bool...) as an unsigned long long. */
static int dev_scalar(cl_device_id d, cl_device_info what, size_t size, unsigned long long *v, cl_int *err) {
  unsigned char buf[8] = {0};
  *err = clGetDeviceInfo(d, what, size, buf, NULL);
  if (*err != CL_SUCCESS) return -1;
  if (size == 4) {
    uint32_t x;
    memcpy(&x, buf, 4);
    *v = x;
  } else {
    uint64_t x;
    memcpy(&x, buf, 8);
    *v = x;
  }
  return 0;
}

static void dev_number(record *r, cl_device_id d, cl_device_info what, size_t size, const char *key,
                       const char *label, int bytes) {
  unsigned long long v;
  cl_int e;
  if (dev_scalar(d, what, size, &v, &e) != 0) {
    add_error(r, key, label, "%s (%d)", fcl_cl_error_name(e), (int)e);
    return;
  }
  char text[96];
  if (bytes) format_bytes(v, text, sizeof text);
  else snprintf(text, sizeof text, "%llu", v);
  add_number(r, key, label, v, text);
}

/* CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE of a small kernel built for the device. */
static void preferred_multiple(record *r, cl_device_id d) {
  static const char *src =
      "__kernel void probe(__global float *x, __local float *t) {\n"
      "  size_t i = get_global_id(0), l = get_local_id(0);\n"
      "  t[l] = x[i]; barrier(CLK_LOCAL_MEM_FENCE); x[i] = t[get_local_size(0) - 1 - l] * 2.0f;\n"
      "}\n";
  cl_int e;
  const char *where = "clCreateContext";
  cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  cl_program p = NULL;
  cl_kernel k = NULL;
  size_t m = 0;
  if (e == CL_SUCCESS) {
    where = "clCreateProgramWithSource";
    p = clCreateProgramWithSource(c, 1, &src, NULL, &e);
  }
  if (e == CL_SUCCESS) {
    where = "clBuildProgram";
    e = clBuildProgram(p, 1, &d, "", NULL, NULL);
  }
  if (e == CL_SUCCESS) {
    where = "clCreateKernel";
    k = clCreateKernel(p, "probe", &e);
  }
  if (e == CL_SUCCESS) {
    where = "clGetKernelWorkGroupInfo";
    e = clGetKernelWorkGroupInfo(k, d, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof m, &m, NULL);
  }
  if (e == CL_SUCCESS)
    add_number(r, "preferred_work_group_multiple", "preferred work-group multiple", m, NULL);
  else
    add_error(r, "preferred_work_group_multiple", "preferred work-group multiple", "%s: %s (%d)", where,
              fcl_cl_error_name(e), (int)e);
  if (k) clReleaseKernel(k);
  if (p) clReleaseProgram(p);
  if (c) clReleaseContext(c);
}

static void describe_device(record *r, const device_ref *ref, char *ext, size_t ext_size) {
  cl_device_id d = ref->device;
  char type[64] = "";
  if (ref->type & CL_DEVICE_TYPE_GPU) strcat(type, "GPU ");
  if (ref->type & CL_DEVICE_TYPE_CPU) strcat(type, "CPU ");
  if (ref->type & CL_DEVICE_TYPE_ACCELERATOR) strcat(type, "accelerator ");
  if (!type[0]) strcat(type, "other ");
  type[strlen(type) - 1] = '\0';
  add_string(r, "name", "name", "%s", ref->name);
  add_string(r, "type", "type", "%s", type);
  dev_string(r, d, CL_DEVICE_VENDOR, "vendor", "vendor", NULL, 0);
  dev_string(r, d, CL_DEVICE_VERSION, "opencl_version", "OpenCL version", NULL, 0);
  dev_string(r, d, CL_DEVICE_OPENCL_C_VERSION, "opencl_c_version", "OpenCL C version", NULL, 0);
  dev_string(r, d, CL_DRIVER_VERSION, "driver_version", "driver version", NULL, 0);
  dev_number(r, d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cl_uint), "compute_units", "compute units", 0);
  dev_number(r, d, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof(cl_uint), "max_clock_mhz", "max clock (MHz)", 0);
  dev_number(r, d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(cl_ulong), "global_mem_bytes", "global memory", 1);
  dev_number(r, d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(cl_ulong), "max_alloc_bytes", "max allocation", 1);
  dev_number(r, d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(cl_ulong), "local_mem_bytes", "local memory", 1);
  {
    cl_device_local_mem_type t;
    cl_int e = clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_TYPE, sizeof t, &t, NULL);
    if (e == CL_SUCCESS)
      add_string(r, "local_mem_type", "local memory type", "%s",
                 t == CL_LOCAL ? "local (on-chip)" : t == CL_GLOBAL ? "global (emulated in device memory)" : "none");
    else
      add_error(r, "local_mem_type", "local memory type", "%s (%d)", fcl_cl_error_name(e), (int)e);
  }
  dev_number(r, d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(size_t), "max_work_group_size", "max work-group size", 0);
  {
    size_t s[3] = {0, 0, 0};
    cl_int e = clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof s, s, NULL);
    if (e == CL_SUCCESS)
      add_string(r, "max_work_item_sizes", "max work-item sizes", "%zu x %zu x %zu", s[0], s[1], s[2]);
    else
      add_error(r, "max_work_item_sizes", "max work-item sizes", "%s (%d)", fcl_cl_error_name(e), (int)e);
  }
  preferred_multiple(r, d);

  ext[0] = '\0';
  size_t n = 0;
  cl_int e = clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, ext_size, ext, &n);
  ext[ext_size - 1] = '\0';
  if (e != CL_SUCCESS) {
    ext[0] = '\0';
    add_error(r, "extensions", "extensions", "%s (%d)", fcl_cl_error_name(e), (int)e);
  }
  /* Sub-groups: the extension, and the sizes where the driver says (Intel list, NVIDIA warp, AMD wavefront). */
  const int khr_sub = strstr(ext, "cl_khr_subgroups") != NULL, intel_sub = strstr(ext, "cl_intel_subgroups") != NULL;
  const int nv = strstr(ext, "cl_nv_device_attribute_query") != NULL;
  const int amd = strstr(ext, "cl_amd_device_attribute_query") != NULL;
  char sizes[160] = "";
  if (intel_sub || strstr(ext, "cl_intel_required_subgroup_size")) {
    size_t list[16];
    size_t bytes = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_SUB_GROUP_SIZES_INTEL, sizeof list, list, &bytes) == CL_SUCCESS) {
      strcat(sizes, "sizes");
      for (size_t i = 0; i < bytes / sizeof(size_t) && i < 16; ++i)
        snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), " %zu", list[i]);
    }
  }
  unsigned long long v;
  cl_int err;
  if (nv && dev_scalar(d, CL_DEVICE_WARP_SIZE_NV, sizeof(cl_uint), &v, &err) == 0)
    snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), "%swarp %llu", sizes[0] ? "; " : "", v);
  if (amd && dev_scalar(d, CL_DEVICE_WAVEFRONT_WIDTH_AMD, sizeof(cl_uint), &v, &err) == 0)
    snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), "%swavefront %llu", sizes[0] ? "; " : "", v);
  char sub_detail[256];
  snprintf(sub_detail, sizeof sub_detail, "%s%s%s%s%s", khr_sub ? "cl_khr_subgroups" : "",
           khr_sub && intel_sub ? " " : "", intel_sub ? "cl_intel_subgroups" : "",
           (khr_sub || intel_sub) && sizes[0] ? "; " : "", sizes);
  add_bool(r, "subgroups", "sub-groups", khr_sub || intel_sub, sub_detail);
  if (sizes[0]) add_string(r, "subgroup_sizes", "sub-group / SIMD width", "%s", sizes);
  add_bool(r, "fp16", "fp16 arithmetic (cl_khr_fp16)", strstr(ext, "cl_khr_fp16") != NULL, "f16/bf16 storage works either way");
  add_bool(r, "fp64", "fp64 (cl_khr_fp64)", strstr(ext, "cl_khr_fp64") != NULL, NULL);
  if (nv) {
    unsigned long long maj = 0, min = 0;
    cl_int e1, e2;
    if (dev_scalar(d, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof(cl_uint), &maj, &e1) == 0 &&
        dev_scalar(d, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof(cl_uint), &min, &e2) == 0)
      add_string(r, "nv_compute_capability", "NVIDIA compute capability", "%llu.%llu", maj, min);
    else
      add_error(r, "nv_compute_capability", "NVIDIA compute capability", "%s (%d)", fcl_cl_error_name(e1 ? e1 : e2),
                (int)(e1 ? e1 : e2));
  } else {
    add_string(r, "nv_compute_capability", "NVIDIA compute capability", "not reported");
  }
}

/* ---- device list and selection ---- */

static int list_devices(device_ref *refs, int max, cl_platform_id *platforms, cl_uint *num_platforms) {
  cl_uint np = 0;
  if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) np = 0;
  if (np > 16) np = 16;
  *num_platforms = np;
  int n = 0;
  for (cl_uint p = 0; p < np; ++p) {
    cl_device_id list[32];
    cl_uint nd = 0;
    if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 32, list, &nd) != CL_SUCCESS) nd = 0;
    if (nd > 32) nd = 32;
    for (cl_uint i = 0; i < nd && n < max; ++i, ++n) {
      refs[n].platform = platforms[p];
      refs[n].device = list[i];
      refs[n].platform_index = (int)p;
      refs[n].type = 0;
      clGetDeviceInfo(list[i], CL_DEVICE_TYPE, sizeof refs[n].type, &refs[n].type, NULL);
      refs[n].name[0] = '\0';
      clGetDeviceInfo(list[i], CL_DEVICE_NAME, sizeof refs[n].name, refs[n].name, NULL);
      refs[n].name[sizeof refs[n].name - 1] = '\0';
    }
  }
  return n;
}

static int select_device(const device_ref *refs, int n, const char *want) {
  if (want) {
    char *end;
    long i = strtol(want, &end, 10);
    if (*want && *end == '\0' && i >= 0 && i < n) return (int)i;
    /* Otherwise a name substring (which may be all digits, as in "4090"). */
    for (int k = 0; k < n; ++k)
      if (strstr(refs[k].name, want)) return k;
    return -1;
  }
  for (int k = 0; k < n; ++k)
    if (refs[k].type & CL_DEVICE_TYPE_GPU) return k;
  return n > 0 ? 0 : -1;
}

/* ---- plans ---- */

static void plan_desc(fcl_attention_desc *d, int64_t b, int64_t h, int64_t n, int64_t hd, fcl_dtype t) {
  memset(d, 0, sizeof *d);
  d->batch = b, d->num_heads = h, d->seqlen_q = n, d->seqlen_k = n, d->head_dim = hd, d->dtype = t;
}

/* The forward plan at a representative problem (B=1, H=8, N=1024). */
static void show_plans(fcl_context *fcl, int *first_json) {
  if (json) printf("%s\n  \"plans\": [", *first_json ? "" : ",");
  *first_json = 0;
  human("\nForward plans (fcl_describe_plan; B=1, H=8, N=1024; work-groups per call at that size):\n");
  human("  %-4s %-5s %-11s %-9s %-6s %-10s %-7s %s\n", "d", "dtype", "kernel", "Br x Bc", "wg", "local mem", "groups",
        "reason");
  int first = 1;
  for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; ++i)
    for (size_t t = 0; t < 3; ++t) {
      fcl_attention_desc d;
      plan_desc(&d, 1, 8, 1024, head_dims[i], dtypes[t]);
      fcl_plan_info info;
      fcl_status st = fcl_describe_plan(fcl, FCL_OP_FORWARD, &d, &info);
      if (json) {
        printf("%s\n    {\"head_dim\": %d, \"dtype\": \"%s\", ", first ? "" : ",", head_dims[i], dtype_name(dtypes[t]));
        if (st == FCL_SUCCESS) {
          printf("\"kernel\": ");
          json_string(stdout, info.kernel);
          printf(", \"block_q\": %d, \"block_k\": %d, \"work_group_size\": %d, \"local_mem_bytes\": %zu, "
                 "\"work_groups\": %zu, \"reason\": ",
                 info.block_q, info.block_k, info.work_group_size, info.local_mem_bytes, info.work_groups);
          json_string(stdout, info.reason);
        } else {
          printf("\"status\": \"%s\", \"error\": ", fcl_status_string(st));
          json_string(stdout, fcl_last_error());
        }
        printf("}");
      } else if (st == FCL_SUCCESS) {
        char tiles[32];
        snprintf(tiles, sizeof tiles, "%dx%d", info.block_q, info.block_k);
        printf("  %-4d %-5s %-11s %-9s %-6d %-10zu %-7zu %s\n", head_dims[i], dtype_name(dtypes[t]), info.kernel,
               tiles, info.work_group_size, info.local_mem_bytes, info.work_groups, info.reason);
      } else {
        /* One line per row: a build log's lines joined. */
        char msg[600];
        snprintf(msg, sizeof msg, "%s", fcl_last_error());
        for (char *c = msg; *c; ++c)
          if (*c == '\n') *c = ' ';
        printf("  %-4d %-5s (%s: %s)\n", head_dims[i], dtype_name(dtypes[t]), fcl_status_string(st), msg);
      }
      first = 0;
    }
  if (json) printf("\n  ]");
}

/* ---- cache ---- */

static void show_cache(fcl_context *fcl, const char *key, const char *title, int *first_json) {
  fcl_cache_stats st;
  fcl_status s = fcl_context_cache_stats(fcl, &st);
  record r = {.n = 0};
  if (s != FCL_SUCCESS) {
    add_error(&r, "stats", "cache statistics", "%s: %s", fcl_status_string(s), fcl_last_error());
  } else {
    if (st.cache_dir) add_string(&r, "directory", "directory", "%s", st.cache_dir);
    else if (st.cache_refused) add_string(&r, "directory", "directory", "(off: %s)", st.cache_refused);
    else add_string(&r, "directory", "directory", "(off: cache_dir \"\" or FLASHCL_CACHE_DIR=\"\", or no HOME)");
    char bytes[96];
    format_bytes(st.device_bytes, bytes, sizeof bytes);
    add_number(&r, "device_entries", "entries for this device", st.device_entries, NULL);
    add_number(&r, "device_bytes", "their size", st.device_bytes, bytes);
    add_number(&r, "memory_hits", "kernels from memory", st.memory_hits, NULL);
    add_number(&r, "disk_hits", "programs loaded from disk", st.disk_hits, NULL);
    add_number(&r, "source_builds", "programs built from source", st.source_builds, NULL);
    add_number(&r, "disk_rejected", "entries rejected (rebuilt)", st.disk_rejected, NULL);
    add_number(&r, "disk_writes", "entries written", st.disk_writes, NULL);
    add_number(&r, "disk_write_failures", "entries not written", st.disk_write_failures, NULL);
    const char *verdict = st.source_builds == 0 && st.disk_hits > 0 ? "hit: every program came from the disk cache"
                          : st.source_builds > 0 && st.disk_hits > 0 ? "mixed: some programs loaded, some built"
                          : st.source_builds > 0                     ? "built: programs compiled from source"
                                                                     : "nothing built or loaded yet";
    add_string(&r, "this_run", "this run", "%s", verdict);
  }
  if (json) {
    printf("%s\n  \"%s\": ", *first_json ? "" : ",", key);
    json_record(&r, "  ");
  } else {
    printf("\n%s:\n", title);
    print_record(&r, "  ");
  }
  *first_json = 0;
}

/* ---- self-test ---- */

typedef struct selftest_result {
  char name[160];
  int result; /* 0 pass, 1 fail, 2 unsupported (skipped) */
  char detail[4096];
} selftest_result;

/* Runs one case with its check lines captured (they go to the report, not to stdout). */
static int captured(selftest_result *out, int (*fn)(test_env *, const void *), test_env *env, const void *arg) {
  fflush(stdout);
  FILE *tmp = tmpfile();
  int saved = dup(1);
  if (tmp && saved >= 0) dup2(fileno(tmp), 1);
  int r = fn(env, arg);
  fflush(stdout);
  if (tmp && saved >= 0) {
    dup2(saved, 1);
    close(saved);
    rewind(tmp);
    size_t n = fread(out->detail, 1, sizeof out->detail - 1, tmp);
    out->detail[n] = '\0';
    while (n > 0 && out->detail[n - 1] == '\n') out->detail[--n] = '\0';
  }
  if (tmp) fclose(tmp);
  return r;
}

static int run_fwd(test_env *env, const void *c) {
  return run_forward_case(env, env->queue, c, fcl_attention_forward, "forward");
}
static int run_ref(test_env *env, const void *c) {
  return run_forward_case(env, env->queue, c, fcl_attention_reference, "reference");
}
static int run_bwd(test_env *env, const void *c) { return run_backward_case(env, env->queue, c, 1, "backward"); }

static int selftest(test_env *env, int *first_json) {
  static const fwd_case fwd[] = {
      /* b, h, hkv, nq, nk, d, dtype, causal, layout, scale, lse */
      {1, 2, 0, 67, 67, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1},
      {2, 4, 2, 50, 77, 64, FCL_DTYPE_F32, 1, LAYOUT_BNHD, 0, 1},
      {1, 2, 0, 40, 33, 32, FCL_DTYPE_F32, 1, LAYOUT_PADDED, 0.3f, 1},
      {1, 2, 1, 45, 45, 80, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1},
      {1, 2, 0, 33, 65, 96, FCL_DTYPE_BF16, 0, LAYOUT_BNHD, 0, 1},
      {1, 1, 0, 70, 70, 128, FCL_DTYPE_F16, 1, LAYOUT_BHND, 0, 1},
      {1, 1, 0, 20, 40, 256, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1},
  };
  static const fwd_case ref[] = {
      {1, 2, 0, 67, 67, 64, FCL_DTYPE_F32, 1, LAYOUT_BHND, 0, 1},
      {1, 2, 1, 40, 55, 64, FCL_DTYPE_F16, 0, LAYOUT_BNHD, 0, 1},
  };
  static const bwd_case bwd[] = {
      /* b, h, hkv, nq, nk, d, dtype, causal, layout, scale, from_forward */
      {1, 2, 0, 37, 37, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1},
      {1, 2, 1, 30, 45, 32, FCL_DTYPE_BF16, 1, LAYOUT_BNHD, 0, 1},
  };
  selftest_result results[16];
  int n = 0, passed = 0, failed = 0, skipped = 0;
  human("\nSelf-test (float64 host reference; bounds: forward rel %.0e f32, %.0e f16, %.1e bf16; backward rel %.0e, "
        "%.0e, %.0e):\n",
        FWD_TOL_F32, FWD_TOL_F16, FWD_TOL_BF16, BWD_TOL_F32, BWD_TOL_F16, BWD_TOL_BF16);
  struct {
    const char *op;
    int (*fn)(test_env *, const void *);
    const void *cases;
    size_t size, count;
  } groups[] = {
      {"forward", run_fwd, fwd, sizeof fwd[0], sizeof fwd / sizeof fwd[0]},
      {"reference", run_ref, ref, sizeof ref[0], sizeof ref / sizeof ref[0]},
      {"backward", run_bwd, bwd, sizeof bwd[0], sizeof bwd / sizeof bwd[0]},
  };
  for (size_t g = 0; g < 3; ++g)
    for (size_t i = 0; i < groups[g].count && n < 16; ++i, ++n) {
      const void *c = (const char *)groups[g].cases + i * groups[g].size;
      selftest_result *r = &results[n];
      char what[160];
      if (g == 2) {
        const bwd_case *b = c;
        fwd_case f = {b->b, b->h, b->hkv, b->nq, b->nk, b->d, b->dtype, b->causal, b->layout, b->scale, 0};
        describe_case(&f, what, sizeof what);
      } else {
        describe_case(c, what, sizeof what);
      }
      snprintf(r->name, sizeof r->name, "%.10s %.140s", groups[g].op, what);
      r->detail[0] = '\0';
      const int failed_before = test_failed;
      r->result = captured(r, groups[g].fn, env, c);
      if (r->result == 0 && test_failed != failed_before) r->result = 1;
      if (r->result == 0) ++passed;
      else if (r->result == 2) ++skipped;
      else ++failed;
      if (!json) {
        printf("  %-8s %s\n", r->result == 0 ? "pass" : r->result == 2 ? "skipped" : "FAIL", r->name);
        if (r->result != 0) {
          /* The check lines say why. */
          for (char *line = strtok(r->detail, "\n"); line; line = strtok(NULL, "\n")) printf("           %s\n", line);
        }
      }
      fflush(stdout);
    }
  if (json) {
    printf("%s\n  \"selftest\": {\"passed\": %d, \"failed\": %d, \"skipped\": %d, \"cases\": [", *first_json ? "" : ",",
           passed, failed, skipped);
    for (int i = 0; i < n; ++i) {
      printf("%s\n    {\"name\": ", i ? "," : "");
      json_string(stdout, results[i].name);
      printf(", \"result\": \"%s\", \"detail\": ",
             results[i].result == 0 ? "pass" : results[i].result == 2 ? "unsupported" : "fail");
      json_string(stdout, results[i].detail);
      printf("}");
    }
    printf("\n  ]}");
  } else {
    printf("  %d passed, %d failed, %d skipped (skipped: the library reports the operation unsupported here)\n",
           passed, failed, skipped);
  }
  *first_json = 0;
  return failed;
}

/* ---- benchmark ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cl_mem random_buffer(test_env *env, size_t elems, fcl_dtype t) {
  const size_t es = dtype_size(t);
  unsigned char *host = malloc(elems * es);
  if (!host) return NULL;
  for (size_t i = 0; i < elems; ++i) encode_dtype((float)test_uniform(), t, host + i * es);
  cl_int e;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, elems * es, host, &e);
  free(host);
  return e == CL_SUCCESS ? m : NULL;
}

#define BENCH_RUNS 10     /* the forward */
#define BENCH_REF_RUNS 5  /* the reference path, several times slower on large shapes */

/* Median of `runs` timed calls after one warm-up: device time from the event when *use_events (the forward:
   one kernel), else host wall time around enqueue and clFinish (the reference path: several kernels). A
   profiling clock that cannot time the call clears *use_events and the runs start over on the wall clock:
   no figure comes from that clock. */
static int time_op(test_env *env, fwd_fn fn, const fcl_attention_desc *d, cl_mem q, cl_mem k, cl_mem v, cl_mem o,
                   int *use_events, int runs, double *median_s, char *err, size_t err_size) {
  double t[BENCH_RUNS];
  if (runs > BENCH_RUNS) runs = BENCH_RUNS;
  for (int i = -1; i < runs; ++i) {
    cl_event ev = NULL;
    clFinish(env->queue);
    const double t0 = wall_s();
    fcl_status st = fn(env->fcl, env->queue, d, q, k, v, o, NULL, 0, NULL, &ev);
    if (st != FCL_SUCCESS) {
      snprintf(err, err_size, "%s: %s", fcl_status_string(st), fcl_last_error());
      return st == FCL_ERROR_UNSUPPORTED ? 2 : 1;
    }
    cl_int e = clWaitForEvents(1, &ev);
    if (e == CL_SUCCESS) e = clFinish(env->queue);
    const double t1 = wall_s();
    cl_ulong start = 0, end = 0;
    if (e == CL_SUCCESS && *use_events) {
      e = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
      if (e == CL_SUCCESS) e = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
    }
    clReleaseEvent(ev);
    if (e != CL_SUCCESS) {
      snprintf(err, err_size, "event: %s (%d)", fcl_cl_error_name(e), (int)e);
      return 1;
    }
    /* Zero, not advancing, or under a thousandth of the wall time (rusticl on llvmpipe counts 1 ns a command). */
    if (*use_events && (start == 0 || end <= start || (double)(end - start) * 1e-9 * 1000.0 < t1 - t0)) {
      *use_events = 0;
      i = -1;
      continue;
    }
    if (i >= 0) t[i] = *use_events ? 1e-9 * (double)(end - start) : t1 - t0;
  }
  qsort(t, (size_t)runs, sizeof t[0], cmp_double);
  *median_s = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
  return 0;
}

static void release_all(cl_mem *m, int n) {
  for (int i = 0; i < n; ++i)
    if (m[i]) clReleaseMemObject(m[i]), m[i] = NULL;
}

static void bench(test_env *env, int is_gpu, int *first_json) {
  const int64_t b = is_gpu ? 4 : 1, h = is_gpu ? 16 : 8, hd = is_gpu ? 128 : 64;
  int64_t n = is_gpu ? 4096 : 1024;
  const fcl_dtype t = is_gpu ? FCL_DTYPE_F16 : FCL_DTYPE_F32;
  fcl_device_quirks quirks;
  const int budget_known = fcl_context_device_quirks(env->fcl, &quirks) == FCL_SUCCESS;
  const int budget = budget_known && quirks.loop_budget;
  fcl_attention_desc d;
  double fwd_s = 0, ref_s = 0, flops = 0;
  char fwd_err[2048] = "", ref_err[2048] = "", shape[192];
  int fr = 1, rr = 1, ref_events = 0, reduced = 0;
  int fwd_events = !(budget_known && quirks.profiling_clock_unusable == 1); /* checked again per run */
  cl_mem m[4] = {NULL, NULL, NULL, NULL};
  /* A device with a loop budget refuses long key ranges: halve N until the forward runs, and say so. */
  for (;;) {
    plan_desc(&d, b, h, n, hd, t);
    const size_t elems = (size_t)(b * h * n * hd);
    flops = 4.0 * (double)b * (double)h * (double)n * (double)n * (double)hd;
    cl_int e;
    for (int i = 0; i < 3; ++i) m[i] = random_buffer(env, elems, t);
    m[3] = clCreateBuffer(env->context, CL_MEM_READ_WRITE, elems * dtype_size(t), NULL, &e);
    if (e != CL_SUCCESS) m[3] = NULL;
    if (!m[0] || !m[1] || !m[2] || !m[3]) {
      snprintf(fwd_err, sizeof fwd_err, "could not allocate the bench buffers");
      break;
    }
    fr = time_op(env, fcl_attention_forward, &d, m[0], m[1], m[2], m[3], &fwd_events, BENCH_RUNS, &fwd_s, fwd_err,
                 sizeof fwd_err);
    if (fr != 2 || !budget || n <= 64) break;
    release_all(m, 4);
    n /= 2;
    reduced = 1;
  }
  snprintf(shape, sizeof shape, "B=%lld H=%lld N=%lld d=%lld %s, not causal%s", (long long)b, (long long)h,
           (long long)n, (long long)hd, dtype_name(t), reduced ? " (N halved to fit the device's loop budget)" : "");
  if (m[3])
    rr = time_op(env, fcl_attention_reference, &d, m[0], m[1], m[2], m[3], &ref_events, BENCH_REF_RUNS, &ref_s, ref_err,
                 sizeof ref_err);
  if (json) {
    printf("%s\n  \"bench\": {\"shape\": ", *first_json ? "" : ",");
    json_string(stdout, shape);
    printf(", \"flop\": %.0f, \"forward_runs\": %d, \"reference_runs\": %d, ", flops, BENCH_RUNS, BENCH_REF_RUNS);
    if (fr == 0)
      printf("\"forward_s\": %.6e, \"forward_tflops\": %.4g, \"forward_timer\": \"%s\"", fwd_s, flops / fwd_s * 1e-12,
             fwd_events ? "events" : "wall");
    else {
      printf("\"forward_error\": ");
      json_string(stdout, fwd_err);
    }
    if (rr == 0) printf(", \"reference_s\": %.6e, \"reference_tflops\": %.4g", ref_s, flops / ref_s * 1e-12);
    else {
      printf(", \"reference_error\": ");
      json_string(stdout, ref_err);
    }
    printf("}");
  } else {
    printf("\nBench: %s; %.3g FLOP per call (4*B*H*N*N*d); median of %d (forward) and %d (reference) after a "
           "warm-up\n",
           shape, flops, BENCH_RUNS, BENCH_REF_RUNS);
    if (fr == 0 && fwd_events)
      printf("  forward   (flash, event time)       %9.3f ms  %8.3g TFLOP/s\n", fwd_s * 1e3, flops / fwd_s * 1e-12);
    else if (fr == 0)
      printf("  forward   (flash, wall time)        %9.3f ms  %8.3g TFLOP/s  (the profiling clock is unusable here)\n",
             fwd_s * 1e3, flops / fwd_s * 1e-12);
    else
      printf("  forward   %s\n", fwd_err);
    if (rr == 0)
      printf("  reference (materialized, wall time) %9.3f ms  %8.3g TFLOP/s\n", ref_s * 1e3, flops / ref_s * 1e-12);
    else
      printf("  reference %s\n", ref_err);
    if (fr == 0 && rr == 0) printf("  forward is %.2fx the reference's speed\n", ref_s / fwd_s);
  }
  *first_json = 0;
  release_all(m, 4);
}

/* ---- tune ---- */

/* fcl_tune_forward at a representative shape per head_dim 64 and 128 (f32): the winner, best vs default. */
static void tune(test_env *env, int is_gpu, int *first_json) {
  const int64_t b = is_gpu ? 4 : 1, h = is_gpu ? 16 : 4, n_first = is_gpu ? 4096 : 1024;
  fcl_device_quirks quirks;
  const int budget = fcl_context_device_quirks(env->fcl, &quirks) == FCL_SUCCESS && quirks.loop_budget;
  static const int64_t tune_dims[] = {64, 128};
  if (json) printf("%s\n  \"tune\": [", *first_json ? "" : ",");
  else
    printf("\nTune (fcl_tune_forward, portable forward kernel; B=%lld H=%lld N=%lld f32, not causal; median of 5 "
           "after a warm-up, device time%s):\n",
           (long long)b, (long long)h, (long long)n_first,
           budget ? "; N halved where the device's loop budget refuses it" : "");
  for (size_t i = 0; i < sizeof tune_dims / sizeof tune_dims[0]; ++i) {
    fcl_attention_desc d;
    fcl_tune_result r;
    const double t0 = wall_s();
    /* A device with a loop budget refuses long key ranges: halve N until the default shape runs. */
    int64_t n = n_first;
    fcl_status st;
    for (;;) {
      plan_desc(&d, b, h, n, tune_dims[i], FCL_DTYPE_F32);
      st = fcl_tune_forward(env->fcl, env->queue, &d, &r);
      if (st != FCL_ERROR_UNSUPPORTED || !budget || n <= 64) break;
      n /= 2;
    }
    const double took = wall_s() - t0;
    if (json) {
      printf("%s\n    {\"head_dim\": %lld, \"dtype\": \"f32\", \"batch\": %lld, \"heads\": %lld, \"seqlen\": %lld, ",
             i ? "," : "", (long long)tune_dims[i], (long long)b, (long long)h, (long long)n);
      if (st == FCL_SUCCESS) {
        printf("\"candidates\": %d, \"shape\": ", r.candidates);
        json_string(stdout, r.shape);
        printf(", \"best_ms\": %.4g, \"default_shape\": ", r.best_ms);
        json_string(stdout, r.default_shape);
        printf(", \"default_ms\": %.4g, \"timer\": \"%s\", \"recorded\": %s, \"saved\": %s, \"seconds\": %.1f}",
               r.default_ms, r.wall_clock ? "wall" : "events", r.recorded ? "true" : "false",
               r.saved ? "true" : "false", took);
      } else {
        printf("\"status\": \"%s\", \"error\": ", fcl_status_string(st));
        json_string(stdout, fcl_last_error());
        printf("}");
      }
    } else if (st == FCL_SUCCESS) {
      printf("  d=%-4lld N=%-5lld %d shapes timed in %.1f s: best %s %.3f ms, default %s %.3f ms (%.2fx%s); %s\n",
             (long long)tune_dims[i], (long long)n, r.candidates, took, r.shape, r.best_ms, r.default_shape, r.default_ms,
             r.default_ms / r.best_ms, r.wall_clock ? ", wall clock: the profiling clock is unusable" : "",
             r.recorded ? (r.saved ? "recorded, saved in the cache directory" : "recorded for this run (no disk cache)")
                        : "the default stays");
    } else {
      printf("  d=%-4lld %s: %s\n", (long long)tune_dims[i], fcl_status_string(st), fcl_last_error());
    }
    fcl_plan_info info;
    if (!json && st == FCL_SUCCESS && fcl_describe_plan(env->fcl, FCL_OP_FORWARD, &d, &info) == FCL_SUCCESS &&
        strcmp(info.kernel, "portable") != 0)
      printf("         (the forward runs the %s kernel here; the tuned shape serves the portable one, e.g. with "
             "FLASHCL_PORTABLE_ONLY=1)\n",
             info.kernel);
  }
  if (json) printf("\n  ]");
  *first_json = 0;
}

/* ---- main ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashcl-probe [--device N|SUBSTRING] [--json] [--list] [--plans] [--cache] [--selftest] [--bench]\n"
          "                     [--tune]\n"
          "\n"
          "Shows what flashcl detects on this machine and what it would run.\n"
          "  --list        every platform and device with the facts the library uses\n"
          "  --plans       the forward plan for head_dim 32..256 and each dtype on the selected device\n"
          "  --cache       the kernel cache directory, its entries for the device, hits and builds of this run\n"
          "  --selftest    small problems of every implemented operation against a float64 host reference;\n"
          "                exit status 1 when any case fails\n"
          "  --bench       a quick timed forward (and the reference path) at one representative shape\n"
          "  --tune        time the portable forward kernel's candidate shapes for head_dim 64 and 128 (f32) and\n"
          "                record the winners in the cache directory (only when asked: takes a while)\n"
          "  --device X    the device by index (as listed) or name substring; default: the first GPU, else the\n"
          "                first device\n"
          "  --json        the same as one JSON object\n"
          "  --help        this text\n"
          "With none of --list --plans --cache --selftest --bench, all five run.\n"
          "Environment: FLASHCL_CACHE_DIR (\"\" turns the disk cache off), FLASHCL_PORTABLE_ONLY=1.\n");
}

int main(int argc, char **argv) {
  const char *want = NULL;
  int do_list = 0, do_plans = 0, do_cache = 0, do_selftest = 0, do_bench = 0;
  int do_tune = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--list")) do_list = 1;
    else if (!strcmp(argv[i], "--plans")) do_plans = 1;
    else if (!strcmp(argv[i], "--cache")) do_cache = 1;
    else if (!strcmp(argv[i], "--selftest")) do_selftest = 1;
    else if (!strcmp(argv[i], "--bench")) do_bench = 1;
    else if (!strcmp(argv[i], "--tune")) do_tune = 1;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) want = argv[++i];
    else if (!strncmp(argv[i], "--device=", 9)) want = argv[i] + 9;
    else {
      fprintf(stderr, "flashcl-probe: unknown argument %s\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!do_list && !do_plans && !do_cache && !do_selftest && !do_bench && !do_tune)
    do_list = do_plans = do_cache = do_selftest = do_bench = 1;
  const double t_start = wall_s();

  cl_platform_id platforms[16];
  cl_uint np = 0;
  device_ref refs[MAX_DEVICES];
  const int nd = list_devices(refs, MAX_DEVICES, platforms, &np);
  const int sel = select_device(refs, nd, want);
  int first_json = 1;
  if (json) printf("{\n  \"flashcl_version\": \"%s\"", fcl_version()), first_json = 0;
  else printf("flashcl %s\n", fcl_version());

  if (nd == 0) {
    if (json) printf(",\n  \"error\": \"no OpenCL device found\"\n}\n");
    else printf("no OpenCL platform or device found (is an ICD installed? see /etc/OpenCL/vendors)\n");
    return 1;
  }

  /* ---- the list ---- */
  char *ext = malloc(65536);
  if (!ext) return 1;
  if (do_list) {
    if (json) printf(",\n  \"platforms\": [");
    else printf("\nPlatforms and devices (index for --device in brackets):\n");
    for (cl_uint p = 0; p < np; ++p) {
      record pr = {.n = 0};
      char buf[1024];
      static const struct { cl_platform_info what; const char *key, *label; } pinfo[] = {
          {CL_PLATFORM_NAME, "name", "name"}, {CL_PLATFORM_VENDOR, "vendor", "vendor"},
          {CL_PLATFORM_VERSION, "version", "version"}};
      for (int i = 0; i < 3; ++i) {
        cl_int e = clGetPlatformInfo(platforms[p], pinfo[i].what, sizeof buf, buf, NULL);
        buf[sizeof buf - 1] = '\0';
        if (e == CL_SUCCESS) add_string(&pr, pinfo[i].key, pinfo[i].label, "%s", buf);
        else add_error(&pr, pinfo[i].key, pinfo[i].label, "%s (%d)", fcl_cl_error_name(e), (int)e);
      }
      if (json) {
        printf("%s\n    {\"platform\": ", p ? "," : "");
        json_record(&pr, "    ");
        printf(", \"devices\": [");
      } else {
        printf("Platform %u\n", p);
        print_record(&pr, "  ");
      }
      int firstdev = 1;
      for (int i = 0; i < nd; ++i) {
        if (refs[i].platform_index != (int)p) continue;
        record r = {.n = 0};
        add_number(&r, "index", "index", (unsigned long long)i, NULL);
        describe_device(&r, &refs[i], ext, 65536);
        /* Which kernel variants apply: fcl_describe_plan's choice for a typical problem on this device. */
        cl_int e;
        cl_context c = clCreateContext(NULL, 1, &refs[i].device, NULL, NULL, &e);
        fcl_context *fc = NULL;
        fcl_status st = e == CL_SUCCESS ? fcl_context_create(c, refs[i].device, NULL, &fc) : FCL_ERROR_OPENCL;
        fcl_plan_info info;
        fcl_attention_desc d;
        plan_desc(&d, 1, 8, 1024, 128, FCL_DTYPE_F16);
        if (st == FCL_SUCCESS) st = fcl_describe_plan(fc, FCL_OP_FORWARD, &d, &info);
        if (st == FCL_SUCCESS)
          add_string(&r, "forward_variant_d128_f16", "forward kernel (d=128 f16)", "%s (portable always applies): %s",
                     info.kernel, info.reason);
        else
          add_error(&r, "forward_variant_d128_f16", "forward kernel (d=128 f16)", "%s: %s", fcl_status_string(st),
                    e == CL_SUCCESS ? fcl_last_error() : "clCreateContext failed");
        /* Measured driver quirks (once per device, driver and library version; kept in the cache directory). */
        fcl_device_quirks quirks;
        if (fc && fcl_context_device_quirks(fc, &quirks) == FCL_SUCCESS) {
          static const char *const sources[] = {"unknown", "measured", "cached", "forced"};
          char human[400];
          if (quirks.loop_budget)
            snprintf(human, sizeof human, "%llu iterations per work-item and launch, all loops (%.100s)",
                     (unsigned long long)quirks.loop_budget, quirks.detail);
          else
            snprintf(human, sizeof human, "none found (%.150s)", quirks.detail);
          add_number(&r, "loop_budget", "loop budget", (unsigned long long)quirks.loop_budget, human);
          add_string(&r, "loop_budget_source", "loop budget source", "%s",
                     sources[(unsigned)quirks.source < 4 ? quirks.source : 0]);
          if (quirks.profiling_clock_unusable < 0)
            add_string(&r, "profiling_clock", "profiling clock", "not measured");
          else
            add_string(&r, "profiling_clock", "profiling clock", "%s",
                       quirks.profiling_clock_unusable ? "unusable (zero, or far behind the host's clock): timings use the wall clock"
                                                   : "works");
        }
        fcl_context_release(fc);
        if (c) clReleaseContext(c);
        if (json) {
          printf("%s\n      ", firstdev ? "" : ",");
          json_record(&r, "      ");
        } else {
          printf("  [%d] %s%s\n", i, refs[i].name, i == sel ? "   <- selected" : "");
          print_record(&r, "      ");
        }
        firstdev = 0;
      }
      if (json) printf("]}");
    }
    if (json) printf("\n  ]");
  }

  if (sel < 0) {
    if (json) printf(",\n  \"error\": \"no device matches --device %s\"\n}\n", want ? want : "");
    else printf("\nno device matches --device %s\n", want ? want : "");
    free(ext);
    return 2;
  }

  /* ---- the selected device: one context for plans, cache, self-test and bench ---- */
  test_env env;
  memset(&env, 0, sizeof env);
  env.platform = refs[sel].platform;
  env.device = refs[sel].device;
  snprintf(env.device_name, sizeof env.device_name, "%s", refs[sel].name);
  clGetDeviceInfo(env.device, CL_DEVICE_EXTENSIONS, 65536, ext, NULL);
  ext[65535] = '\0';
  env.has_fp64 = strstr(ext, "cl_khr_fp64") != NULL;
  free(ext);
  cl_int e;
  env.context = clCreateContext(NULL, 1, &env.device, NULL, NULL, &e);
  if (e == CL_SUCCESS) env.queue = clCreateCommandQueue(env.context, env.device, CL_QUEUE_PROFILING_ENABLE, &e);
  fcl_status st = e == CL_SUCCESS ? fcl_context_create(env.context, env.device, NULL, &env.fcl) : FCL_ERROR_OPENCL;
  if (json) {
    printf(",\n  \"selected_device\": {\"index\": %d, \"name\": ", sel);
    json_string(stdout, refs[sel].name);
    printf("}");
  } else {
    printf("\nSelected device [%d]: %s\n", sel, refs[sel].name);
  }
  if (st != FCL_SUCCESS) {
    const char *why = e == CL_SUCCESS ? fcl_last_error() : fcl_cl_error_name(e);
    if (json) {
      printf(",\n  \"error\": ");
      json_string(stdout, why);
      printf("\n}\n");
    } else {
      printf("cannot use it: %s: %s\n", fcl_status_string(st), why);
    }
    return 1;
  }
  int failures = 0;
  if (do_plans) show_plans(env.fcl, &first_json);
  if (do_cache)
    show_cache(env.fcl, "cache", do_plans ? "Kernel cache (after the plans above)" : "Kernel cache", &first_json);
  if (do_selftest || do_bench) {
    /* Inputs are random; test_seed prints the seed (FLASHCL_TEST_SEED repeats it), kept out of JSON. */
    fflush(stdout);
    int saved = json ? dup(1) : -1;
    FILE *null = json ? fopen("/dev/null", "w") : NULL;
    if (null && saved >= 0) dup2(fileno(null), 1);
    if (!json) printf("\n");
    test_seed();
    fflush(stdout);
    if (null && saved >= 0) dup2(saved, 1);
    if (saved >= 0) close(saved);
    if (null) fclose(null);
  }
  if (do_selftest) failures = selftest(&env, &first_json);
  if (do_bench) bench(&env, (refs[sel].type & CL_DEVICE_TYPE_GPU) != 0, &first_json);
  if (do_tune) tune(&env, (refs[sel].type & CL_DEVICE_TYPE_GPU) != 0, &first_json);
  if (do_cache && (do_selftest || do_bench))
    show_cache(env.fcl, "cache_end", "Kernel cache at the end of the run", &first_json);
  const double total = wall_s() - t_start;
  if (json) printf(",\n  \"seconds\": %.2f,\n  \"selftest_failures\": %d\n}\n", total, failures);
  else printf("\nDone in %.1f s%s\n", total, do_selftest ? (failures ? ": SELF-TEST FAILED" : ": self-test passed") : "");
  test_close(&env);
  return failures ? 1 : 0;
}
