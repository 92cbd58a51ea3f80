/* Shared test support: device selection, random inputs, dtype rounding, strided layouts, the float64
 * host reference of attention, and error measures. */
#ifndef FLASHCL_TEST_UTIL_H
#define FLASHCL_TEST_UTIL_H

#include <flashcl.h>
#include <stdio.h>

typedef struct test_env {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  fcl_context *fcl;
  char device_name[256];
  int has_fp64;
} test_env;

/* Opens the device named by $FLASHCL_TEST_DEVICE (index or name substring; default: the first GPU, else
   the first device) with a profiling queue and an fcl_context. Returns 0 on success. */
int test_open(test_env *env, const fcl_context_options *options);
void test_close(test_env *env);
/* A second fcl_context on env's device whose forward splits no key range for occupancy (FLASHCL_FORWARD_SPLITS=1
   while it is created; the caller's setting is restored): a launch at a loop budget's edge stays whole, and only
   the budget may split it. NULL on failure. */
fcl_context *test_context_unsplit(test_env *env);

/* Random numbers: seeded from $FLASHCL_TEST_SEED or the clock; the seed is printed. */
void test_seed(void);
unsigned long long test_seed_value(void);
double test_uniform(void); /* in [-1, 1) */
/* Restarts the calling thread's stream from the seed and a name: the same name draws the same numbers. */
void test_reseed(const char *name);

/* dtype storage. */
size_t dtype_size(fcl_dtype t);
const char *dtype_name(fcl_dtype t);
float round_to_dtype(float x, fcl_dtype t);
void encode_dtype(float x, fcl_dtype t, void *dst);
float decode_dtype(const void *src, fcl_dtype t);

/* Layouts of a [batch, heads, rows, d] tensor. */
enum { LAYOUT_BHND = 0, LAYOUT_BNHD = 1, LAYOUT_PADDED = 2 };
/* Fills stride[3] and *offset for the layout and returns the buffer length in elements. */
size_t layout_strides(int layout, long long b, long long h, long long n, long long d, long long stride[3],
                      long long *offset);

/* A device tensor with a host copy of its logical contents as float (already rounded to the dtype). */
typedef struct test_tensor {
  long long b, h, n, d;
  long long stride[3], offset;
  size_t elems; /* buffer length in elements */
  fcl_dtype dtype;
  cl_mem buf;
  float *host; /* logical [b][h][n][d] */
} test_tensor;

/* Creates the tensor; random contents when fill_random, else the buffer is poisoned with NaN. */
int tensor_create(test_env *env, test_tensor *t, long long b, long long h, long long n, long long d, int layout,
                  fcl_dtype dtype, int fill_random);
/* Writes t->host into the buffer, NaN everywhere outside the tensor. */
int tensor_upload(test_env *env, test_tensor *t);
/* Writes NaN over every element of the buffer (not only the logical ones). */
int tensor_poison(test_env *env, test_tensor *t);
/* Reads the logical contents back into t->host. */
int tensor_read(test_env *env, test_tensor *t);
/* 1 when every element of the buffer outside the tensor (padding, the offset) still holds the NaN poison. */
int tensor_gaps_untouched(test_env *env, const test_tensor *t);
void tensor_release(test_tensor *t);
/* Copies the tensor's strides and offset into a descriptor's fields. */
void tensor_to_desc(const test_tensor *t, int64_t stride[3], int64_t *offset);

/* A float64 copy of n floats (malloc'd). */
double *to_double(const float *x, size_t n);

/* ||out - ref|| / ||ref|| (ref norm floored at 1e-30) and max |out - ref|; NaN in out gives +inf. */
double rel_error(const float *out, const double *ref, size_t n, double *max_abs);

cl_mem create_float_buffer(test_env *env, size_t count, float fill);
int read_floats(test_env *env, cl_mem buf, float *dst, size_t count);

/* Counting checks for the closing "N passed, N failed" line. */
extern int test_passed, test_failed, test_skipped;
void check(int ok, const char *fmt, ...);
void skip(const char *fmt, ...);
int test_summary(const char *suite);

#endif
