/* flashcl: exact, IO-aware attention (FlashAttention) for OpenCL.
 *
 * O = softmax(scale * Q K^T [+ causal mask]) V computed tile by tile in on-chip local memory with an
 * online softmax: the N x N score matrix is never written to device memory, so memory is O(N).
 *
 * Every operation validates its whole input before enqueuing anything, returns an fcl_status, and
 * keeps a readable detail for the calling thread in fcl_last_error(). The library never prints,
 * aborts or exits. A context may be used from several threads at once.
 */
#ifndef FLASHCL_H
#define FLASHCL_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

/* FCL_API marks the public functions, the only symbols libflashcl.so exports (the library is built with
   hidden visibility). On Windows it is dllexport while building the library (FLASHCL_BUILDING) and
   dllimport for its users, except users of the static library, who define FLASHCL_STATIC
   (flashcl::flashcl_static does that for CMake users). */
#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(FLASHCL_STATIC)
#define FCL_API
#elif defined(FLASHCL_BUILDING)
#define FCL_API __declspec(dllexport)
#else
#define FCL_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#define FCL_API __attribute__((visibility("default")))
#else
#define FCL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCL_VERSION_MAJOR 0
#define FLASHCL_VERSION_MINOR 2
#define FLASHCL_VERSION_PATCH 0
#define FLASHCL_VERSION_STRING "0.2.0"

/* The library's version as "major.minor.patch". */
FCL_API const char *fcl_version(void);

typedef enum fcl_status {
  FCL_SUCCESS = 0,
  FCL_ERROR_INVALID_ARGUMENT,   /* bad descriptor, NULL where required, buffer too small */
  FCL_ERROR_UNSUPPORTED,        /* valid, but not on this device (e.g. head_dim above its limit) */
  FCL_ERROR_OPENCL,             /* an OpenCL call failed: fcl_last_error() names it and its code */
  FCL_ERROR_BUILD,              /* kernel build failed: fcl_last_error() holds the build log */
  FCL_ERROR_OUT_OF_RESOURCES,   /* host or device allocation failed */
  FCL_ERROR_CLBLAST             /* CLBlast returned an error (reference path) */
} fcl_status;

typedef enum fcl_dtype { FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16 } fcl_dtype;

typedef struct fcl_context fcl_context; /* opaque; one per (cl_context, device) */

/* Never pick a vendor-specific kernel (the environment variable FLASHCL_PORTABLE_ONLY=1 does the same). */
#define FCL_FLAG_PORTABLE_ONLY 1u

typedef struct fcl_context_options {
  const char *cache_dir;     /* NULL: $FLASHCL_CACHE_DIR, else $XDG_CACHE_HOME/flashcl, else
                                $HOME/.cache/flashcl; "" turns the disk cache off */
  const char *build_options; /* appended to every kernel build */
  unsigned flags;            /* FCL_FLAG_PORTABLE_ONLY: never pick a vendor-specific kernel */
} fcl_context_options;

/* Creates a context on the caller's cl_context and device. The caller keeps ownership of both; the
   context retains them until fcl_context_release. options: NULL or zero-initialised means defaults. */
FCL_API fcl_status fcl_context_create(cl_context context, cl_device_id device,
                                      const fcl_context_options *options /* NULL: defaults */,
                                      fcl_context **out);
FCL_API void fcl_context_release(fcl_context *ctx); /* NULL is a no-op */
FCL_API const char *fcl_status_string(fcl_status status);
FCL_API const char *fcl_last_error(void); /* detail of the calling thread's last failure; never NULL */

/* The largest head_dim any kernel of the library accepts. */
#define FCL_MAX_HEAD_DIM 256

