/* Internal declarations shared by the host runtime's files. Nothing here is installed. */
#ifndef FLASHCL_INTERNAL_H
#define FLASHCL_INTERNAL_H

#include "flashcl.h"

#include <pthread.h>
#include <stdarg.h>

/* ---- status.c: the calling thread's last error ---- */

/* Records a formatted message for fcl_last_error() and returns status, so a failure reads
   `return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "desc->head_dim is %lld", ...)`. */
fcl_status fcl_fail(fcl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fcl_clear_error(void);
const char *fcl_cl_error_name(cl_int code);

/* Checks one OpenCL call; on failure records "<call text>: <error name> (<code>)" and returns
   FCL_ERROR_OPENCL (FCL_ERROR_OUT_OF_RESOURCES for allocation failures) from the enclosing function. */
#define FCL_CL_CHECK(call)                                                                  \
  do {                                                                                      \
    cl_int fcl_cl_err_ = (call);                                                            \
    if (fcl_cl_err_ != CL_SUCCESS) return fcl_cl_failure(#call, fcl_cl_err_);              \
  } while (0)
fcl_status fcl_cl_failure(const char *call_text, cl_int code);

/* ---- device.c: what the library needs to know about a device ---- */

enum { FCL_VENDOR_OTHER, FCL_VENDOR_NVIDIA, FCL_VENDOR_AMD, FCL_VENDOR_INTEL };

typedef struct fcl_device_caps {
  char platform_name[128], platform_version[128];
  char device_name[256], device_version[128], driver_version[128], vendor_name[128];
  int vendor;               /* FCL_VENDOR_*, from the platform and device vendor strings */
  int is_cpu, is_gpu;
  cl_uint compute_units;
  cl_ulong local_mem_size;  /* bytes of local memory one work-group may use */
  int local_mem_dedicated;  /* CL_LOCAL (on-chip) rather than CL_GLOBAL */
  cl_ulong global_mem_size, max_alloc_size;
  size_t max_work_group_size;
  size_t max_work_item_size0;
  size_t preferred_multiple; /* preferred work-group size multiple (warp / wavefront / SIMD width) */
  int has_fp16, has_fp64, has_subgroups;
  int nv_cc_major, nv_cc_minor; /* NVIDIA compute capability; 0 when not reported */
} fcl_device_caps;

fcl_status fcl_probe_device(cl_device_id device, fcl_device_caps *caps);

/* ---- plan.c: tile sizes and work-group shape (pure functions of capabilities and problem) ---- */

enum { FCL_KERNEL_PORTABLE = 0, FCL_KERNEL_NVIDIA_MMA = 1 };

typedef struct fcl_tile_plan {
  int kernel;       /* FCL_KERNEL_* */
  int head_dim;     /* D: the problem's head_dim */
  int dp;           /* D padded to a multiple of tc */
  int ds;           /* row stride of the local Q/K/V tiles (dp, or dp + 1 against bank conflicts) */
  int br, bc;       /* query rows per work-group, key rows per tile */
  int tr, tc;       /* work-items arranged tr x tc */
  int rm, rn, dn;   /* per work-item: rm query rows, rn key columns of S, dn columns of O */
  int wg;           /* tr * tc */
  size_t local_bytes;
  char reason[192];
} fcl_tile_plan;

/* Local memory the portable forward kernel uses for plan p. */
size_t fcl_forward_local_bytes(const fcl_tile_plan *p);
/* Picks the portable forward plan for (caps, head_dim, dtype). kernel_max_wg bounds the work-group
   (0: only the device limit). Returns 0 on success, -1 when nothing fits (reason says why). */
int fcl_plan_forward(const fcl_device_caps *caps, int head_dim, fcl_dtype dtype, size_t kernel_max_wg,
                     fcl_tile_plan *out);

/* ---- program.c: kernels built from embedded source with -D defines, kept per context ---- */

typedef struct fcl_program_entry fcl_program_entry;

/* Returns the kernel `name` of the program made from the listed .cl files (in order) built with
   `defines`. The kernel is shared: callers set its arguments and enqueue while holding ctx->lock. */
fcl_status fcl_get_kernel(fcl_context *ctx, const char *const *files, int num_files, const char *name,
                          const char *defines, cl_kernel *out);

typedef struct fcl_embedded_source {
  const char *name;
  const char *text;
} fcl_embedded_source;
extern const fcl_embedded_source fcl_embedded_sources[];
extern const int fcl_embedded_source_count;
void fcl_release_programs(fcl_context *ctx);

/* ---- context.c ---- */

struct fcl_context {
  cl_context context;
  cl_device_id device;
  fcl_device_caps caps;
  char *build_options; /* the caller's, may be "" */
  char *cache_dir;     /* resolved disk cache directory; NULL: no disk cache */
  unsigned flags;
  pthread_mutex_t lock; /* guards programs and every set-args-and-enqueue on a shared kernel */
  fcl_program_entry *programs;
};

/* ---- desc.c: descriptor validation shared by every operation ---- */

/* A validated descriptor with defaults resolved. */
typedef struct fcl_problem {
  int64_t batch, heads, kv_heads, group; /* group = heads / kv_heads */
  int64_t nq, nk, d;
  fcl_dtype dtype;
  size_t elem_size;
  float scale;
  int causal;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  int64_t q_offset, k_offset, v_offset, o_offset;
} fcl_problem;

fcl_status fcl_resolve_problem(const fcl_attention_desc *desc, fcl_problem *p);
/* Checks that buf belongs to ctx's cl_context and holds every element of a [batch, heads, rows, d]
   tensor with the given strides and offset. what names the argument in messages. */
fcl_status fcl_check_tensor(const fcl_context *ctx, cl_mem buf, const char *what, const fcl_problem *p,
                            int64_t heads, int64_t rows, const int64_t stride[3], int64_t offset);
/* Checks a contiguous float32 buffer of `count` elements (lse, workspaces). */
fcl_status fcl_check_float_buffer(const fcl_context *ctx, cl_mem buf, const char *what, size_t count);
fcl_status fcl_check_queue(const fcl_context *ctx, cl_command_queue queue);
fcl_status fcl_check_wait_list(cl_uint num_wait, const cl_event *wait);

/* ---- forward.c: shared with the other operations and fcl_describe_plan ---- */

fcl_status fcl_validate_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait,
                                const cl_event *wait, fcl_problem *p);
/* Chooses the forward kernel variant for p and returns its plan and built kernel. Caller holds ctx->lock. */
fcl_status fcl_select_forward(fcl_context *ctx, const fcl_problem *p, fcl_tile_plan *plan, cl_kernel *kernel);

#endif /* FLASHCL_INTERNAL_H */
