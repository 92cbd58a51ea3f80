/* Every validation rule of fcl_context_create and fcl_attention_forward: the exact status, a message
 * naming the problem, nothing enqueued (the output stays poisoned) and *event left untouched. */
#include "forward_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fixture {
  test_env *env;
  fcl_attention_desc desc;
  test_tensor q, k, v, o;
  cl_mem lse;
} fixture;

static fixture fx;

static void reset_desc(void) {
  memset(&fx.desc, 0, sizeof fx.desc);
  fx.desc.batch = 2, fx.desc.num_heads = 4, fx.desc.num_kv_heads = 2;
  fx.desc.seqlen_q = 9, fx.desc.seqlen_k = 11, fx.desc.head_dim = 16;
  fx.desc.dtype = FCL_DTYPE_F32;
}

static int output_untouched(void) {
  if (tensor_read(fx.env, &fx.o)) return 0;
  for (size_t i = 0; i < (size_t)(fx.o.b * fx.o.h * fx.o.n * fx.o.d); ++i)
    if (!isnan(fx.o.host[i])) return 0;
  return 1;
}

/* Calls forward with the current fixture (buffers overridable) and checks status, message, no effect. */
static void expect(fcl_status want, const char *what, fcl_context *ctx, cl_command_queue queue, cl_mem q, cl_mem k,
                   cl_mem v, cl_mem o, cl_mem lse, cl_uint num_wait, const cl_event *wait,
                   const char *must_mention) {
  cl_event sentinel = (cl_event)(uintptr_t)0x1234;
  cl_event ev = sentinel;
  fcl_status st = fcl_attention_forward(ctx, queue, &fx.desc, q, k, v, o, lse, num_wait, wait, &ev);
  const char *msg = fcl_last_error();
  int mentions = must_mention == NULL || strstr(msg, must_mention) != NULL;
  check(st == want && strlen(msg) > 0 && mentions && ev == sentinel && output_untouched(), "%s -> %s: \"%s\"", what,
        fcl_status_string(st), msg);
  if (st == FCL_SUCCESS && ev != sentinel) clReleaseEvent(ev);
}

#define EXPECT_DESC(want, what, field, statement) \
  do {                                            \
    reset_desc();                                 \
    statement;                                    \
    expect(want, what, fx.env->fcl, fx.env->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0, NULL, field); \
  } while (0)

