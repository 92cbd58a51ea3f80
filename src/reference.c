/* fcl_attention_reference: the same function as fcl_attention_forward, computed the standard way through
 * the materialized score matrix, with CLBlast:
 *
 *   S = Q K^T                 CLBlastSgemmStridedBatched, one batch entry per (batch, head) pair
 *   P = softmax(scale * S)    fcl_softmax_rows (cl/softmax.cl): window, score modifiers, sinks, lse; P over S
 *   O = P V                   CLBlastSgemmStridedBatched, on V's copy with non-finite elements as 0
 *   fixup                     fcl_nonfinite_fixup: the rows that see a non-finite V value get its terms
 *
 * Hidden keys are excluded, not weighted by zero (0 times NaN is NaN): V always goes through a float32 copy
 * whose non-finite elements are 0 and whose key rows that held any are marked (fcl_gather_clean_rows); the
 * softmax flags the query rows that give a marked key P != 0, and only those get the missing terms added
 * from the original V, in launches of at most fcl_nonfinite_within_budget's keys each (cl/softmax.cl).
 *
 * Packed and paged sequences (cu_seqlens_q, cu_seqlens_k, seqlens_k, block_table) run the same steps on the
 * padded dense layout [batch, heads, seqlen_q or seqlen_k, d], seqlen_q and seqlen_k being the longest
 * sequence's: the gathers read each sequence through common.cl's sequence layer (fcl_seq), with rows past its
 * own lengths 0 and a block outside the pool NaN; the softmax takes each sequence's own lengths and its bad
 * flag; O and lse go back to the sequences' own rows only. A packed or paged tensor is never plain (below), so
 * the gathered tensors are the float32 copies of the chunk, counted like any other copy.
 *
 * Device memory this allocates per call (released before returning; see below), for a chunk of C
 * (batch, head) pairs, all float32 unless noted:
 *   S             C * seqlen_q * seqlen_k           always
 *   V copy        C * seqlen_k * head_dim           always
 *   marks, hits   C * (seqlen_k + seqlen_q) bytes   always: the marked key rows, the flagged query rows
 *   pair flags    batch * num_heads * 4 bytes       always: the pairs with a marked key row
 *   Q, O copies   C * seqlen_q * head_dim each      when that tensor is not "plain" (see below)
 *   K copy        C * seqlen_k * head_dim           when K is not "plain"
 *   lse           batch * num_heads * seqlen_q      when lse is requested: it is copied (packed queries:
 *                                                   scattered) to the caller's buffer as the last step, so
 *                                                   a CLBlast failure part-way leaves it untouched
 * A tensor is plain when it is dense (not packed or paged), float32, its rows are at least head_dim apart,
 * all of it lies below element 2^31 of its buffer, and its (batch, head) blocks are equally spaced in the
 * order the GEMM batches walk them (so CLBlast can address it directly with one batch stride); V is never used in place (above). f16 and
 * bf16 tensors, GQA's shared K/V heads and other layouts are converted into contiguous float32 copies by
 * fcl_gather_rows (O back by fcl_scatter_rows), so every dtype is computed in float32. CLBlast's half-precision GEMM is not used: it
 * accumulates in half, which would make the reference less accurate than the kernel it checks.
 *
 * C is all batch * num_heads pairs when that fits, else the largest count whose every buffer stays within
 * CL_DEVICE_MAX_MEM_ALLOC_SIZE, whose total stays within half of CL_DEVICE_GLOBAL_MEM_SIZE and whose every
 * GEMM operand stays below 2^31 elements (CLBlast's kernels index with 32-bit ints); the chunks then run
 * one after another on the same scratch. When one pair's score matrix alone exceeds the allocation limit
 * or 2^31 elements, the call returns FCL_ERROR_OUT_OF_RESOURCES before enqueuing anything.
 * fcl_reference_scratch_bytes() reports the total. CLBlast may allocate temporary buffers of its own
 * inside a GEMM (padded copies of its operands); those are not counted. $FLASHCL_REFERENCE_CHUNK
 * (testing) caps the pairs per chunk.
 *
 * The scratch is released with clReleaseMemObject right after the last command that uses it is enqueued:
 * OpenCL defers the deletion until the commands queued on it have finished, so the call never waits on
 * the device. CLBlast takes no wait list, so the caller's wait list is honoured by a barrier enqueued
 * first; on an out-of-order queue a barrier also separates every step. Every command is a step of one
 * event chain (chain.c), so the intermediate events outlive the commands that depend on them (a failed
 * dependency then fails the chain instead of crashing the runtime); *event is the chain's last event, which
 * completes after O and lse are written.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLASHCL_HAVE_CLBLAST
#include <clblast_c.h>

enum { REF_Q, REF_K, REF_V, REF_O };

/* CLBlast's GEMM kernels compute element offsets, including batch * rows * cols of (padded) operands,
   in 32-bit ints: every operand a GEMM call touches is kept below 2^31 elements, counting each matrix
   dimension padded up to a multiple of 256 (more than any CLBlast tile). */