typedef struct fcl_attention_desc {
  int64_t batch, num_heads, num_kv_heads; /* num_kv_heads divides num_heads (GQA/MQA); 0 = num_heads */
  int64_t seqlen_q, seqlen_k, head_dim;
  fcl_dtype dtype; /* of q, k, v, o and of every gradient */
  float scale;     /* 0: 1/sqrt(head_dim) */
  int causal;      /* mask aligned to the bottom-right corner when seqlen_q != seqlen_k */
  /* strides in elements for (batch, head, sequence); all zero: contiguous [batch, heads, seq, head_dim].
     The head_dim elements of one row are contiguous. Offsets: first element of each tensor in its buffer. */
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  int64_t q_offset, k_offset, v_offset, o_offset;

  /* ---- Score modifiers (0.2). Zero-initialised: none, exactly the 0.1 meaning. ----
     Query row i sits at key position p = i + seqlen_k - seqlen_q. Each score s = scale * q_i . k_j is
     modified in this order: softcap, ALiBi, additive mask; then the window decides which keys are
     visible. A row that sees no key (and has no sink) gets O = 0 and lse = -INFINITY. */
  float softcap;               /* > 0: s = softcap * tanh(s / softcap); 0: off */
  cl_mem alibi_slopes;         /* float32 slopes; s += -slope[b, h] * |p - j|; NULL: off */
  int64_t alibi_batch_stride;  /* elements between batches of slopes: 0 = one [num_heads] row for all
                                  batches, num_heads = [batch, num_heads] */
  int64_t alibi_offset;        /* element of the first slope */
  cl_mem mask;                 /* additive mask, s += mask[b, h, i, j] (-INFINITY hides a key); NULL: off */
  fcl_dtype mask_dtype;        /* FCL_DTYPE_F32, _F16 or _BF16 */
  int64_t mask_stride[3];      /* elements between (batch, head, row); 0 broadcasts that dimension;
                                  the seqlen_k entries of one row are contiguous */
  int64_t mask_offset;         /* element of mask[0, 0, 0, 0] */
  int window;                  /* 1: sliding window: key j is visible iff p - window_left <= j <= p + window_right */
  int64_t window_left, window_right; /* -1: unbounded on that side; causal = 1 caps window_right at 0 */
  cl_mem sinks;                /* float32 [num_heads]: one logit per head added to every row's softmax
                                  denominator (exp(sink - max)), contributing nothing to O; NULL: off */
  cl_mem d_sinks;              /* backward only, optional: float32 [num_heads] receives dL/dsink (summed
                                  over batch and rows); NULL: not computed. The forward ignores it. */

  /* ---- Variable-length batches and paged K/V (0.2). NULL and zero: dense tensors, the 0.1 meaning. ----
     Sequence b has its own lengths nq_b, nk_b; its query row i sits at key position p = i + nk_b - nq_b,
     and the window, ALiBi and the mask use that p and the sequence's own i and j. seqlen_q and seqlen_k
     are then the longest sequence's lengths (FA2's max_seqlen_q, max_seqlen_k). The int32 buffers below
     come from the caller's scheduler and are not trusted: whatever they hold, no kernel reads or writes
     outside a buffer (docs/api.md, "Untrusted indices", says what the output is then). */
  cl_mem cu_seqlens_q;        /* int32 [batch + 1], non-decreasing from 0: sequence b's queries are rows
                                 cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and o, packed
                                 [total_q, num_heads, head_dim] (q_stride[0], o_stride[0] unused; zero strides
                                 mean that packing); lse is then float32 [num_heads, total_q] */
  int64_t total_q;            /* with cu_seqlens_q: the rows q and o hold (FA2's q.shape[0]) */
  cl_mem cu_seqlens_k;        /* int32 [batch + 1]: the same for dense k and v, packed [total_k, kv_heads,
                                 head_dim] */
  int64_t total_k;            /* with cu_seqlens_k: the rows k and v hold */
  cl_mem seqlens_k;           /* int32 [batch]: sequence b attends to its first seqlens_k[b] keys, at most
                                 seqlen_k (FA2's cache_seqlens, vLLM's seq_lens); NULL: all of them */
  cl_mem block_table;         /* int32 [batch, block_table_stride]: paged k and v. Key j of sequence b is row
                                 j % block_size of block block_table[b * block_table_stride + j / block_size]
                                 of the pools k and v, whose k_stride, v_stride step (block, kv head, row in
                                 the block); zero strides: contiguous [num_blocks, kv_heads, block_size,
                                 head_dim]. seqlen_k is at most block_table_stride * block_size. */
  int64_t block_table_stride; /* entries per sequence of block_table (max_blocks_per_seq) */
  int64_t block_size;         /* keys per block: 1 .. 1024 */
  int64_t num_blocks;         /* blocks in each of the pools k and v */
} fcl_attention_desc;