int main(void) {
  test_seed();
  test_env env;
  if (test_open(&env, NULL)) return 1;
  fx.env = &env;
  reset_desc();
  if (tensor_create(&env, &fx.q, 2, 4, 9, 16, LAYOUT_BHND, FCL_DTYPE_F32, 1) ||
      tensor_create(&env, &fx.k, 2, 2, 11, 16, LAYOUT_BHND, FCL_DTYPE_F32, 1) ||
      tensor_create(&env, &fx.v, 2, 2, 11, 16, LAYOUT_BHND, FCL_DTYPE_F32, 1) ||
      tensor_create(&env, &fx.o, 2, 4, 9, 16, LAYOUT_BHND, FCL_DTYPE_F32, 0) ||
      !(fx.lse = create_float_buffer(&env, 2 * 4 * 9, NAN)))
    return 1;
  test_env *e = &env;

  /* The descriptor, field by field. */
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "batch 0", "batch", fx.desc.batch = 0);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "batch -1", "batch", fx.desc.batch = -1);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "num_heads 0", "num_heads", fx.desc.num_heads = 0);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "num_kv_heads -2", "num_kv_heads", fx.desc.num_kv_heads = -2);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "num_kv_heads 3 of 4", "num_kv_heads", fx.desc.num_kv_heads = 3);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "seqlen_q 0", "seqlen_q", fx.desc.seqlen_q = 0);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "seqlen_k 0", "seqlen_k", fx.desc.seqlen_k = 0);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "head_dim 0", "head_dim", fx.desc.head_dim = 0);
  EXPECT_DESC(FCL_ERROR_UNSUPPORTED, "head_dim 257", "head_dim", fx.desc.head_dim = 257);
  EXPECT_DESC(FCL_ERROR_UNSUPPORTED, "seqlen_q 2^40", "seqlen_q", fx.desc.seqlen_q = 1ll << 40);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "dtype 7", "dtype", fx.desc.dtype = (fcl_dtype)7);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "scale NaN", "scale", fx.desc.scale = NAN);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "scale infinite", "scale", fx.desc.scale = INFINITY);
  /* Kernels scale by scale * log2(e) in float: a scale whose product overflows would give all-NaN output. */
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "scale 3e38 (scale * log2(e) overflows)", "scale", fx.desc.scale = 3e38f);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "scale -3e38", "scale", fx.desc.scale = -3e38f);
  /* A softcap whose cap in log2 units (or its inverse) is no finite normal float made every score NaN. */
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "softcap 3e38 (softcap * log2(e) overflows)", "softcap", fx.desc.softcap = 3e38f);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "softcap 1e38 (a subnormal inverse)", "softcap", fx.desc.softcap = 1e38f);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "softcap 1e-39 (subnormal)", "softcap", fx.desc.softcap = 1e-39f);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "causal 2", "causal", fx.desc.causal = 2);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "negative stride", "q_stride[1]",
              (fx.desc.q_stride[0] = 576, fx.desc.q_stride[1] = -1, fx.desc.q_stride[2] = 16));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "negative offset", "k_offset", fx.desc.k_offset = -4);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "overlapping output rows", "o_stride",
              (fx.desc.o_stride[0] = 576, fx.desc.o_stride[1] = 144, fx.desc.o_stride[2] = 8));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "output heads on top of each other", "o_stride",
              (fx.desc.o_stride[0] = 16, fx.desc.o_stride[1] = 0, fx.desc.o_stride[2] = 4));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "output batches on top of each other", "o_stride",
              (fx.desc.o_stride[0] = 0, fx.desc.o_stride[1] = 144, fx.desc.o_stride[2] = 16));

  /* Buffers that are too small for the descriptor's sizes, strides or offsets. */
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "q one head too many", "q", fx.desc.num_heads = 8);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "k seqlen past the buffer", "k is too small", fx.desc.seqlen_k = 12);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "v offset past the buffer", "v is too small", fx.desc.v_offset = 1);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "o stride past the buffer", "o is too small",
              (fx.desc.o_stride[0] = 1000, fx.desc.o_stride[1] = 144, fx.desc.o_stride[2] = 16));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "huge stride", "stride",
              (fx.desc.q_stride[0] = 1ll << 62, fx.desc.q_stride[1] = 144, fx.desc.q_stride[2] = 16));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "largest stride", "stride",
              (fx.desc.q_stride[0] = INT64_MAX, fx.desc.q_stride[1] = 144, fx.desc.q_stride[2] = 16));
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "offset 2^62", "offset", fx.desc.o_offset = 1ll << 62);
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "offset INT64_MAX (wraps if unchecked)", "offset",
              fx.desc.o_offset = INT64_MAX);
  /* Broadcast inputs and overlapping outputs: the overlap check refuses before any count could wrap. */
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "2^60 query rows on one output row", "o_stride",
              (fx.desc.batch = 1ll << 30, fx.desc.num_heads = 1ll << 30, fx.desc.num_kv_heads = 0,
               fx.desc.seqlen_q = 4, fx.desc.q_stride[2] = 1, fx.desc.k_stride[2] = 1, fx.desc.v_stride[2] = 1,
               fx.desc.o_stride[0] = 0, fx.desc.o_stride[1] = 0, fx.desc.o_stride[2] = 16));
  /* The workspace size of a descriptor whose row count exceeds the address range is 0, with a message. */
  reset_desc();
  fx.desc.batch = 1ll << 30, fx.desc.num_heads = 1ll << 30, fx.desc.num_kv_heads = 0, fx.desc.seqlen_q = 1ll << 29;
  size_t ws = fcl_attention_backward_workspace_size(e->fcl, &fx.desc);
  check(ws == 0 && strstr(fcl_last_error(), "too large"), "workspace size of 2^89 rows -> %zu: \"%s\"", ws,
        fcl_last_error());
  EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "f32 buffers described as f16 but too few", "lse",
              (fx.desc.dtype = FCL_DTYPE_F16, fx.desc.seqlen_q = 18));

  /* Packed and paged sequences: the fields and the index buffers' sizes (their contents are the kernels' to
     distrust: tests/test_sequences.c). */
  {
    static const int cu[3] = {0, 4, 9}, table[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    cl_int err;
    cl_mem cu_buf = clCreateBuffer(e->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof cu, (void *)cu, &err);
    cl_mem short_cu = clCreateBuffer(e->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 2 * sizeof(int), (void *)cu, &err);
    cl_mem tab = clCreateBuffer(e->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof table, (void *)table, &err);
    cl_mem one = clCreateBuffer(e->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int), (void *)cu, &err);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "total_q without cu_seqlens_q", "total_q", fx.desc.total_q = 9);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "cu_seqlens_q with total_q 0", "total_q", fx.desc.cu_seqlens_q = cu_buf);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "total_q 2^31", "total_q",
                (fx.desc.cu_seqlens_q = cu_buf, fx.desc.total_q = 1ll << 31));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "cu_seqlens_q of batch entries, not batch + 1", "cu_seqlens_q",
                (fx.desc.cu_seqlens_q = short_cu, fx.desc.total_q = 9));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "q too small for total_q packed rows", "q is too small",
                (fx.desc.cu_seqlens_q = cu_buf, fx.desc.total_q = 40));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "a negative q_stride[0] where packing leaves it unused", "q_stride[0]",
                (fx.desc.cu_seqlens_q = cu_buf, fx.desc.total_q = 9, fx.desc.q_stride[0] = -5));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "total_k without cu_seqlens_k", "total_k", fx.desc.total_k = 3);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "seqlens_k of one entry for a batch of 2", "seqlens_k", fx.desc.seqlens_k = one);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "cu_seqlens_k and block_table together", "block_table",
                (fx.desc.cu_seqlens_k = cu_buf, fx.desc.total_k = 11, fx.desc.block_table = tab,
                 fx.desc.block_table_stride = 4, fx.desc.block_size = 4, fx.desc.num_blocks = 4));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "block_size without block_table", "block_table", fx.desc.block_size = 16);
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "block_size 1025", "block_size",
                (fx.desc.block_table = tab, fx.desc.block_table_stride = 4, fx.desc.block_size = 1025,
                 fx.desc.num_blocks = 1));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "num_blocks 0", "num_blocks",
                (fx.desc.block_table = tab, fx.desc.block_table_stride = 4, fx.desc.block_size = 4));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "seqlen_k beyond the table's reach", "block_table_stride",
                (fx.desc.block_table = tab, fx.desc.block_table_stride = 2, fx.desc.block_size = 4,
                 fx.desc.num_blocks = 4));
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "block_table of fewer than batch * stride entries", "block_table",
                (fx.desc.block_table = tab, fx.desc.block_table_stride = 5, fx.desc.block_size = 4,
                 fx.desc.num_blocks = 4));
    /* k holds 2 * 2 * 11 rows of 16: 4 blocks of 2 heads x 4 rows fit, 6 do not. */
    EXPECT_DESC(FCL_ERROR_INVALID_ARGUMENT, "k pool smaller than num_blocks blocks", "k is too small",
                (fx.desc.block_table = tab, fx.desc.block_table_stride = 3, fx.desc.block_size = 4,
                 fx.desc.num_blocks = 6));
    clReleaseMemObject(cu_buf), clReleaseMemObject(short_cu), clReleaseMemObject(tab), clReleaseMemObject(one);
  }

  /* NULLs, aliasing, foreign objects, wait lists. */
  reset_desc();
  expect(FCL_ERROR_INVALID_ARGUMENT, "ctx NULL", NULL, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0,
         NULL, "ctx");
  expect(FCL_ERROR_INVALID_ARGUMENT, "queue NULL", e->fcl, NULL, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0,
         NULL, "queue");
  expect(FCL_ERROR_INVALID_ARGUMENT, "q NULL", e->fcl, e->queue, NULL, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0, NULL,
         "q is NULL");
  expect(FCL_ERROR_INVALID_ARGUMENT, "k NULL", e->fcl, e->queue, fx.q.buf, NULL, fx.v.buf, fx.o.buf, fx.lse, 0, NULL,
         "k is NULL");
  expect(FCL_ERROR_INVALID_ARGUMENT, "v NULL", e->fcl, e->queue, fx.q.buf, fx.k.buf, NULL, fx.o.buf, fx.lse, 0, NULL,
         "v is NULL");
  expect(FCL_ERROR_INVALID_ARGUMENT, "o NULL", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, NULL, fx.lse, 0, NULL,
         "o is NULL");
  expect(FCL_ERROR_INVALID_ARGUMENT, "o aliases q", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.q.buf, fx.lse,
         0, NULL, "alias");
  expect(FCL_ERROR_INVALID_ARGUMENT, "lse aliases o", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf,
         fx.o.buf, 0, NULL, "lse");
  expect(FCL_ERROR_INVALID_ARGUMENT, "lse aliases q", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf,
         fx.q.buf, 0, NULL, "lse");
  cl_mem small_lse = create_float_buffer(e, 2 * 4 * 9 - 1, NAN);
  expect(FCL_ERROR_INVALID_ARGUMENT, "lse too small", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf,
         small_lse, 0, NULL, "lse");
  expect(FCL_ERROR_INVALID_ARGUMENT, "wait list count without list", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf,
         fx.o.buf, fx.lse, 1, NULL, "num_wait");
  cl_event null_event = NULL;
  expect(FCL_ERROR_INVALID_ARGUMENT, "wait list with a NULL event", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf,
         fx.o.buf, fx.lse, 1, &null_event, "wait[0]");
  fcl_status st = fcl_attention_forward(e->fcl, e->queue, NULL, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, NULL, 0, NULL,
                                        NULL);
  check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "desc"), "desc NULL -> %s: \"%s\"",
        fcl_status_string(st), fcl_last_error());
  /* The last error is the last failure's: a call that succeeds, with kernel variants passed over on the way
     (the tensor-core ones on any other platform), leaves it. */
  {
    char before[256];
    snprintf(before, sizeof before, "%s", fcl_last_error());
    reset_desc();
    fcl_plan_info info;
    st = fcl_describe_plan(e->fcl, FCL_OP_FORWARD, &fx.desc, &info);
    fcl_status st2 = fcl_describe_plan(e->fcl, FCL_OP_BACKWARD, &fx.desc, &info);
    check(st == FCL_SUCCESS && st2 == FCL_SUCCESS && strcmp(fcl_last_error(), before) == 0,
          "a successful fcl_describe_plan keeps the last error: %s %s, \"%s\" (was \"%s\")", fcl_status_string(st),
          fcl_status_string(st2), fcl_last_error(), before);
  }
  /* Flag bits the header does not define are ignored: a context made with one plans as one made without. */
  {
    fcl_context *stray = NULL;
    fcl_context_options opts = {"", NULL, 1u << 30};
    reset_desc();
    fx.desc.seqlen_q = 1; /* a decode shape: the planner's own rows, packing and splits */
    fcl_plan_info a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    st = fcl_context_create(e->context, e->device, &opts, &stray);
    fcl_status st2 = st ? st : fcl_describe_plan(stray, FCL_OP_FORWARD, &fx.desc, &a);
    fcl_status st3 = fcl_describe_plan(e->fcl, FCL_OP_FORWARD, &fx.desc, &b);
    check(st == FCL_SUCCESS && st2 == FCL_SUCCESS && st3 == FCL_SUCCESS && a.block_q == b.block_q &&
              a.block_k == b.block_k && a.work_group_size == b.work_group_size && a.splits == b.splits &&
              strcmp(a.kernel, b.kernel) == 0,
          "flags bit 30 (not defined) is ignored: %d x %d rows/keys, %d splits (without it %d x %d, %d splits)",
          a.block_q, a.block_k, a.splits, b.block_q, b.block_k, b.splits);
    fcl_context_release(stray);
    reset_desc();
  }

  /* Objects of another cl_context. */
  cl_int err;
  cl_context other = clCreateContext(NULL, 1, &e->device, NULL, NULL, &err);
  cl_command_queue other_queue = clCreateCommandQueue(other, e->device, 0, &err);
  cl_mem other_buf = clCreateBuffer(other, CL_MEM_READ_WRITE, fx.k.elems * 4, NULL, &err);
  expect(FCL_ERROR_INVALID_ARGUMENT, "queue of another context", e->fcl, other_queue, fx.q.buf, fx.k.buf, fx.v.buf,
         fx.o.buf, fx.lse, 0, NULL, "queue belongs to another");
  expect(FCL_ERROR_INVALID_ARGUMENT, "k of another context", e->fcl, e->queue, fx.q.buf, other_buf, fx.v.buf,
         fx.o.buf, fx.lse, 0, NULL, "k belongs to another");

  /* Memory objects and events the kernels cannot use as given: an image, an output the kernels may not
     write, an input they may not read, an event of another cl_context. */
  {
    cl_image_format fmt = {CL_RGBA, CL_FLOAT};
    cl_image_desc idesc;
    memset(&idesc, 0, sizeof idesc);
    idesc.image_type = CL_MEM_OBJECT_IMAGE2D, idesc.image_width = 64, idesc.image_height = 64;
    cl_mem image = clCreateImage(e->context, CL_MEM_READ_WRITE, &fmt, &idesc, NULL, &err);
    if (err == CL_SUCCESS) {
      expect(FCL_ERROR_INVALID_ARGUMENT, "q a 2-D image", e->fcl, e->queue, image, fx.k.buf, fx.v.buf, fx.o.buf,
             fx.lse, 0, NULL, "q is an image");
      expect(FCL_ERROR_INVALID_ARGUMENT, "o a 2-D image", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf, image,
             fx.lse, 0, NULL, "o is an image");
      clReleaseMemObject(image);
    } else {
      skip("2-D image: the device has no image support (%d)", (int)err);
    }
    cl_mem ro = clCreateBuffer(e->context, CL_MEM_READ_ONLY, fx.o.elems * 4, NULL, &err);
    expect(FCL_ERROR_INVALID_ARGUMENT, "o created CL_MEM_READ_ONLY", e->fcl, e->queue, fx.q.buf, fx.k.buf, fx.v.buf,
           ro, fx.lse, 0, NULL, "o was created CL_MEM_READ_ONLY");
    cl_mem ro_lse = clCreateBuffer(e->context, CL_MEM_READ_ONLY, 2 * 4 * 9 * 4, NULL, &err);
    expect(FCL_ERROR_INVALID_ARGUMENT, "lse created CL_MEM_READ_ONLY", e->fcl, e->queue, fx.q.buf, fx.k.buf,
           fx.v.buf, fx.o.buf, ro_lse, 0, NULL, "lse was created CL_MEM_READ_ONLY");
    cl_mem wo = clCreateBuffer(e->context, CL_MEM_WRITE_ONLY, fx.q.elems * 4, NULL, &err);
    expect(FCL_ERROR_INVALID_ARGUMENT, "q created CL_MEM_WRITE_ONLY", e->fcl, e->queue, wo, fx.k.buf, fx.v.buf,
           fx.o.buf, fx.lse, 0, NULL, "q was created CL_MEM_WRITE_ONLY");
    cl_event foreign = clCreateUserEvent(other, &err);
    expect(FCL_ERROR_INVALID_ARGUMENT, "wait-list event of another cl_context", e->fcl, e->queue, fx.q.buf, fx.k.buf,
           fx.v.buf, fx.o.buf, fx.lse, 1, &foreign, "wait[0] belongs to another");
    clSetUserEventStatus(foreign, CL_COMPLETE);
    clReleaseEvent(foreign);
    clReleaseMemObject(ro);
    clReleaseMemObject(ro_lse);
    clReleaseMemObject(wo);
  }

  /* Aliasing through sub-buffers of one parent and through buffers over one host array: byte ranges count,
     not handles. Regions start at multiples of the device's base address alignment. */
  {
    cl_uint align_bits = 0;
    clGetDeviceInfo(e->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    const size_t A = align_bits >= 8 ? align_bits / 8 : 128;
    const size_t slot = (4608 + A - 1) / A * A; /* one region per tensor: q and o are 4608 bytes */
    cl_mem parent = clCreateBuffer(e->context, CL_MEM_READ_WRITE, slot * 12, NULL, &err);
    cl_mem r[12];
    for (int i = 0; i < 12; ++i) {
      cl_buffer_region reg = {slot * (size_t)i, slot};
      r[i] = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
    }
    /* A region one alignment step into region 0 (q) and one into region 3 (o). */
    cl_buffer_region into_q = {A, slot}, into_o = {3 * slot + A, 288};
    cl_mem o_over_q = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &into_q, &err);
    cl_mem lse_in_o = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &into_o, &err);
    reset_desc();
    expect(FCL_ERROR_INVALID_ARGUMENT, "o a sub-buffer overlapping q's", e->fcl, e->queue, r[0], r[1], r[2], o_over_q,
           r[4], 0, NULL, "o overlaps q");
    expect(FCL_ERROR_INVALID_ARGUMENT, "lse a sub-buffer inside o's", e->fcl, e->queue, r[0], r[1], r[2], r[3],
           lse_in_o, 0, NULL, "lse overlaps o");
    /* o inside the parent of the inputs' sub-buffers: the parent holds every byte of q. */
    expect(FCL_ERROR_INVALID_ARGUMENT, "o the parent of q's sub-buffer", e->fcl, e->queue, r[0], r[1], r[2], parent,
           r[4], 0, NULL, "o overlaps q");
    /* The backward's outputs: d_q overlapping d_k, a workspace over lse. */
    size_t ws_bytes = fcl_attention_backward_workspace_size(e->fcl, &fx.desc);
    cl_buffer_region into_dq = {6 * slot + A, 2816}, over_lse = {4 * slot, ws_bytes};
    cl_mem dk_over_dq = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &into_dq, &err);
    cl_mem ws_over_lse = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &over_lse, &err);
    st = fcl_attention_backward(e->fcl, e->queue, &fx.desc, r[0], r[1], r[2], r[3], r[4], r[5], r[6], dk_over_dq, r[8],
                                r[9], 0, NULL, NULL);
    check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "d_k overlaps d_q"),
          "backward, d_k a sub-buffer overlapping d_q's -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
    st = fcl_attention_backward(e->fcl, e->queue, &fx.desc, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                                ws_over_lse, 0, NULL, NULL);
    check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "workspace overlaps lse"),
          "backward, workspace a sub-buffer over lse -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
    /* A caller's split-KV workspace over q, and fcl_attention_merge writing o over its own parts. */
    st = fcl_attention_forward_with_workspace(e->fcl, e->queue, &fx.desc, r[0], r[1], r[2], r[3], r[4], o_over_q, 0,
                                              NULL, NULL);
    check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "workspace overlaps q"),
          "forward, workspace a sub-buffer overlapping q's -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
    st = fcl_attention_merge(e->fcl, e->queue, &fx.desc, 1, r[0], 0, r[4], o_over_q, NULL, 0, NULL, NULL);
    check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "o overlaps o_parts"),
          "merge, o a sub-buffer overlapping o_parts' -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
    /* Part strides whose product with num_parts - 1 passes int64: 8 * (2^61 + 1) wraps to 8, which the buffer holds. */
    st = fcl_attention_merge(e->fcl, e->queue, &fx.desc, 9, r[0], ((int64_t)1 << 61) + 1, r[4], r[3], NULL, 0, NULL, NULL);
    check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "overflows"),
          "merge, (num_parts - 1) * parts_stride past int64 -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
    /* The backward reads o and lse: created CL_MEM_READ_ONLY they are fine there. */
    cl_buffer_region o_region = {3 * slot, 4608}, lse_region = {4 * slot, slot};
    cl_mem o_ro = clCreateSubBuffer(parent, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &o_region, &err);
    cl_mem lse_ro = clCreateSubBuffer(parent, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &lse_region, &err);
    cl_event bwd_ev = NULL;
    st = fcl_attention_backward(e->fcl, e->queue, &fx.desc, r[0], r[1], r[2], o_ro, lse_ro, r[5], r[6], r[7], r[8],
                                r[9], 0, NULL, &bwd_ev);
    check(st == FCL_SUCCESS, "backward, o and lse created CL_MEM_READ_ONLY (inputs there) -> %s %s",
          fcl_status_string(st), st ? fcl_last_error() : "");
    if (bwd_ev) {
      clWaitForEvents(1, &bwd_ev);
      clReleaseEvent(bwd_ev);
    }
    clReleaseMemObject(o_ro);
    clReleaseMemObject(lse_ro);
    /* Disjoint regions of one parent are fine. */
    cl_event ok_ev = NULL;
    st = fcl_attention_forward(e->fcl, e->queue, &fx.desc, r[0], r[1], r[2], r[3], r[4], 0, NULL, &ok_ev);
    check(st == FCL_SUCCESS, "disjoint sub-buffers of one parent are accepted: %s %s", fcl_status_string(st),
          st ? fcl_last_error() : "");
    if (ok_ev) {
      clWaitForEvents(1, &ok_ev);
      clReleaseEvent(ok_ev);
    }
    /* Two CL_MEM_USE_HOST_PTR buffers over one host array. */
    void *host = NULL;
    if (posix_memalign(&host, 4096, 16384) == 0) {
      memset(host, 0, 16384);
      cl_mem hq = clCreateBuffer(e->context, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, 4608, host, &err);
      cl_mem ho = clCreateBuffer(e->context, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, 4608, (char *)host + 4096, &err);
      expect(FCL_ERROR_INVALID_ARGUMENT, "o and q over one host array", e->fcl, e->queue, hq, r[1], r[2], ho, r[4], 0,
             NULL, "o overlaps q");
      clReleaseMemObject(hq);
      clReleaseMemObject(ho);
      free(host);
    }
    clReleaseMemObject(dk_over_dq);
    clReleaseMemObject(ws_over_lse);
    clReleaseMemObject(o_over_q);
    clReleaseMemObject(lse_in_o);
    for (int i = 0; i < 12; ++i) clReleaseMemObject(r[i]);
    clReleaseMemObject(parent);
  }

  /* fcl_context_create. */
  fcl_context *ctx = (fcl_context *)(uintptr_t)1;
  st = fcl_context_create(NULL, e->device, NULL, &ctx);
  check(st == FCL_ERROR_INVALID_ARGUMENT && ctx == NULL && strstr(fcl_last_error(), "context"),
        "fcl_context_create(NULL context) -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
  st = fcl_context_create(e->context, NULL, NULL, &ctx);
  check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "device"),
        "fcl_context_create(NULL device) -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
  st = fcl_context_create(e->context, e->device, NULL, NULL);
  check(st == FCL_ERROR_INVALID_ARGUMENT && strstr(fcl_last_error(), "out"),
        "fcl_context_create(NULL out) -> %s: \"%s\"", fcl_status_string(st), fcl_last_error());
  fcl_context_release(NULL);
  check(1, "fcl_context_release(NULL) is a no-op");
  check(strcmp(fcl_status_string((fcl_status)99), "unknown fcl_status") == 0 &&
            strcmp(fcl_status_string(FCL_ERROR_BUILD), "FCL_ERROR_BUILD") == 0,
        "fcl_status_string names every status and survives bad values");

  /* A kernel that does not compile: FCL_ERROR_BUILD with the build log, nothing enqueued. */
  char dir[] = "/tmp/flashcl-broken-XXXXXX";
  if (mkdtemp(dir)) {
    char path[512];
    snprintf(path, sizeof path, "%s/common.cl", dir);
    FILE *f = fopen(path, "w");
    if (f) {
      fputs("this is not OpenCL C;\n", f);
      fclose(f);
    }
    char path2[512];
    snprintf(path2, sizeof path2, "%s/flash_fwd.cl", dir);
    if ((f = fopen(path2, "w"))) fclose(f);
    setenv("FLASHCL_KERNEL_DIR", dir, 1);
    fcl_context *broken = NULL;
    fcl_context_options opts = {"", NULL, 0};
    fcl_context_create(e->context, e->device, &opts, &broken);
    reset_desc();
    /* Compilers word their logs differently; each names the planted line's first word. */
    expect(FCL_ERROR_BUILD, "kernel source that does not compile", broken, e->queue, fx.q.buf, fx.k.buf, fx.v.buf,
           fx.o.buf, fx.lse, 0, NULL, "'this'");
    unsetenv("FLASHCL_KERNEL_DIR");
    fcl_context_release(broken);
    remove(path);
    remove(path2);
    rmdir(dir);
  }

  /* A negative scale is a valid (if unusual) request. */
  reset_desc();
  fx.desc.scale = -0.5f;
  cl_event neg = NULL;
  st = fcl_attention_forward(e->fcl, e->queue, &fx.desc, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0, NULL,
                             &neg);
  check(st == FCL_SUCCESS, "scale -0.5 is accepted: %s %s", fcl_status_string(st), fcl_last_error());
  if (neg) {
    clWaitForEvents(1, &neg);
    clReleaseEvent(neg);
  }
  tensor_poison(e, &fx.o);

  /* And the fixture itself is valid: the same call succeeds. */
  reset_desc();
  cl_event ev = NULL;
  st = fcl_attention_forward(e->fcl, e->queue, &fx.desc, fx.q.buf, fx.k.buf, fx.v.buf, fx.o.buf, fx.lse, 0, NULL, &ev);
  check(st == FCL_SUCCESS && ev != NULL, "the unmodified fixture runs: %s", fcl_status_string(st));
  if (ev) {
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
  }

  clReleaseMemObject(small_lse);
  clReleaseMemObject(other_buf);
  clReleaseCommandQueue(other_queue);
  clReleaseContext(other);
  tensor_release(&fx.q);
  tensor_release(&fx.k);
  tensor_release(&fx.v);
  tensor_release(&fx.o);
  clReleaseMemObject(fx.lse);
  test_close(&env);
  return test_summary("test_validation");
}