#define REF_INDEX_LIMIT 2147483647ull
static uint64_t ref_pad(int64_t n) { return ((uint64_t)n + 255) / 256 * 256; }

/* How one call runs: chunking and which tensors go through float32 copies. */
typedef struct ref_plan {
  int64_t pairs;  /* batch * heads */
  int64_t chunk;  /* pairs per chunk */
  int plain[4];   /* REF_*: used in place by CLBlast */
  int64_t step[4];/* plain tensors: elements between consecutive (batch, head) pairs */
  size_t s_bytes, copy_bytes[4], total_bytes; /* per chunk (total_bytes: and lse_bytes) */
  size_t marks_bytes, hits_bytes; /* per chunk: a byte per key row of V, per query row */
  size_t pairs_bytes;             /* a cl_int per pair of the call */
  size_t lse_bytes; /* lse of every pair, computed into scratch first */
} ref_plan;

/* Offset of pair i's block of tensor t when its (batch, head) blocks are equally spaced; -1 otherwise. */
static int plain_step(const fcl_problem *p, int t, int64_t *step) {
  const int64_t *s = t == REF_Q ? p->q_stride : t == REF_K ? p->k_stride : t == REF_V ? p->v_stride : p->o_stride;
  const int64_t group = (t == REF_K || t == REF_V) ? p->group : 1;
  const int64_t rows = (t == REF_Q || t == REF_O) ? p->nq : p->nk;
  if (p->dtype != FCL_DTYPE_F32) return 0;
  /* Packed or paged rows are gathered into the padded dense layout (fcl_gather_rows). */
  if ((t == REF_Q || t == REF_O) ? p->cu_q != NULL : (p->cu_k || p->block_table)) return 0;
  if (s[2] < p->d && rows > 1) return 0;
  /* CLBlast's kernels index with 32-bit ints: every element used in place must be below 2^31. */
  const int64_t off = t == REF_Q ? p->q_offset : t == REF_K ? p->k_offset : t == REF_V ? p->v_offset : p->o_offset;
  const uint64_t last = (uint64_t)off + (uint64_t)(p->batch - 1) * (uint64_t)s[0] +
                        (uint64_t)(p->heads / group - 1) * (uint64_t)s[1] + (uint64_t)(rows - 1) * (uint64_t)s[2] +
                        (uint64_t)p->d;
  if (last > (uint64_t)REF_INDEX_LIMIT) return 0;
  /* Pair i = b * heads + h reads block b * s[0] + (h / group) * s[1]. */
  int64_t delta;
  if (p->heads > 1) {
    if (group == 1) delta = s[1];
    else if (p->heads / group == 1 || s[1] == 0) delta = 0; /* every head of a batch reads one block */
    else return 0;
  } else {
    delta = s[0];
  }
  if (p->batch > 1 && s[0] != delta * p->heads) return 0;
  /* One (batch, head) pair: the stride between pairs is never used, whatever the caller's extent-1 strides
     hold (0 among them); CLBlast is given the block's own size, a stride it always accepts. */
  if (p->batch * p->heads == 1) delta = (rows > 1 ? s[2] : p->d) * rows;
  *step = delta;
  return 1;
}