/* O = softmax(modified scale * Q K^T) V. lse (optional, float32 [batch, num_heads, seqlen_q]) receives
   the natural-log sum of exp of each modified score row over its visible keys, the sink included
   (-INFINITY for a row that sees no key and has no sink, whose output is zero). Enqueues on queue; waits on the list; *event (optional) completes when O and
   lse are written; the caller releases it. */
FCL_API fcl_status fcl_attention_forward(fcl_context *ctx, cl_command_queue queue,
                                         const fcl_attention_desc *desc,
                                         cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse,
                                         cl_uint num_wait, const cl_event *wait, cl_event *event);

/* Split-KV. When a problem's work-groups cannot fill the device (decode: few query rows against many
   keys), the forward splits each block's keys into chunks computed by separate work-groups, writes their
   partial O and lse (float32) to scratch and merges them exactly in a second kernel. fcl_attention_forward
   takes that scratch from the context: one buffer per command queue, allocated on the first call that
   needs it, grown when a call needs more, reused by every later call on that queue, released by
   fcl_context_release (which also releases the queue it retained). Callers who manage memory themselves
   pass their own: fcl_attention_forward_workspace_size() bytes (0 when desc does not split on this
   device; the plan is built to know), to fcl_attention_forward_with_workspace, which otherwise behaves
   as fcl_attention_forward (workspace may be NULL: the context's scratch). */
FCL_API size_t fcl_attention_forward_workspace_size(fcl_context *ctx, const fcl_attention_desc *desc);
FCL_API fcl_status fcl_attention_forward_with_workspace(fcl_context *ctx, cl_command_queue queue,
                                                        const fcl_attention_desc *desc, cl_mem q, cl_mem k,
                                                        cl_mem v, cl_mem o, cl_mem lse, cl_mem workspace,
                                                        cl_uint num_wait, const cl_event *wait, cl_event *event);

/* Merges partial results over disjoint key sets of the same queries into the exact result (ring attention
   across devices, shared-prefix cascades): for each row, with lse_i of part i,
   lse = ln sum_i exp(lse_i) (+ exp(sink) when desc->sinks), O = sum_i exp(lse_i - lse) O_i.
   desc gives the queries and the layout: batch, num_heads, seqlen_q, head_dim, dtype, o_stride and
   o_offset, sinks (added here, once: compute the parts without them); its other fields are validated as
   usual and not used. Part i's O is laid out as o, at element o_offset + i * parts_stride of o_parts;
   its lse at lse_parts[i * batch * num_heads * seqlen_q + row] (float32, as the forward writes lse). A
   part whose lse is -INFINITY for a row (it saw no key) is left out of that row. o receives the result,
   lse (optional) its lse. */
FCL_API fcl_status fcl_attention_merge(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                       cl_uint num_parts, cl_mem o_parts, int64_t parts_stride, cl_mem lse_parts,
                                       cl_mem o, cl_mem lse, cl_uint num_wait, const cl_event *wait,
                                       cl_event *event);

/* The same result through the materialized N x N matrix (CLBlast GEMMs + a softmax kernel). */
FCL_API fcl_status fcl_attention_reference(fcl_context *ctx, cl_command_queue queue,
                                           const fcl_attention_desc *desc,
                                           cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse,
                                           cl_uint num_wait, const cl_event *wait, cl_event *event);

/* Gradients of the forward pass, from the forward's o and lse. d_o has o's strides and offset;
   d_q, d_k, d_v have those of q, k, v. workspace: at least fcl_attention_backward_workspace_size()
   bytes (may be NULL when that is 0): one float per query row, batch * num_heads * seqlen_q, or
   num_heads * total_q with cu_seqlens_q. Deterministic: the same inputs give bitwise the same output.
   Packed sequences (cu_seqlens_q, cu_seqlens_k, seqlens_k) are taken as the forward takes them; paged K/V
   (block_table) gives FCL_ERROR_UNSUPPORTED. */
