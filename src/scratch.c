/* Device scratch that the context owns: one buffer per command queue, for the partial results of
 * split-KV. A buffer is reused by every later call on its queue (steady-state calls allocate nothing)
 * and grows when a call needs more; calls on different queues never share one. On an out-of-order queue
 * the completion event of a buffer's last use is kept, so the next call waits for it before overwriting; an
 * in-order queue orders the uses itself, and a wait list there would cost the call's event chain its single
 * event (chain.c). The queue is retained until fcl_context_release.
 *
 * So on an out-of-order queue a call whose previous use fails by a failed dependency of its own fails too,
 * if it was enqueued before that failure (OpenCL fails whatever waits on a failed event; docs/api.md says so).
 * A user event opened by a callback on the last use would break that link, but PoCL 3.1 runs no
 * CL_COMPLETE callback for an event failed through its wait list, so the next call would wait forever. */
#include "internal.h"

#include <stdlib.h>

struct fcl_scratch {
  cl_command_queue queue;
  cl_mem buf;
  size_t size;
  int in_order;   /* the queue runs commands in order: no last use is kept */
  cl_event last; /* out of order: completion of the buffer's last use; NULL: none pending */
  fcl_scratch *next;
};

fcl_status fcl_scratch_get(fcl_context *ctx, cl_command_queue queue, size_t bytes, cl_mem *buf, cl_event *last) {
  fcl_scratch *s = ctx->scratch;
  while (s && s->queue != queue) s = s->next;
  if (!s) {
    if (!(s = calloc(1, sizeof *s))) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory");
    const cl_int err = clRetainCommandQueue(queue);
    if (err != CL_SUCCESS) {
      free(s);
      return fcl_cl_failure("clRetainCommandQueue", err);
    }
    s->queue = queue;
    s->in_order = fcl_queue_in_order(queue);
    s->next = ctx->scratch;
    ctx->scratch = s;
  }
  if (s->size < bytes) {
    /* OpenCL defers the old buffer's deletion until the commands that use it have finished. */
    if (s->buf) clReleaseMemObject(s->buf);
    s->buf = NULL;
    s->size = 0;
    cl_int err;
    cl_mem b = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
      return fcl_fail(err == CL_INVALID_BUFFER_SIZE || err == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
                              err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY
                          ? FCL_ERROR_OUT_OF_RESOURCES
                          : FCL_ERROR_OPENCL,
                      "split-KV scratch: clCreateBuffer of %zu bytes failed: %s (%d)", bytes, fcl_cl_error_name(err),
                      (int)err);
    s->buf = b;
    s->size = bytes;
  }
  /* A last use that has finished needs no waiting; one that failed never ran and must not be waited on: a
     command whose wait list holds an event that has already failed never runs or fails under PoCL (it
     hangs whoever waits for it), and would fail this call for another call's dependency. */
  cl_int status = CL_QUEUED;
  if (s->last &&
      clGetEventInfo(s->last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) == CL_SUCCESS &&
      (status == CL_COMPLETE || status < 0)) {
    clReleaseEvent(s->last);
    s->last = NULL;
  }
  *buf = s->buf;
  *last = s->last;
  return FCL_SUCCESS;
}

void fcl_scratch_used(fcl_context *ctx, cl_command_queue queue, cl_event done) {
  for (fcl_scratch *s = ctx->scratch; s; s = s->next)
    if (s->queue == queue) {
      if (s->in_order) return;
      if (s->last) clReleaseEvent(s->last);
      s->last = done;
      if (done) clRetainEvent(done);
      return;
    }
}

size_t fcl_scratch_bytes(const fcl_context *ctx) {
  size_t n = 0;
  for (const fcl_scratch *s = ctx->scratch; s; s = s->next) n += s->size;
  return n;
}

void fcl_scratch_release_all(fcl_context *ctx) {
  fcl_scratch *s = ctx->scratch;
  while (s) {
    fcl_scratch *next = s->next;
    if (s->last) clReleaseEvent(s->last);
    if (s->buf) clReleaseMemObject(s->buf);
    clReleaseCommandQueue(s->queue);
    free(s);
    s = next;
  }
  ctx->scratch = NULL;
}