static fcl_status make_plan(const fcl_context *ctx, const fcl_problem *p, ref_plan *rp) {
  memset(rp, 0, sizeof *rp);
  rp->pairs = p->batch * p->heads;
  for (int t = 0; t < 4; ++t) rp->plain[t] = plain_step(p, t, &rp->step[t]);
  rp->plain[REF_V] = 0; /* the GEMM reads V's cleaned copy (fcl_gather_clean_rows) */
  const uint64_t per_s = (uint64_t)p->nq * (uint64_t)p->nk * sizeof(float);
  const uint64_t per_copy[4] = {(uint64_t)p->nq * (uint64_t)p->d * sizeof(float), (uint64_t)p->nk * (uint64_t)p->d * sizeof(float),
                                (uint64_t)p->nk * (uint64_t)p->d * sizeof(float), (uint64_t)p->nq * (uint64_t)p->d * sizeof(float)};
  const uint64_t max_alloc = ctx->caps.max_alloc_size;
  if (per_s > max_alloc)
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES,
                    "reference path: one head's %lld x %lld score matrix needs %llu bytes, more than the %llu bytes "
                    "one buffer may hold on %s (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                    (long long)p->nq, (long long)p->nk, (unsigned long long)per_s, (unsigned long long)max_alloc,
                    ctx->caps.device_name);
  const uint64_t idx_s = ref_pad(p->nq) * ref_pad(p->nk);
  if (idx_s > REF_INDEX_LIMIT)
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES,
                    "reference path: one head's %lld x %lld score matrix has more elements than CLBlast's 32-bit "
                    "indices reach (2^31 - 1, counting its padding)",
                    (long long)p->nq, (long long)p->nk);
  const uint64_t per_marks = (uint64_t)p->nk, per_hits = (uint64_t)p->nq;
  uint64_t per_pair = per_s + per_marks + per_hits;
  int64_t chunk = rp->pairs;
  if ((uint64_t)chunk > max_alloc / per_s) chunk = (int64_t)(max_alloc / per_s);
  if ((uint64_t)chunk > REF_INDEX_LIMIT / idx_s) chunk = (int64_t)(REF_INDEX_LIMIT / idx_s);
  for (int t = 0; t < 4; ++t) {
    const uint64_t idx = ref_pad((t == REF_Q || t == REF_O) ? p->nq : p->nk) * ref_pad(p->d);
    if ((uint64_t)chunk > REF_INDEX_LIMIT / idx) chunk = (int64_t)(REF_INDEX_LIMIT / idx);
  }
  for (int t = 0; t < 4; ++t) {
    if (rp->plain[t]) continue;
    if (per_copy[t] > max_alloc)
      return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "reference path: one head's float32 copy needs %llu bytes, more than %llu",
                      (unsigned long long)per_copy[t], (unsigned long long)max_alloc);
    per_pair += per_copy[t];
    if ((uint64_t)chunk > max_alloc / per_copy[t]) chunk = (int64_t)(max_alloc / per_copy[t]);
  }
  const uint64_t budget = ctx->caps.global_mem_size / 2;
  if (budget >= per_pair && (uint64_t)chunk > budget / per_pair) chunk = (int64_t)(budget / per_pair);
  const char *cap = getenv("FLASHCL_REFERENCE_CHUNK");
  if (cap && atoll(cap) > 0 && chunk > atoll(cap)) chunk = (int64_t)atoll(cap);
  if (chunk < 1) chunk = 1;
  rp->chunk = chunk;
  rp->s_bytes = (size_t)((uint64_t)chunk * per_s);
  rp->lse_bytes = (size_t)((uint64_t)rp->pairs * (uint64_t)p->nq * sizeof(float));
  rp->marks_bytes = (size_t)((uint64_t)chunk * per_marks);
  rp->hits_bytes = (size_t)((uint64_t)chunk * per_hits);
  rp->pairs_bytes = (size_t)((uint64_t)rp->pairs * sizeof(cl_int));
  rp->total_bytes = rp->s_bytes + rp->lse_bytes + rp->marks_bytes + rp->hits_bytes + rp->pairs_bytes;
  for (int t = 0; t < 4; ++t) {
    rp->copy_bytes[t] = rp->plain[t] ? 0 : (size_t)((uint64_t)chunk * per_copy[t]);
    rp->total_bytes += rp->copy_bytes[t];
  }
  return FCL_SUCCESS;
}

size_t fcl_reference_scratch_bytes(fcl_context *ctx, const fcl_attention_desc *desc) {
  fcl_problem p;
  ref_plan rp;
  if (!ctx || fcl_resolve_problem(desc, &p) || make_plan(ctx, &p, &rp)) return 0;
  return rp.total_bytes;
}

static const char *const ref_files[] = {"common.cl", "softmax.cl"};

/* Work-group size of the softmax kernel: a power of two up to 256 that the device and kernel admit. */
static fcl_status softmax_kernel(fcl_context *ctx, const char *mods, cl_kernel *kernel, size_t *wg_out) {
  char defines[192];
  snprintf(defines, sizeof defines, "-DDTYPE=0%s", mods);
  return fcl_get_kernel_wg(ctx, ref_files, 2, "fcl_softmax_rows", defines, 256, kernel, wg_out);
}

/* CLBlast 1.5 (Debian 12's) fills its kernel and database caches without enough locking: concurrent first
   calls from several threads race inside clblast::Database (seen with ThreadSanitizer; fixed upstream in
   CLBlast's pull request 495). Its calls are cheap to enqueue once the caches are warm, so every call into
   CLBlast from this library goes through one process-wide lock. */
static pthread_mutex_t clblast_lock = PTHREAD_MUTEX_INITIALIZER;