FCL_API size_t fcl_attention_backward_workspace_size(fcl_context *ctx, const fcl_attention_desc *desc);
FCL_API fcl_status fcl_attention_backward(fcl_context *ctx, cl_command_queue queue,
                                          const fcl_attention_desc *desc,
                                          cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o,
                                          cl_mem d_q, cl_mem d_k, cl_mem d_v, cl_mem workspace,
                                          cl_uint num_wait, const cl_event *wait, cl_event *event);

/* ---- Paged KV cache: appending new tokens' keys and values ---- */

typedef struct fcl_kv_append_desc {
  int64_t num_tokens, num_kv_heads, head_dim;
  fcl_dtype dtype;               /* of the new rows and the pools */
  int64_t block_size, num_blocks; /* the pools' geometry, as in fcl_attention_desc */
  /* elements between (token, head) of k_new and v_new; zero: packed [num_tokens, num_kv_heads, head_dim] */
  int64_t k_new_stride[2], v_new_stride[2];
  int64_t k_new_offset, v_new_offset;
  /* elements between (block, head, row in the block) of the pools; zero: contiguous
     [num_blocks, num_kv_heads, block_size, head_dim] */
  int64_t k_pool_stride[3], v_pool_stride[3];
  int64_t k_pool_offset, v_pool_offset;
} fcl_kv_append_desc;

/* Writes token t's keys and values (every head) into the pools at slot slots[t] = block * block_size +
   row (int64 [num_tokens], vLLM's slot_mapping); a slot of -1 skips the token, and so does any slot
   outside [0, num_blocks * block_size) (an untrusted index never writes outside the pools). One kernel;
   elements are copied bit for bit. Tokens sharing a slot leave one of their values in each element,
   which one unspecified. The pools must share no element with each other or a byte with the inputs.
   num_tokens 0 runs nothing: *event (optional) is then a marker behind the wait list. */
FCL_API fcl_status fcl_kv_cache_append(fcl_context *ctx, cl_command_queue queue, const fcl_kv_append_desc *desc,
                                       cl_mem k_new, cl_mem v_new, cl_mem slots, cl_mem k_pool, cl_mem v_pool,
                                       cl_uint num_wait, const cl_event *wait, cl_event *event);

/* ---- Introspection: what the library detected and would run (used by flashcl-probe). ---- */

typedef enum fcl_operation { FCL_OP_FORWARD, FCL_OP_BACKWARD } fcl_operation;

typedef struct fcl_plan_info {
  char kernel[64];       /* the kernel variant, e.g. "portable" or "nvidia_mma" */
  char reason[256];      /* why that variant was chosen */
  int block_q, block_k;  /* query rows per work-group ((query row, head) pairs when a GQA group is packed
                            into one work-group), key rows per tile */
  int work_group_size;   /* work-items per work-group */
  size_t local_mem_bytes; /* local memory one work-group uses */
  size_t work_groups;    /* work-groups one call launches (all of its kernels' for the backward) */
  int splits;            /* forward: chunks each block's keys are split into (split-KV), 1 when not split */
} fcl_plan_info;

/* The plan the operation would run for desc on this context, without enqueuing anything. The kernel is
   built (or loaded from the cache) if it was not already, so the figures are the real ones. */
FCL_API fcl_status fcl_describe_plan(fcl_context *ctx, fcl_operation op, const fcl_attention_desc *desc,
                                     fcl_plan_info *out);

/* ---- Introspection: where kernels came from (memory, the on-disk binary cache, or a source build). ---- */

typedef enum fcl_cache_source {
  FCL_CACHE_NONE = 0, /* no kernel requested yet */
  FCL_CACHE_MEMORY,   /* the context's in-memory kernel map */
  FCL_CACHE_DISK,     /* a verified entry of the on-disk binary cache */
  FCL_CACHE_SOURCE    /* compiled from source */
} fcl_cache_source;

