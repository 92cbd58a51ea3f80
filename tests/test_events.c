/* A failed dependency: every operation enqueued behind a user event that the application then fails must
 * neither crash the process (the OpenCL runtime propagates the failure through the operation's internal
 * events, which must still exist) nor report success: the returned event ends with a negative status.
 * Each case runs in its own process, so a crash fails that case alone.
 *
 * And the context's split-KV scratch, which calls on one out-of-order queue share: a call after one behind a
 * failed dependency waits for it and must end (complete or fail) rather than hang, and one with its own workspace
 * must complete wherever the runtime runs independent commands past a failed one (forward_split_ooo).
 *
 *   test_events                 the suite
 *   test_events --child NAME    (internal) one case; exit 0 when the returned event failed and nothing crashed */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { B = 1, H = 2, N = 40, D = 16 };
#define ELEMS ((size_t)B * H * N * D)

/* One buffer carved into sub-buffers (as frameworks hand out tensors from a pool), or separate buffers. */
typedef struct bufs {
  cl_mem parent, m[10]; /* q k v o lse d_o d_q d_k d_v workspace */
  cl_mem ws;            /* a split forward's workspace */
} bufs;

static int make_bufs(test_env *e, int sub, bufs *b) {
  memset(b, 0, sizeof *b);
  cl_uint align_bits = 0;
  clGetDeviceInfo(e->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
  size_t align = align_bits / 8 ? align_bits / 8 : 128;
  const size_t slot = (ELEMS * 4 + align - 1) / align * align;
  cl_int err;
  float *fill = malloc(slot * 10);
  for (size_t i = 0; i < slot * 10 / 4; ++i) fill[i] = (float)test_uniform();
  if (sub) {
    b->parent = clCreateBuffer(e->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, slot * 10, fill, &err);
    for (int i = 0; i < 10 && err == CL_SUCCESS; ++i) {
      cl_buffer_region r = {slot * (size_t)i, ELEMS * 4};
      b->m[i] = clCreateSubBuffer(b->parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
    }
  } else {
    err = CL_SUCCESS;
    for (int i = 0; i < 10 && err == CL_SUCCESS; ++i)
      b->m[i] = clCreateBuffer(e->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, ELEMS * 4, fill, &err);
  }
  free(fill);
  if (err == CL_SUCCESS) b->ws = clCreateBuffer(e->context, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
  return err == CL_SUCCESS ? 0 : -1;
}

/* Whether the runtime runs the commands of an out-of-order queue that wait on nothing when an earlier one waits on
   a user event that then fails (1), or fails them with it (0); -1 when the question could not be put. OpenCL allows
   both: PoCL runs them; NVIDIA's OpenCL holds every later command of the queue and fails it (docs/testing.md). Asked
   with a fill and a kernel, as the calls use both, in a context of its own: the failure leaves the context it
   happens in implementation-defined. */
static int runs_past_failed_event(cl_device_id device) {
  static const char *source = "__kernel void one(__global float *x) { x[0] = 1.0f; }";
  cl_int err;
  cl_context c = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (err != CL_SUCCESS) return -1;
  int answer = -1;
  cl_command_queue q = clCreateCommandQueue(c, device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  cl_mem a = clCreateBuffer(c, CL_MEM_READ_WRITE, 64, NULL, &err);
  cl_mem x = clCreateBuffer(c, CL_MEM_READ_WRITE, 64, NULL, &err);
  cl_program prog = clCreateProgramWithSource(c, 1, &source, NULL, &err);
  const int built = prog && clBuildProgram(prog, 1, &device, "", NULL, NULL) == CL_SUCCESS;
  cl_kernel k = built ? clCreateKernel(prog, "one", &err) : NULL;
  cl_event user = clCreateUserEvent(c, &err), ev[3] = {NULL, NULL, NULL};
  const float zero = 0.0f;
  const size_t one = 1;
  if (q && a && x && k && user && clSetKernelArg(k, 0, sizeof x, &x) == CL_SUCCESS &&
      clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, sizeof zero, 1, &user, &ev[0]) == CL_SUCCESS &&
      clEnqueueFillBuffer(q, x, &zero, sizeof zero, 4, sizeof zero, 0, NULL, &ev[1]) == CL_SUCCESS &&
      clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, &ev[2]) == CL_SUCCESS) {
    clSetUserEventStatus(user, -1);
    clFinish(q);
    cl_int s1 = 1, s2 = 1;
    clGetEventInfo(ev[1], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s1, &s1, NULL);
    clGetEventInfo(ev[2], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s2, &s2, NULL);
    answer = s1 == CL_COMPLETE && s2 == CL_COMPLETE ? 1 : s1 < 0 && s2 < 0 ? 0 : -1;
  } else if (user) {
    clSetUserEventStatus(user, -1);
  }
  if (q) clFinish(q);
  for (int i = 0; i < 3; ++i)
    if (ev[i]) clReleaseEvent(ev[i]);
  if (user) clReleaseEvent(user);
  if (k) clReleaseKernel(k);
  if (prog) clReleaseProgram(prog);
  if (a) clReleaseMemObject(a);
  if (x) clReleaseMemObject(x);
  if (q) clReleaseCommandQueue(q);
  clReleaseContext(c);
  return answer;
}

/* Split forwards on one out-of-order queue: the first behind a user event that then fails; then, enqueued before
   the failure with no wait list, one through the context's scratch (it waits for the first's use of it, so
   docs/api.md lets it fail too, and it must end either way) and one with a workspace of its own, which adds no
   dependency: it must complete where the runtime runs independent commands past a failed one, and end either way.
   Exit 0 when all three ended so. */
static int child_ooo(test_env *e, bufs *b, const fcl_attention_desc *desc) {
  cl_int err;
  cl_command_queue ooo = clCreateCommandQueue(e->context, e->device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  if (err != CL_SUCCESS) {
    printf("     forward_split_ooo: the device has no out-of-order queue (%d): not run\n", (int)err);
    return 0;
  }
  const int runs_past = runs_past_failed_event(e->device);
  if (runs_past < 0) {
    printf("     forward_split_ooo: could not ask the runtime what it does with independent commands\n");
    clReleaseCommandQueue(ooo);
    return 4;
  }
  printf("     forward_split_ooo: the runtime %s\n",
         runs_past ? "runs independent commands past one behind a failed user event"
                   : "fails the later commands of the queue with one behind a failed user event: the call with its "
                     "own workspace may fail too");
  cl_event user = clCreateUserEvent(e->context, &err), ev[3] = {NULL, NULL, NULL};
  fcl_status st[3];
  st[0] = fcl_attention_forward(e->fcl, ooo, desc, b->m[0], b->m[1], b->m[2], b->m[3], b->m[4], 1, &user, &ev[0]);
  st[1] = fcl_attention_forward(e->fcl, ooo, desc, b->m[0], b->m[1], b->m[2], b->m[5], b->m[6], 0, NULL, &ev[1]);
  st[2] = fcl_attention_forward_with_workspace(e->fcl, ooo, desc, b->m[0], b->m[1], b->m[2], b->m[7], b->m[8], b->ws,
                                               0, NULL, &ev[2]);
  clSetUserEventStatus(user, -1);
  cl_int s[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i)
    if (ev[i]) {
      clWaitForEvents(1, &ev[i]);
      clGetEventInfo(ev[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s[i], &s[i], NULL);
      clReleaseEvent(ev[i]);
    }
  clFinish(ooo);
  printf("     forward_split_ooo: %s, %s, %s; events ended with %d (behind the failure), %d (the scratch after it), "
         "%d (a workspace of its own)\n", fcl_status_string(st[0]), fcl_status_string(st[1]), fcl_status_string(st[2]),
         (int)s[0], (int)s[1], (int)s[2]);
  clReleaseEvent(user);
  clReleaseCommandQueue(ooo);
  const int ok = !st[0] && !st[1] && !st[2] && s[0] < 0 && (s[1] == CL_COMPLETE || s[1] < 0) &&
                 (s[2] == CL_COMPLETE || (!runs_past && s[2] < 0));
  return ok ? 0 : 4;
}

static int child(const char *name) {
  alarm(120); /* a hang ends the case (SIGALRM) instead of the suite */
  /* Split-KV: the partials and their combine are two commands. */
  const int split = strstr(name, "split") != NULL;
  if (split) setenv("FLASHCL_FORWARD_SPLITS", "4", 1);
  test_seed();
  test_env e;
  if (test_open(&e, NULL)) return 2;
  const int sub = strstr(name, "sub") != NULL;
  bufs b;
  if (make_bufs(&e, sub, &b)) return 2;
  fcl_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.batch = B, desc.num_heads = H, desc.seqlen_q = N, desc.seqlen_k = N, desc.head_dim = D, desc.causal = 1;
  if (strstr(name, "ooo")) return child_ooo(&e, &b, &desc);
  cl_int err;
  cl_event user = clCreateUserEvent(e.context, &err);
  if (err != CL_SUCCESS) return 2;
  cl_event done = NULL;
  fcl_status st;
  if (strncmp(name, "forward", 7) == 0 && strstr(name, "workspace"))
    st = fcl_attention_forward_with_workspace(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4],
                                              b.ws, 1, &user, &done);
  else if (strncmp(name, "forward", 7) == 0)
    st = fcl_attention_forward(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4], 1, &user, &done);
  else if (strncmp(name, "reference", 9) == 0)
    st = fcl_attention_reference(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4], 1, &user, &done);
  else
    st = fcl_attention_backward(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4], b.m[5], b.m[6],
                                b.m[7], b.m[8], b.m[9], 1, &user, strstr(name, "noevent") ? NULL : &done);
  if (st != FCL_SUCCESS) {
    printf("     %s: %s: %s\n", name, fcl_status_string(st), fcl_last_error());
    return 3;
  }
  clSetUserEventStatus(user, -1); /* the application's upstream work failed */
  cl_int status = 0;
  if (done) {
    clWaitForEvents(1, &done);
    clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    clReleaseEvent(done);
  } else {
    status = -1; /* no event to ask: surviving is the check */
  }
  clFinish(e.queue);
  /* A failure must not outlive its call: the same operation again, with no wait list, completes. */
  if (split && status < 0) {
    cl_event again = NULL;
    st = strstr(name, "workspace")
             ? fcl_attention_forward_with_workspace(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4],
                                                    b.ws, 0, NULL, &again)
             : fcl_attention_forward(e.fcl, e.queue, &desc, b.m[0], b.m[1], b.m[2], b.m[3], b.m[4], 0, NULL, &again);
    cl_int again_status = -1;
    if (st == FCL_SUCCESS) {
      clWaitForEvents(1, &again);
      clGetEventInfo(again, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof again_status, &again_status, NULL);
      clReleaseEvent(again);
    }
    printf("     %s: the next call without a wait list: %s, event status %d\n", name, fcl_status_string(st),
           (int)again_status);
    if (again_status != CL_COMPLETE) status = 0; /* fails the case below */
  }
  clReleaseEvent(user);
  for (int i = 0; i < 10; ++i) clReleaseMemObject(b.m[i]);
  clReleaseMemObject(b.ws);
  if (b.parent) clReleaseMemObject(b.parent);
  test_close(&e);
  printf("     %s: the returned event ended with status %d\n", name, (int)status);
  return status < 0 ? 0 : 4;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  static const char *const cases[] = {"forward",       "forward_sub",          "forward_split",
                                      "forward_split_workspace", "forward_split_ooo", "backward",  "backward_sub",
                                      "backward_sub_noevent",    "reference", "reference_sub"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      execl(argv[0], argv[0], "--child", cases[i], (char *)NULL);
      _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    const int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    check(ok, "%s behind a failed user event: no crash, the returned event reports the failure (%s %d)", cases[i],
          WIFSIGNALED(ws) ? "signal" : "exit", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
  }
  return test_summary("test_events");
}