static CLBlastStatusCode sgemm_strided_batched(CLBlastTranspose ta, CLBlastTranspose tb, size_t m, size_t n, size_t k,
                                               cl_mem a, size_t a_off, size_t a_ld, size_t a_stride, cl_mem b,
                                               size_t b_off, size_t b_ld, size_t b_stride, cl_mem c, size_t c_off,
                                               size_t c_ld, size_t c_stride, size_t count, cl_command_queue *queue,
                                               cl_event *event) {
  pthread_mutex_lock(&clblast_lock);
  CLBlastStatusCode cs = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, ta, tb, m, n, k, 1.0f, a, a_off, a_ld,
                                                    a_stride, b, b_off, b_ld, b_stride, 0.0f, c, c_off, c_ld, c_stride,
                                                    count, queue, event);
  pthread_mutex_unlock(&clblast_lock);
  return cs;
}

static fcl_status clblast_failure(const char *what, CLBlastStatusCode code) {
  return fcl_fail(FCL_ERROR_CLBLAST, "reference path: CLBlast %s failed with status %d", what, (int)code);
}

typedef struct ref_run {
  fcl_context *ctx;
  cl_command_queue queue;
  const fcl_problem *p;
  const ref_plan *rp;
  int out_of_order;
  cl_kernel softmax, gather, gather_clean, fixup, scatter, scatter_lse;
  size_t softmax_wg;
  int64_t fixup_keys; /* keys per fixup launch (the loop budget) */
  cl_mem scratch_s, copy[4];
  cl_mem marks, hits; /* V's key rows with a non-finite element; query rows that give one of them P != 0 */
  cl_mem marked_pairs; /* pairs of the call with a marked key row (cl_int each, created 0, only ever set) */
  cl_mem lse_tmp; /* lse is computed here and copied to the caller's buffer once everything else is enqueued */
  fcl_chain chain; /* every command's event, kept until the last completes */
} ref_run;

/* On an out-of-order queue, makes the next command wait for every command enqueued before it. */
static fcl_status step_barrier(ref_run *r) {
  if (!r->out_of_order) return FCL_SUCCESS;
  cl_uint nw;
  const cl_event *w;
  cl_event *ev;
  fcl_status st = fcl_chain_next(&r->chain, 1, &nw, &w, &ev);
  if (st) return st;
  cl_int err = clEnqueueBarrierWithWaitList(r->queue, 0, NULL, ev);
  fcl_chain_push(&r->chain);
  return err == CL_SUCCESS ? FCL_SUCCESS : fcl_cl_failure("clEnqueueBarrierWithWaitList", err);
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* One kernel argument: its size and a pointer to its value. */
typedef struct kernel_arg {
  size_t size;
  const void *value;
} kernel_arg;
#define ARG(x) ((kernel_arg){sizeof(x), &(x)})

/* What a kernel takes after its own arguments: the modifiers' (FCL_MOD_ARGS), then the sequences'
   (FCL_SEQ_ARGS); every kernel of cl/softmax.cl takes the latter. */
enum { REF_MODS = 1, REF_SEQS = 2 };

/* Sets the arguments of a shared kernel (then those `extra` names, from r->p) and enqueues it, under the
   context lock; every call checked. */
static fcl_status launch(ref_run *r, cl_kernel k, const char *name, const kernel_arg *args, cl_uint nargs,
                         unsigned extra, size_t global, const size_t *local) {
  cl_uint nw;
  const cl_event *w;
  cl_event *ev;
  fcl_status st = fcl_chain_next(&r->chain, 1, &nw, &w, &ev);
  if (st) return st;
  cl_int err = CL_SUCCESS;
  const char *call = "clSetKernelArg";
  pthread_mutex_lock(&r->ctx->lock);
  for (cl_uint a = 0; a < nargs && err == CL_SUCCESS; ++a) err = clSetKernelArg(k, a, args[a].size, args[a].value);
  if (err == CL_SUCCESS && extra) {
    cl_uint a = nargs;
    if (((extra & REF_MODS) && fcl_set_modifier_args(k, &a, r->p)) ||
        ((extra & REF_SEQS) && fcl_set_sequence_args(k, &a, r->p))) {
      pthread_mutex_unlock(&r->ctx->lock);
      return FCL_ERROR_OPENCL; /* the setter named the failing call */
    }
  }
  if (err == CL_SUCCESS) {
    call = "clEnqueueNDRangeKernel";
    err = clEnqueueNDRangeKernel(r->queue, k, 1, NULL, &global, local, nw, w, ev);
  }
  pthread_mutex_unlock(&r->ctx->lock);
  fcl_chain_push(&r->chain);
  if (err != CL_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "%s(%s)", call, name);
    return fcl_cl_failure(what, err);
  }
  return FCL_SUCCESS;
}

