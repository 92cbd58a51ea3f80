/* Several threads share one fcl_context, each with its own queue and its own inputs, and every result
 * matches the host reference. The first use of each kernel variant happens concurrently too. */
#include "forward_check.h"

#include <pthread.h>

#define THREADS 4
#define ROUNDS 3

typedef struct worker {
  test_env *env;
  int index;
  cl_command_queue queue;
  int failures;
} worker;

static void *run(void *arg) {
  worker *w = arg;
  static const fcl_dtype dtypes[] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  for (int r = 0; r < ROUNDS; ++r) {
    fwd_case c = {1 + w->index % 2, 3, 0, 33 + 7 * w->index, 50 + 5 * r, w->index % 2 ? 64 : 40,
                  dtypes[(w->index + r) % 3], (w->index + r) % 2, LAYOUT_BHND, 0, 1};
    int res = run_forward_case(w->env, w->queue, &c, fcl_attention_forward, "thread");
    if (res == 1) ++w->failures;
  }
  return NULL;
}

int main(void) {
  test_seed();
  test_env env;
  if (test_open(&env, NULL)) return 1;
  worker workers[THREADS];
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    cl_int err;
    workers[i] = (worker){&env, i, clCreateCommandQueue(env.context, env.device, 0, &err), 0};
    if (err != CL_SUCCESS) return 1;
  }
  for (int i = 0; i < THREADS; ++i) pthread_create(&threads[i], NULL, run, &workers[i]);
  for (int i = 0; i < THREADS; ++i) pthread_join(threads[i], NULL);
  for (int i = 0; i < THREADS; ++i) clReleaseCommandQueue(workers[i].queue);
  test_close(&env);
  return test_summary("test_threads");
}
