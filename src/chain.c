/* An event chain: the commands of one operation enqueued in order, each behind the one before, whose
 * events all stay alive until the last command has completed or failed.
 *
 * Why: when a command fails (a user event in the caller's wait list set to an error status), the OpenCL
 * runtime marks every command that depends on it as failed, walking the dependents' events. PoCL aborts
 * the process (pocl_update_event_failed) when it reaches an event the application has already released.
 * So an operation must not release the events of its intermediate commands right after enqueuing them:
 * they are kept here and released by a completion callback on the last event, which the OpenCL specification
 * runs whether that event completes or fails (PoCL 3.1 runs none for an event failed through its wait list:
 * there a failed operation's events are never released, a leak on the safe side). The last event's status
 * tells the caller whether the operation ran.
 *
 * A call with no wait list on an in-order queue gives only its last command an event: the queue orders the
 * others, and on a profiling queue an event costs device time (NVIDIA's OpenCL: about 2.4 us between two
 * kernels, docs/notes-nvidia.md v13). With a wait list every command keeps its event: PoCL's propagation of
 * a failed wait-list event through commands without events of their own crashes it on sub-buffers
 * (test_events). A failure that reaches a call only through queue order (an earlier command of the
 * application's behind a user event that fails) crashes PoCL 3.1 on sub-buffers with or without those
 * events, so no choice here helps that case. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void fcl_chain_begin(fcl_chain *c, cl_command_queue queue, cl_uint num_wait, const cl_event *wait) {
  memset(c, 0, sizeof *c);
  c->queue = queue;
  c->num_wait = num_wait;
  c->wait = num_wait ? wait : NULL;
  c->in_order = num_wait == 0 && fcl_queue_in_order(queue);
}

int fcl_queue_in_order(cl_command_queue queue) {
  cl_command_queue_properties props = 0;
  return clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL) == CL_SUCCESS &&
         !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
}

/* The events a callback releases (the chain's array, handed over). */
typedef struct chain_release {
  size_t count;
  cl_event *events;
} chain_release;

fcl_status fcl_chain_next(fcl_chain *c, int last, cl_uint *num_wait, const cl_event **wait, cl_event **event) {
  if (!c->record && !(c->record = malloc(sizeof(chain_release))))
    return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory for an event chain");
  if (c->count == c->capacity) {
    const size_t cap = c->capacity ? 2 * c->capacity : 8;
    cl_event *grown = realloc(c->events, cap * sizeof *grown);
    if (!grown) return fcl_fail(FCL_ERROR_OUT_OF_RESOURCES, "out of host memory for an event chain");
    c->events = grown;
    c->capacity = cap;
  }
  c->events[c->count] = NULL;
  if (c->count == 0) { /* the first command, or one after commands without events (no wait list then) */
    *num_wait = c->num_wait;
    *wait = c->wait;
  } else {
    *num_wait = 1;
    *wait = &c->events[c->count - 1];
  }
  *event = c->in_order && !last ? NULL : &c->events[c->count];
  return FCL_SUCCESS;
}

void fcl_chain_push(fcl_chain *c) {
  if (c->count < c->capacity && c->events[c->count]) ++c->count;
}

static void CL_CALLBACK release_events(cl_event event, cl_int status, void *user_data) {
  (void)event;
  (void)status;
  chain_release *r = user_data;
  for (size_t i = 0; i < r->count; ++i) clReleaseEvent(r->events[i]);
  free(r->events);
  free(r);
}

fcl_status fcl_chain_end(fcl_chain *c, cl_event *event) {
  fcl_status st = FCL_SUCCESS;
  chain_release *r = c->record;
  if (c->count > 0) {
    cl_event last = c->events[c->count - 1];
    /* The caller takes the last event's reference; the callback releases all the others (the last too when
       the caller did not ask for it: releasing an event from its own callback is allowed). */
    const size_t n = event ? c->count - 1 : c->count;
    if (n == 0) {
      *event = last;
    } else {
      r->count = n;
      r->events = c->events;
      const cl_int err = clSetEventCallback(last, CL_COMPLETE, release_events, r);
      if (err == CL_SUCCESS) {
        if (event) *event = last;
        r = NULL; /* the callback's now, with the array */
        c->events = NULL;
      } else {
        st = fcl_cl_failure("clSetEventCallback", err); /* the events stay unreleased: fcl_chain_end's comment */
      }
    }
  }
  free(r);
  free(c->events);
  memset(c, 0, sizeof *c);
  return st;
}