/* One CLBlast GEMM as a step of the chain (CLBlast takes no wait list: queue order or a barrier holds). */
static fcl_status gemm_step(ref_run *r, const char *what, CLBlastTranspose tb, size_t m, size_t n, size_t k, cl_mem a,
                            size_t a_off, size_t a_ld, size_t a_stride, cl_mem b, size_t b_off, size_t b_ld,
                            size_t b_stride, cl_mem c, size_t c_off, size_t c_ld, size_t c_stride, size_t count) {
  cl_uint nw;
  const cl_event *w;
  cl_event *ev;
  fcl_status st = fcl_chain_next(&r->chain, 1, &nw, &w, &ev);
  if (st) return st;
  CLBlastStatusCode cs = sgemm_strided_batched(CLBlastTransposeNo, tb, m, n, k, a, a_off, a_ld, a_stride, b, b_off,
                                               b_ld, b_stride, c, c_off, c_ld, c_stride, count, &r->queue, ev);
  fcl_chain_push(&r->chain);
  return cs == CLBlastSuccess ? FCL_SUCCESS : clblast_failure(what, cs);
}

/* Copies the chunk's blocks of q, k or v into float32 scratch; v's copy is cleaned and its rows marked. */
static fcl_status enqueue_gather(ref_run *r, int t, cl_mem src, int64_t first, int64_t count) {
  const fcl_problem *p = r->p;
  const int64_t *s = t == REF_Q ? p->q_stride : t == REF_K ? p->k_stride : p->v_stride;
  const cl_long off = t == REF_Q ? p->q_offset : t == REF_K ? p->k_offset : p->v_offset;
  const cl_long sb = s[0], sh = s[1], sn = s[2], first_l = first;
  const cl_int heads = (cl_int)p->heads, group = t == REF_Q ? 1 : (cl_int)p->group, keys = t != REF_Q;
  const cl_int nq = (cl_int)p->nq, nk = (cl_int)p->nk, d = (cl_int)p->d;
  const cl_long total = (cl_long)count * (keys ? nk : nq) * d;
  const size_t global = round_up((size_t)total, 64);
  if (t == REF_V) {
    const kernel_arg args[] = {ARG(src),        ARG(off),   ARG(sb),       ARG(sh),  ARG(sn),
                               ARG(r->copy[t]), ARG(r->marks), ARG(r->marked_pairs), ARG(first_l),
                               ARG(heads),      ARG(group), ARG(nq),       ARG(nk),  ARG(d), ARG(total)};
    return launch(r, r->gather_clean, "fcl_gather_clean_rows", args, sizeof args / sizeof args[0], REF_SEQS, global,
                  NULL);
  }
  const kernel_arg args[] = {ARG(src),     ARG(off),   ARG(sb),    ARG(sh), ARG(sn), ARG(r->copy[t]), ARG(first_l),
                             ARG(heads),   ARG(group), ARG(nq),    ARG(nk), ARG(keys), ARG(d),        ARG(total)};
  return launch(r, r->gather, "fcl_gather_rows", args, sizeof args / sizeof args[0], REF_SEQS, global, NULL);
}

static fcl_status enqueue_scatter(ref_run *r, cl_mem dst, int64_t first, int64_t count) {
  const fcl_problem *p = r->p;
  const cl_long off = p->o_offset, sb = p->o_stride[0], sh = p->o_stride[1], sn = p->o_stride[2], first_l = first;
  const cl_int heads = (cl_int)p->heads, nq = (cl_int)p->nq, nk = (cl_int)p->nk, d = (cl_int)p->d;
  const cl_long total = (cl_long)count * nq * d;
  const kernel_arg args[] = {ARG(r->copy[REF_O]), ARG(dst),   ARG(off), ARG(sb), ARG(sh), ARG(sn),
                             ARG(first_l),        ARG(heads), ARG(nq),  ARG(nk), ARG(d),  ARG(total)};
  return launch(r, r->scatter, "fcl_scatter_rows", args, sizeof args / sizeof args[0], REF_SEQS,
                round_up((size_t)total, 64), NULL);
}

static fcl_status enqueue_softmax(ref_run *r, cl_mem lse, int64_t first, int64_t count) {
  const fcl_problem *p = r->p;
  const cl_long lse_first = first * p->nq;
  const cl_int heads = (cl_int)p->heads, nq = (cl_int)p->nq, nk = (cl_int)p->nk, write_lse = lse != NULL;
  const size_t local = r->softmax_wg, global = (size_t)count * (size_t)p->nq * local;
  cl_mem lse_arg = lse ? lse : r->scratch_s; /* never written when write_lse is 0 */
  const kernel_arg args[] = {ARG(r->scratch_s), ARG(lse_arg), ARG(lse_first), ARG(heads),
                             ARG(nq),           ARG(nk),      ARG(p->scale),  ARG(write_lse),
                             ARG(r->marks),     ARG(r->marked_pairs),         ARG(r->hits)};
  return launch(r, r->softmax, "fcl_softmax_rows", args, sizeof args / sizeof args[0], REF_MODS | REF_SEQS, global,
                &local);
}