typedef struct fcl_cache_stats {
  const char *cache_dir;        /* the resolved disk cache directory (owned by the context, valid until
                                   fcl_context_release); NULL when the disk cache is off */
  uint64_t memory_hits;         /* kernel requests served from the in-memory map */
  uint64_t disk_hits;           /* programs loaded from the disk cache */
  uint64_t disk_rejected;       /* entries found but short, corrupt, for another key or refused by the driver */
  uint64_t source_builds;       /* programs compiled from source */
  uint64_t disk_writes;         /* entries written to the disk cache */
  uint64_t disk_write_failures; /* entries that could not be written (e.g. the directory is not writable) */
  fcl_cache_source last;        /* where the most recent kernel request was served from */
  uint64_t device_entries;      /* entries in cache_dir made for this context's device, driver and platform */
  uint64_t device_bytes;        /* their total size in bytes */
  const char *cache_refused;    /* NULL, or why the directory was not trusted and the disk cache is off (it is
                                   not owned by this user, or group or others may write it); owned by the
                                   context */
} fcl_cache_stats;

/* Counters of this context since its creation, and the disk cache's entries for its device. */
FCL_API fcl_status fcl_context_cache_stats(fcl_context *ctx, fcl_cache_stats *out);

/* ---- Device quirks: measured properties of the driver that planning respects ---- */

typedef enum fcl_quirk_source {
  FCL_QUIRK_UNKNOWN = 0, /* the probe could not run (detail says why); no loop limit is assumed */
  FCL_QUIRK_MEASURED,    /* measured when this context was created */
  FCL_QUIRK_CACHED,      /* measured earlier for this device, driver and library version; read from the cache */
  FCL_QUIRK_FORCED       /* set by $FLASHCL_LOOP_BUDGET (development override; 0 means no limit) */
} fcl_quirk_source;

typedef struct fcl_device_quirks {
  uint64_t loop_budget;     /* loop iterations one work-item may run in one kernel launch, all loops together,
                               before the driver silently ends every loop (llvmpipe: 65 535); 0: no limit
                               found (none below 2^20). Operations that would exceed it are refused with
                               FCL_ERROR_UNSUPPORTED rather than run to a wrong answer. */
  int profiling_clock_unusable; /* 1: profiling event times read zero, do not advance, or advance far less
                                   than the host's clock (rusticl on llvmpipe counts 0, 1, 2, 3 ns per
                                   command); fcl_tune_forward then times with the wall clock. 0: they
                                   work; -1: not measured */
  fcl_quirk_source source;  /* where loop_budget and profiling_clock_unusable came from */
  char detail[192];         /* how they were found, in words */
} fcl_device_quirks;

/* The quirks of ctx's device, probed once when the context was created (a tiny kernel; its result is kept in
   the disk cache directory beside the kernels, keyed by device, driver and library version). */
FCL_API fcl_status fcl_context_device_quirks(fcl_context *ctx, fcl_device_quirks *out);

/* ---- Tuning (opt-in): time the portable forward kernel's candidate shapes on this device. ---- */

typedef struct fcl_tune_result {
  char shape[64];         /* the fastest shape timed, "tr,tc,rm,rn,kt" as FLASHCL_FORWARD_SHAPE takes it */
  char default_shape[64]; /* the shape the planner's rule picks, in the same form */
  double best_ms;         /* median device time of one forward call with shape, in milliseconds */
  double default_ms;      /* the same for default_shape */
  int candidates;         /* shapes timed, the default included */
  int recorded;           /* 1: shape beats the default, and this context's portable forward for desc's
                             (head_dim, dtype) plans with it from now on; 0: the rule's default stays */
  int saved;              /* 1: the choice was written to the cache directory, where new contexts on this
                             device, driver and library version find it */
  int wall_clock;         /* 1: the device's profiling clock is unusable (zero, not advancing, or far behind
                             the host's clock), so best_ms and default_ms are host wall-clock times
                             (enqueue to clFinish on an idle queue) */
} fcl_tune_result;

/* Times the portable forward kernel at each candidate shape that fits this device for desc's head_dim and
   dtype, and the rule's default, on scratch buffers of desc's size (random contents, contiguous layout;
   desc's strides and offsets are not used), and records the winner when it beats the default. queue must
   have CL_QUEUE_PROFILING_ENABLE; where its profiling clock is unusable the wall clock times instead
   (wall_clock). Blocks until done; takes seconds (more on large shapes). */
FCL_API fcl_status fcl_tune_forward(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                    fcl_tune_result *out);

#ifdef __cplusplus
}
#endif
#endif /* FLASHCL_H */