/* After O = P V: the rows the softmax flagged get the terms of V's non-finite elements (cl/softmax.cl), one
   launch per range of r->fixup_keys keys. o is where the GEMM wrote O: element offset of the chunk's first
   pair, between pairs, between rows. */
static fcl_status enqueue_fixup(ref_run *r, cl_mem v, cl_mem o, size_t o_off, size_t o_sp, size_t o_sn,
                                int64_t first, int64_t count) {
  const fcl_problem *p = r->p;
  const cl_long off = p->v_offset, sb = p->v_stride[0], sh = p->v_stride[1], sn = p->v_stride[2], first_l = first;
  const cl_long oo = (cl_long)o_off, osp = (cl_long)o_sp, osn = (cl_long)o_sn, rows = (cl_long)count * p->nq;
  const cl_int heads = (cl_int)p->heads, group = (cl_int)p->group, nq = (cl_int)p->nq, nk = (cl_int)p->nk;
  const cl_int d = (cl_int)p->d;
  fcl_status st = FCL_SUCCESS;
  for (int64_t k0 = 0; !st && k0 < p->nk; k0 += r->fixup_keys) {
    const cl_int lo = (cl_int)k0, hi = (cl_int)(p->nk - k0 < r->fixup_keys ? p->nk : k0 + r->fixup_keys);
    const kernel_arg args[] = {ARG(r->scratch_s), ARG(r->marks), ARG(r->hits), ARG(v),    ARG(off),   ARG(sb),
                               ARG(sh),           ARG(sn),       ARG(first_l), ARG(heads), ARG(group), ARG(o),
                               ARG(oo),           ARG(osp),      ARG(osn),     ARG(nq),    ARG(nk),    ARG(d),
                               ARG(lo),           ARG(hi),       ARG(rows)};
    if (k0 > 0) st = step_barrier(r); /* each launch adds to what the previous wrote */
    if (!st)
      st = launch(r, r->fixup, "fcl_nonfinite_fixup", args, sizeof args / sizeof args[0], REF_SEQS,
                  round_up((size_t)rows, 64), NULL);
  }
  return st;
}

/* One chunk of pairs [first, first + count): copies in, S = Q K^T, softmax, O = P V, the fixup, copy out. */
static fcl_status run_chunk(ref_run *r, cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, int64_t first,
                            int64_t count) {
  const fcl_problem *p = r->p;
  const ref_plan *rp = r->rp;
  const cl_mem in[3] = {q, k, v};
  fcl_status st;
  for (int t = REF_Q; t <= REF_V; ++t)
    if (!rp->plain[t] && (st = enqueue_gather(r, t, in[t], first, count))) return st;
  if ((st = step_barrier(r))) return st;

  /* Where each operand lives: in place (offset of the chunk's first pair, stride between pairs, row
     stride) or in its float32 copy. */
  const int64_t offs[4] = {p->q_offset, p->k_offset, p->v_offset, p->o_offset};
  const int64_t row_stride[4] = {p->q_stride[2], p->k_stride[2], p->v_stride[2], p->o_stride[2]};
  const int64_t rows[4] = {p->nq, p->nk, p->nk, p->nq};
  cl_mem buf[4];
  size_t off[4], ld[4], stride[4];
  for (int t = 0; t < 4; ++t) {
    if (rp->plain[t]) {
      const cl_mem user[4] = {q, k, v, o};
      buf[t] = user[t];
      /* Pair first = b * heads + h; its block starts at offset + first * step (equal spacing). */
      off[t] = (size_t)(offs[t] + first * rp->step[t]);
      ld[t] = (size_t)(rows[t] > 1 ? row_stride[t] : p->d);
      stride[t] = (size_t)rp->step[t];
    } else {
      buf[t] = r->copy[t];
      off[t] = 0;
      ld[t] = (size_t)p->d;
      stride[t] = (size_t)(rows[t] * p->d);
    }
  }
  const size_t nq = (size_t)p->nq, nk = (size_t)p->nk, d = (size_t)p->d;
  if ((st = gemm_step(r, "SgemmStridedBatched (S = Q K^T)", CLBlastTransposeYes, nq, nk, d, buf[REF_Q], off[REF_Q],
                       ld[REF_Q], stride[REF_Q], buf[REF_K], off[REF_K], ld[REF_K], stride[REF_K], r->scratch_s, 0, nk,
                       nq * nk, (size_t)count)) ||
      (st = step_barrier(r)) || (st = enqueue_softmax(r, lse, first, count)) || (st = step_barrier(r)) ||
      (st = gemm_step(r, "SgemmStridedBatched (O = P V)", CLBlastTransposeNo, nq, d, nk, r->scratch_s, 0, nk, nq * nk,
                      buf[REF_V], off[REF_V], ld[REF_V], stride[REF_V], buf[REF_O], off[REF_O], ld[REF_O],
                      stride[REF_O], (size_t)count)) ||
      (st = step_barrier(r)) ||
      (st = enqueue_fixup(r, v, buf[REF_O], off[REF_O], stride[REF_O], ld[REF_O], first, count)))
    return st;
  if (!rp->plain[REF_O]) {
    if ((st = step_barrier(r)) || (st = enqueue_scatter(r, o, first, count))) return st;
  }
  /* The next chunk reuses the scratch. */
  return step_barrier(r);
}

/* A scratch buffer; with init, a copy of those bytes (made at creation: nothing is enqueued). */
static fcl_status create_buffer(fcl_context *ctx, size_t bytes, void *init, cl_mem *out) {
  cl_int err;
  *out = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes, init, &err);
  if (err != CL_SUCCESS) {
    *out = NULL;
    const fcl_status st = err == CL_INVALID_BUFFER_SIZE || err == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
                                  err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY
                              ? FCL_ERROR_OUT_OF_RESOURCES
                              : FCL_ERROR_OPENCL;
    return fcl_fail(st, "reference path: clCreateBuffer of %zu bytes of scratch failed: %s (%d)", bytes,
                    fcl_cl_error_name(err), (int)err);
  }
  return FCL_SUCCESS;
}

static fcl_status create_scratch(fcl_context *ctx, size_t bytes, cl_mem *out) {
  return create_buffer(ctx, bytes, NULL, out);
}

static fcl_status create_zeroed_scratch(fcl_context *ctx, size_t bytes, cl_mem *out) {
  void *zeros = calloc(1, bytes);
  if (!zeros) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "reference path: out of host memory (%zu bytes)", bytes);
  const fcl_status st = create_buffer(ctx, bytes, zeros, out);
  free(zeros);
  return st;
}

#else /* no CLBlast */

size_t fcl_reference_scratch_bytes(fcl_context *ctx, const fcl_attention_desc *desc) {
  (void)ctx;
  (void)desc;
  return 0;
}

#endif /* FLASHCL_HAVE_CLBLAST */

fcl_status fcl_attention_reference(fcl_context *ctx, cl_command_queue queue, const fcl_attention_desc *desc,
                                   cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait,
                                   const cl_event *wait, cl_event *event) {
  fcl_problem p;
  fcl_status st = fcl_validate_forward(ctx, queue, desc, q, k, v, o, lse, NULL, num_wait, wait, &p);
  if (st) return st;
#ifndef FLASHCL_HAVE_CLBLAST
  (void)event;
  return fcl_fail(FCL_ERROR_UNSUPPORTED, "fcl_attention_reference: flashcl was built without CLBlast");
#else
  ref_plan rp;
  if ((st = make_plan(ctx, &p, &rp))) return st;

  ref_run r;
  memset(&r, 0, sizeof r);
  r.ctx = ctx;
  r.queue = queue;
  r.p = &p;
  r.rp = &rp;
  cl_command_queue_properties props = 0;
  FCL_CL_CHECK(clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL));
  r.out_of_order = (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;

  /* Everything that can fail before enqueuing: kernels, scratch. */
  pthread_mutex_lock(&ctx->lock);
  char defines[96];
  snprintf(defines, sizeof defines, "-DDTYPE=%d", (int)p.dtype);
  fcl_sequence_defines(&p, defines + strlen(defines), sizeof defines - strlen(defines));
  char mods[160];
  fcl_modifier_defines(&p, mods, sizeof mods);
  st = softmax_kernel(ctx, mods, &r.softmax, &r.softmax_wg);
  if (!st) st = fcl_softmax_within_budget(&ctx->caps, &p, r.softmax_wg);
  if (!st) st = fcl_nonfinite_within_budget(&ctx->caps, &p, &r.fixup_keys);
  if (!st && !(rp.plain[REF_Q] && rp.plain[REF_K]))
    st = fcl_get_kernel(ctx, ref_files, 2, "fcl_gather_rows", defines, &r.gather);
  if (!st) st = fcl_get_kernel(ctx, ref_files, 2, "fcl_gather_clean_rows", defines, &r.gather_clean);
  if (!st) st = fcl_get_kernel(ctx, ref_files, 2, "fcl_nonfinite_fixup", defines, &r.fixup);
  if (!st && !rp.plain[REF_O]) st = fcl_get_kernel(ctx, ref_files, 2, "fcl_scatter_rows", defines, &r.scatter);
  if (!st && lse && p.cu_q) st = fcl_get_kernel(ctx, ref_files, 2, "fcl_scatter_lse", defines, &r.scatter_lse);
  pthread_mutex_unlock(&ctx->lock);
  if (st) return st;
  st = create_scratch(ctx, rp.s_bytes, &r.scratch_s);
  for (int t = 0; t < 4 && !st; ++t)
    if (rp.copy_bytes[t]) st = create_scratch(ctx, rp.copy_bytes[t], &r.copy[t]);
  if (!st) st = create_scratch(ctx, rp.marks_bytes, &r.marks);
  if (!st) st = create_scratch(ctx, rp.hits_bytes, &r.hits);
  if (!st) st = create_zeroed_scratch(ctx, rp.pairs_bytes, &r.marked_pairs);
  if (!st && lse) st = create_scratch(ctx, rp.lse_bytes, &r.lse_tmp);

  /* The caller's wait list, honoured by a barrier: CLBlast takes none. Every step here asks for its event
     (fcl_chain_next's last = 1): which one ends the call depends on the problem, and this is the checker,
     not a speed path. */
  fcl_chain_begin(&r.chain, queue, num_wait, wait);
  if (!st && num_wait > 0) {
    cl_uint nw;
    const cl_event *w;
    cl_event *ev;
    if (!(st = fcl_chain_next(&r.chain, 1, &nw, &w, &ev))) {
      cl_int err = clEnqueueBarrierWithWaitList(queue, nw, w, ev);
      fcl_chain_push(&r.chain);
      if (err != CL_SUCCESS) st = fcl_cl_failure("clEnqueueBarrierWithWaitList", err);
    }
  }
  for (int64_t first = 0; !st && first < rp.pairs; first += rp.chunk) {
    const int64_t count = rp.pairs - first < rp.chunk ? rp.pairs - first : rp.chunk;
    st = run_chunk(&r, q, k, v, o, r.lse_tmp, first, count);
  }
  /* lse reaches the caller's buffer only once every GEMM has been accepted: a copy, or with packed queries the
     sequences' own rows into [heads, total_q]. */
  if (!st && lse && p.cu_q) {
    const cl_int heads = (cl_int)p.heads, nq = (cl_int)p.nq, nk = (cl_int)p.nk;
    const cl_long rows = (cl_long)(rp.lse_bytes / sizeof(float));
    const kernel_arg args[] = {ARG(r.lse_tmp), ARG(lse), ARG(heads), ARG(nq), ARG(nk), ARG(rows)};
    st = launch(&r, r.scatter_lse, "fcl_scatter_lse", args, sizeof args / sizeof args[0], REF_SEQS,
                round_up((size_t)rows, 64), NULL);
  } else if (!st && lse) {
    cl_uint nw;
    const cl_event *w;
    cl_event *ev;
    if (!(st = fcl_chain_next(&r.chain, 1, &nw, &w, &ev))) {
      cl_int err = clEnqueueCopyBuffer(queue, r.lse_tmp, lse, 0, 0, rp.lse_bytes, nw, w, ev);
      fcl_chain_push(&r.chain);
      if (err != CL_SUCCESS) st = fcl_cl_failure("clEnqueueCopyBuffer(lse)", err);
    }
  }
  /* A driver may run the commands queued after a failed barrier and complete them (Mesa's rusticl does): the
     last step waits on the barrier behind the caller's list as well, so a failed dependency reaches *event. */
  if (!st && num_wait > 0 && r.chain.count > 1) {
    cl_uint nw;
    const cl_event *w;
    cl_event *ev;
    if (!(st = fcl_chain_next(&r.chain, 1, &nw, &w, &ev))) {
      cl_event deps[2] = {r.chain.events[0], nw ? w[0] : r.chain.events[0]};
      cl_int err = clEnqueueMarkerWithWaitList(queue, 2, deps, ev);
      fcl_chain_push(&r.chain);
      if (err != CL_SUCCESS) st = fcl_cl_failure("clEnqueueMarkerWithWaitList", err);
    }
  }
  /* Every chunk ends with a barrier on an out-of-order queue, so the chain's last event completes after all
     of it on either kind of queue. */
  const fcl_status end = fcl_chain_end(&r.chain, st ? NULL : event);
  if (!st) st = end;
  /* Deletion is deferred by OpenCL until the enqueued commands that use them have finished. */
  if (r.scratch_s) clReleaseMemObject(r.scratch_s);
  if (r.lse_tmp) clReleaseMemObject(r.lse_tmp);
  if (r.marks) clReleaseMemObject(r.marks);
  if (r.hits) clReleaseMemObject(r.hits);
  if (r.marked_pairs) clReleaseMemObject(r.marked_pairs);
  for (int t = 0; t < 4; ++t)
    if (r.copy[t]) clReleaseMemObject(r.copy[t]);
  return st;
#endif
}
