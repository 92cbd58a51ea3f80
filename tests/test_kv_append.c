/* fcl_kv_cache_append against a host model of the pools: new rows of random bits (NaN payloads, signed zeros
 * and subnormals included) written at random slots, -1 and planted bad slots among them, into pools pre-filled
 * with a sentinel pattern. Every byte of each pool buffer is compared: the written elements bit for bit, all
 * others (other slots, padding between strides, the bytes before the offset) untouched.
 * Also: validation (each bad field refused with a message naming it, nothing enqueued), an empty append's
 * event, and a failed user event in the wait list.
 * Usage: test_kv_append [--small] [--list | --case NAME]
 *   --small              a few cases with planted bad slots, for Oclgrind
 *   --list, --case NAME  list the cases, or run one (test_cases.h) */
#include "test_cases.h"
#include "internal.h" /* fcl_kv_pools_disjoint, checked against brute force */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- random bits (a per-case stream seeded from the suite's) ---- */

static uint64_t rng_state;
static void rng_seed(void) { rng_state = (uint64_t)((test_uniform() + 1.0) * 4503599627370496.0) ^ 0x9e3779b97f4a7c15ull; }
static uint64_t rbits(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int64_t rand_below(int64_t n) { return (int64_t)(rbits() % (uint64_t)n); }

/* The sentinel of byte i of a pool buffer: never all-equal, so a shifted write shows. */
static unsigned char sentinel(size_t i, int which) { return (unsigned char)(0xA5 ^ (i * 131u) ^ (i >> 8) ^ (which * 0x3C)); }

/* ---- layouts ---- */

enum { POOL_HND = 0, POOL_NHD = 1, POOL_PADDED = 2 }; /* HND: zero strides (the default) */
enum { NEW_PACKED = 0, NEW_QKV = 1 };                  /* QKV: k and v inside one [tokens, Hq + 2H, D] buffer */

typedef struct append_case {
  fcl_dtype dtype;
  int64_t block_size, num_blocks, heads, d, tokens;
  int k_layout, v_layout; /* POOL_* */
  int new_layout;         /* NEW_* */
  int stacked;            /* K and V pools in one buffer: 1 V after K (vLLM's [2, num_blocks, ...]); 2 interleaved
                             per block (FlashInfer's [num_blocks, 2, block_size, kv_heads, head_dim]; the
                             layouts are then ignored) */
  int bad_slots;          /* plant -1 and out-of-range slots */
} append_case;

/* Strides (block, head, row) and offset of a pool layout; returns the elements it spans from 0. */
static int64_t pool_layout(const append_case *c, int layout, int64_t s[3], int64_t *offset) {
  const int64_t H = c->heads, D = c->d, bs = c->block_size;
  *offset = 0;
  if (layout == POOL_HND) { /* passed as zeros: the default contiguous [num_blocks, H, bs, D] */
    s[0] = s[1] = s[2] = 0;
    return c->num_blocks * H * bs * D;
  }
  if (layout == POOL_NHD) { /* vLLM's [num_blocks, block_size, kv_heads, head_size] */
    s[0] = bs * H * D, s[1] = D, s[2] = H * D;
    return c->num_blocks * s[0];
  }
  /* HND with gaps after every row, head and block, and an offset. */
  s[2] = D + 2, s[1] = bs * s[2] + 1, s[0] = H * s[1] + 3;
  *offset = 5;
  return *offset + c->num_blocks * s[0];
}

/* FlashInfer's [num_blocks, 2, block_size, kv_heads, head_dim]: K (which 0) or V (1) of one buffer. */
static void interleaved_layout(const append_case *c, int which, int64_t s[3], int64_t *offset) {
  const int64_t blk = c->block_size * c->heads * c->d;
  s[0] = 2 * blk, s[1] = c->d, s[2] = c->heads * c->d;
  *offset = which * blk;
}

/* The element of (block, head, row, col) in a pool with (resolved) strides. */
static int64_t pool_index(const append_case *c, const int64_t s[3], int64_t off, int64_t b, int64_t h, int64_t r,
                          int64_t col) {
  if (!s[0] && !s[1] && !s[2]) return ((b * c->heads + h) * c->block_size + r) * c->d + col;
  return off + b * s[0] + h * s[1] + r * s[2] + col;
}

typedef struct fixture {
  fcl_kv_append_desc desc;
  size_t es, new_bytes, kp_bytes, vp_bytes; /* buffer sizes in bytes */
  unsigned char *k_new, *v_new;             /* host copies of the new-row buffers (v_new == k_new for QKV) */
  unsigned char *kp_init, *vp_init;         /* sentinel-filled pools as uploaded */
  int64_t *slots;
  cl_mem k_new_buf, v_new_buf, slots_buf;
  /* Each pool is a sub-buffer with `guard` sentinel bytes either side in its parent, so a write just outside
     it shows; stacked pools share one sub-buffer (kp_buf == vp_buf) of one parent (v_parent NULL). */
  size_t guard;
  cl_mem k_parent, v_parent, kp_buf, vp_buf;
} fixture;

static cl_mem upload(test_env *env, const void *data, size_t bytes) {
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)data, &err);
  return err == CL_SUCCESS ? m : NULL;
}

static unsigned char guard_byte(size_t i) { return (unsigned char)(0x5A ^ (i * 29u)); }

/* A parent buffer of guard sentinel bytes, a, b, guard bytes; *sub the sub-buffer over a and b. */
static cl_mem guarded(test_env *env, size_t guard, const unsigned char *a, size_t an, const unsigned char *b, size_t bn,
                      cl_mem *sub) {
  const size_t total = 2 * guard + an + bn;
  unsigned char *img = malloc(total);
  for (size_t i = 0; i < total; ++i) img[i] = guard_byte(i);
  memcpy(img + guard, a, an);
  if (bn) memcpy(img + guard + an, b, bn);
  cl_mem parent = upload(env, img, total);
  free(img);
  *sub = NULL;
  if (!parent) return NULL;
  cl_int err;
  cl_buffer_region r = {guard, an + bn};
  *sub = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
  if (err != CL_SUCCESS) *sub = NULL;
  return parent;
}

static void fixture_release(fixture *f) {
  /* QKV rows are one buffer, stacked pools one sub-buffer: each released once, sub-buffers first. */
  cl_mem ms[7] = {f->k_new_buf, f->v_new_buf != f->k_new_buf ? f->v_new_buf : NULL, f->slots_buf, f->kp_buf,
                  f->vp_buf != f->kp_buf ? f->vp_buf : NULL, f->k_parent, f->v_parent};
  for (int i = 0; i < 7; ++i)
    if (ms[i]) clReleaseMemObject(ms[i]);
  free(f->k_new);
  if (f->v_new != f->k_new) free(f->v_new);
  free(f->kp_init);
  free(f->vp_init);
  free(f->slots);
  memset(f, 0, sizeof *f);
}

/* Planted bad slots: beyond the pools, below -1, huge, both signs. */
static int64_t bad_slot(const append_case *c, int i) {
  const int64_t n = c->block_size * c->num_blocks;
  const int64_t bad[8] = {n, n + 1, -2, INT64_MIN, INT64_MAX, n + c->block_size, (int64_t)1 << 40, -n};
  return bad[i % 8];
}

static int fixture_make(test_env *env, const append_case *c, fixture *f) {
  memset(f, 0, sizeof *f);
  const size_t es = dtype_size(c->dtype);
  const int64_t H = c->heads, D = c->d, T = c->tokens, nslots = c->block_size * c->num_blocks;
  f->es = es;
  fcl_kv_append_desc *d = &f->desc;
  d->num_tokens = T, d->num_kv_heads = H, d->head_dim = D, d->dtype = c->dtype;
  d->block_size = c->block_size, d->num_blocks = c->num_blocks;

  /* New rows: random bits, as the dtype stores them. */
  if (c->new_layout == NEW_QKV) {
    const int64_t hq = 2 * H, width = (hq + 2 * H) * D;
    d->k_new_stride[0] = d->v_new_stride[0] = width;
    d->k_new_stride[1] = d->v_new_stride[1] = D;
    d->k_new_offset = hq * D, d->v_new_offset = (hq + H) * D;
    f->new_bytes = (size_t)(T * width) * es;
  } else {
    f->new_bytes = (size_t)(T * H * D) * es;
  }
  const size_t nb = f->new_bytes ? f->new_bytes : es; /* a buffer even for zero tokens */
  f->k_new = malloc(nb);
  f->v_new = c->new_layout == NEW_QKV ? f->k_new : malloc(nb);
  for (size_t i = 0; i < nb; ++i) f->k_new[i] = (unsigned char)rbits();
  if (f->v_new != f->k_new)
    for (size_t i = 0; i < nb; ++i) f->v_new[i] = (unsigned char)rbits();

  /* Slots: distinct valid ones in random order, with -1 and (when asked) bad ones among them. */
  f->slots = malloc((size_t)(T ? T : 1) * sizeof(int64_t));
  int64_t *perm = malloc((size_t)nslots * sizeof(int64_t));
  for (int64_t i = 0; i < nslots; ++i) perm[i] = i;
  int64_t used = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = rand_below(8);
    if (c->bad_slots && r == 0) f->slots[t] = -1;
    else if (c->bad_slots && r == 1) f->slots[t] = bad_slot(c, (int)rand_below(8));
    else if (used < nslots) {
      const int64_t j = used + rand_below(nslots - used);
      const int64_t s = perm[j];
      perm[j] = perm[used], perm[used] = s;
      f->slots[t] = perm[used++];
    } else {
      f->slots[t] = -1; /* more tokens than slots */
    }
  }
  free(perm);
  /* Every kind of bad slot and a -1, at distinct random tokens (the cases that plant them have >= 9 tokens). */
  if (c->bad_slots && T >= 9) {
    int64_t *order = malloc((size_t)T * sizeof(int64_t));
    for (int64_t t = 0; t < T; ++t) order[t] = t;
    for (int i = 0; i < 9; ++i) {
      const int64_t j = i + rand_below(T - i), x = order[j];
      order[j] = order[i], order[i] = x;
      f->slots[x] = i < 8 ? bad_slot(c, i) : -1;
    }
    /* At least one token lands (the check that some do must not depend on the draw: with 12 tokens the random
       -1 and bad slots took the other three about once in 64 seeds); no token holds a valid slot then, so
       slot 0 is free. */
    int64_t valid = 0;
    for (int64_t t = 0; t < T; ++t) valid += f->slots[t] >= 0 && f->slots[t] < nslots;
    if (!valid && T > 9) f->slots[order[9]] = 0;
    free(order);
  }

  /* Pools: sentinel bytes everywhere. */
  int64_t kspan = pool_layout(c, c->k_layout, d->k_pool_stride, &d->k_pool_offset);
  int64_t vspan = pool_layout(c, c->v_layout, d->v_pool_stride, &d->v_pool_offset);
  if (c->stacked == 2) { /* one region, described as K's; V's elements sit between K's */
    interleaved_layout(c, 0, d->k_pool_stride, &d->k_pool_offset);
    interleaved_layout(c, 1, d->v_pool_stride, &d->v_pool_offset);
    kspan = 2 * c->num_blocks * c->block_size * H * D, vspan = -3;
  }
  f->kp_bytes = (size_t)kspan * es + 3 * es; /* a tail beyond the last element, which must stay untouched */
  f->vp_bytes = (size_t)(vspan + 3) * es;
  f->kp_init = malloc(f->kp_bytes);
  f->vp_init = malloc(f->vp_bytes);
  for (size_t i = 0; i < f->kp_bytes; ++i) f->kp_init[i] = sentinel(i, 0);
  for (size_t i = 0; i < f->vp_bytes; ++i) f->vp_init[i] = sentinel(i, 1);

  cl_uint align_bits = 0;
  clGetDeviceInfo(env->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
  const size_t align = align_bits >= 8 ? align_bits / 8 : 128;
  f->guard = (4096 + align - 1) / align * align;
  f->k_new_buf = upload(env, f->k_new, nb);
  f->v_new_buf = f->v_new == f->k_new ? f->k_new_buf : upload(env, f->v_new, nb);
  f->slots_buf = upload(env, f->slots, (size_t)(T ? T : 1) * sizeof(int64_t));
  if (c->stacked == 2) {
    f->k_parent = guarded(env, f->guard, f->kp_init, f->kp_bytes, NULL, 0, &f->kp_buf);
    f->vp_buf = f->kp_buf;
  } else if (c->stacked) {
    /* One buffer: K's pool, then V's at an element offset (the whole K part). */
    f->k_parent = guarded(env, f->guard, f->kp_init, f->kp_bytes, f->vp_init, f->vp_bytes, &f->kp_buf);
    f->vp_buf = f->kp_buf;
    if (c->v_layout == POOL_HND) { /* an offset needs explicit strides */
      const int64_t bs = c->block_size;
      d->v_pool_stride[0] = H * bs * D, d->v_pool_stride[1] = bs * D, d->v_pool_stride[2] = D;
    }
    d->v_pool_offset += (int64_t)(f->kp_bytes / es);
  } else {
    f->k_parent = guarded(env, f->guard, f->kp_init, f->kp_bytes, NULL, 0, &f->kp_buf);
    f->v_parent = guarded(env, f->guard, f->vp_init, f->vp_bytes, NULL, 0, &f->vp_buf);
  }
  return f->k_new_buf && f->v_new_buf && f->slots_buf && f->kp_buf && f->vp_buf ? 0 : -1;
}

/* The pools as the append should leave them (host model); returns how many tokens land. */
static int64_t expected_pools(const append_case *c, const fixture *f, unsigned char *kp, unsigned char *vp) {
  const fcl_kv_append_desc *d = &f->desc;
  const int64_t H = c->heads, D = c->d, nslots = c->block_size * c->num_blocks;
  int64_t kvoff = d->v_pool_offset;
  if (c->stacked == 1) kvoff -= (int64_t)(f->kp_bytes / f->es); /* relative to V's own part */
  int64_t kstride[3], vstride[3], dummy;
  pool_layout(c, c->k_layout, kstride, &dummy);
  pool_layout(c, c->v_layout, vstride, &dummy);
  if (c->stacked == 2) { /* both in kp */
    interleaved_layout(c, 0, kstride, &dummy);
    interleaved_layout(c, 1, vstride, &kvoff);
    vp = kp;
  }
  int64_t landed = 0;
  for (int64_t t = 0; t < c->tokens; ++t) {
    const int64_t s = f->slots[t];
    if (s < 0 || s >= nslots) continue;
    ++landed;
    const int64_t b = s / c->block_size, r = s % c->block_size;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t col = 0; col < D; ++col) {
        const int64_t kn = d->k_new_offset + t * (d->k_new_stride[0] ? d->k_new_stride[0] : H * D) +
                           h * (d->k_new_stride[1] ? d->k_new_stride[1] : D) + col;
        const int64_t vn = d->v_new_offset + t * (d->v_new_stride[0] ? d->v_new_stride[0] : H * D) +
                           h * (d->v_new_stride[1] ? d->v_new_stride[1] : D) + col;
        const int64_t ki = pool_index(c, kstride, d->k_pool_offset, b, h, r, col);
        const int64_t vi = pool_index(c, vstride, kvoff, b, h, r, col);
        memcpy(kp + ki * f->es, f->k_new + kn * f->es, f->es);
        memcpy(vp + vi * f->es, f->v_new + vn * f->es, f->es);
      }
  }
  return landed;
}

static int read_bytes(test_env *env, cl_mem m, size_t offset, void *dst, size_t n) {
  return clEnqueueReadBuffer(env->queue, m, CL_TRUE, offset, n, dst, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
}

/* Bytes that differ between the pools on the device and want (K, then V). */
static size_t pool_mismatches(test_env *env, const fixture *f, const unsigned char *kwant, const unsigned char *vwant,
                              size_t *first) {
  /* The parents whole: the guards must hold their sentinel, the pools want. */
  const size_t g = f->guard, kn = 2 * g + f->kp_bytes + (f->v_parent ? 0 : f->vp_bytes), vn = 2 * g + f->vp_bytes;
  unsigned char *kgot = malloc(kn), *vgot = malloc(vn), *kimg = malloc(kn), *vimg = malloc(vn);
  for (size_t i = 0; i < kn; ++i) kimg[i] = guard_byte(i);
  for (size_t i = 0; i < vn; ++i) vimg[i] = guard_byte(i);
  memcpy(kimg + g, kwant, f->kp_bytes);
  if (f->v_parent) memcpy(vimg + g, vwant, f->vp_bytes);
  else memcpy(kimg + g + f->kp_bytes, vwant, f->vp_bytes);
  size_t bad = 0;
  *first = (size_t)-1;
  if (read_bytes(env, f->k_parent, 0, kgot, kn) || (f->v_parent && read_bytes(env, f->v_parent, 0, vgot, vn))) {
    bad = (size_t)-1;
  } else {
    for (size_t i = 0; i < kn; ++i)
      if (kgot[i] != kimg[i] && !bad++) *first = i;
    for (size_t i = 0; f->v_parent && i < vn; ++i)
      if (vgot[i] != vimg[i] && !bad++) *first = kn + i;
  }
  free(kgot);
  free(vgot);
  free(kimg);
  free(vimg);
  return bad;
}

static void case_name(const append_case *c, char *out, size_t n) {
  static const char *const layouts[3] = {"hnd", "nhd", "padded"};
  snprintf(out, n, "%s_bs%lld_nb%lld_h%lld_d%lld_t%lld_k%s_v%s%s%s%s", dtype_name(c->dtype), (long long)c->block_size,
           (long long)c->num_blocks, (long long)c->heads, (long long)c->d, (long long)c->tokens, layouts[c->k_layout],
           layouts[c->v_layout], c->new_layout == NEW_QKV ? "_qkv" : "",
           c->stacked == 2 ? "_interleaved" : c->stacked ? "_stacked" : "",
           c->bad_slots ? "_badslots" : "");
}

static void run_append(test_env *env, const void *arg) {
  const append_case *c = arg;
  char name[TEST_CASE_NAME_MAX];
  case_name(c, name, sizeof name);
  rng_seed();
  fixture f;
  if (fixture_make(env, c, &f)) {
    check(0, "%s: setting up buffers", name);
    fixture_release(&f);
    return;
  }
  unsigned char *kwant = malloc(f.kp_bytes), *vwant = malloc(f.vp_bytes ? f.vp_bytes : 1);
  memcpy(kwant, f.kp_init, f.kp_bytes);
  memcpy(vwant, f.vp_init, f.vp_bytes);
  const int64_t landed = expected_pools(c, &f, kwant, vwant);
  cl_event done = NULL;
  fcl_status st = fcl_kv_cache_append(env->fcl, env->queue, &f.desc, f.k_new_buf, f.v_new_buf, f.slots_buf, f.kp_buf,
                                      f.vp_buf, 0, NULL, &done);
  cl_int status = 1;
  if (st == FCL_SUCCESS) {
    clWaitForEvents(1, &done);
    clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    clReleaseEvent(done);
  }
  size_t first = 0;
  const size_t bad = st ? (size_t)-1 : pool_mismatches(env, &f, kwant, vwant, &first);
  check(st == FCL_SUCCESS && status == CL_COMPLETE && bad == 0 && (c->tokens == 0 || landed > 0),
        "%s: %lld of %lld tokens land; %s%s%s, event status %d, %zu pool bytes differ from the model (first at "
        "byte %lld of the parents)",
        name, (long long)landed, (long long)c->tokens, fcl_status_string(st), st ? ": " : "",
        st ? fcl_last_error() : "", (int)status, bad, bad ? (long long)first : -1LL);
  free(kwant);
  free(vwant);
  fixture_release(&f);
}

/* Duplicate slots: each written element holds one of the tokens' values (which one is unspecified). */
static void run_duplicates(test_env *env, const void *unused) {
  (void)unused;
  rng_seed();
  const append_case c = {FCL_DTYPE_F32, 4, 2, 2, 5, 6, POOL_HND, POOL_HND, NEW_PACKED, 0, 0};
  fixture f;
  int ok = fixture_make(env, &c, &f) == 0;
  for (int t = 0; t < 6; ++t) f.slots[t] = t % 2 ? 5 : -1; /* tokens 1, 3, 5 all to slot 5 */
  ok = ok && clEnqueueWriteBuffer(env->queue, f.slots_buf, CL_TRUE, 0, 6 * sizeof(int64_t), f.slots, 0, NULL, NULL) ==
                 CL_SUCCESS;
  ok = ok && fcl_kv_cache_append(env->fcl, env->queue, &f.desc, f.k_new_buf, f.v_new_buf, f.slots_buf, f.kp_buf,
                                 f.vp_buf, 0, NULL, NULL) == FCL_SUCCESS;
  float got[20];
  ok = ok && read_bytes(env, f.kp_buf, (size_t)(1 * 2 * 4 * 5) * 4 + 5 * 4, got, 5 * 4) == 0; /* block 1, head 0, row 1 */
  int each_from_one = ok;
  for (int col = 0; ok && col < 5; ++col) {
    int match = 0;
    for (int t = 1; t < 6; t += 2) match |= !memcmp(&got[col], f.k_new + ((size_t)t * 2 * 5 + (size_t)col) * 4, 4);
    each_from_one &= match;
  }
  check(each_from_one, "duplicate slots: every element of the shared slot holds one of its tokens' values");
  fixture_release(&f);
}

/* ---- validation ---- */

static int message_names(const char *field) { return strstr(fcl_last_error(), field) != NULL; }

typedef struct bad_call {
  const char *what, *field; /* the change, and the text the message must contain */
} bad_call;

static void run_validation(test_env *env, const void *unused) {
  (void)unused;
  rng_seed();
  const append_case c = {FCL_DTYPE_F16, 4, 3, 2, 6, 5, POOL_HND, POOL_NHD, NEW_PACKED, 0, 0};
  fixture f;
  if (fixture_make(env, &c, &f)) {
    check(0, "validation: setting up buffers");
    fixture_release(&f);
    return;
  }
  cl_int err;
  cl_context other = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
  cl_mem foreign = other ? clCreateBuffer(other, CL_MEM_READ_WRITE, f.kp_bytes, NULL, &err) : NULL;
  cl_mem read_only = clCreateBuffer(env->context, CL_MEM_READ_ONLY, f.kp_bytes, NULL, &err);
  cl_mem small_slots = clCreateBuffer(env->context, CL_MEM_READ_WRITE, (size_t)c.tokens * 8 - 1, NULL, &err);
  cl_mem big = clCreateBuffer(env->context, CL_MEM_READ_WRITE, f.kp_bytes + f.vp_bytes, NULL, &err);
  cl_event null_event = NULL;
  const cl_event *no_list = NULL;
  static const bad_call calls[] = {
      {"ctx NULL", "ctx"},
      {"queue NULL", "queue"},
      {"desc NULL", "desc"},
      {"num_tokens -1", "num_tokens"},
      {"num_kv_heads 0", "num_kv_heads"},
      {"head_dim 0", "head_dim"},
      {"dtype 9", "dtype"},
      {"block_size 0", "block_size"},
      {"num_blocks 0", "num_blocks"},
      {"num_blocks * block_size overflows", "num_blocks"},
      {"k_new_stride[0] -1", "k_new_stride[0]"},
      {"v_new_stride[1] -3", "v_new_stride[1]"},
      {"k_pool_stride[1] -1", "k_pool_stride[1]"},
      {"v_pool_stride[2] -1", "v_pool_stride[2]"},
      {"k_new_offset -1", "k_new_offset"},
      {"v_pool_offset -1", "v_pool_offset"},
      {"k_new NULL", "k_new"},
      {"v_new NULL", "v_new"},
      {"slots NULL", "slots"},
      {"k_pool NULL", "k_pool"},
      {"v_pool NULL", "v_pool"},
      {"k_new too small (offset)", "k_new"},
      {"v_new too small (token stride)", "v_new"},
      {"slots one byte short", "slots"},
      {"k_pool too small (num_blocks + 1)", "k_pool"},
      {"v_pool too small (offset)", "v_pool"},
      {"k_pool stride overflows", "k_pool"},
      {"v_pool rows overlap (row stride 0)", "v_pool"},
      {"k_pool from another context", "k_pool"},
      {"v_pool created CL_MEM_READ_ONLY", "v_pool"},
      {"k_pool is v_pool (same elements)", "v_pool"},
      {"k_pool aliases k_new", "k_pool"},
      {"v_pool overlaps slots", "v_pool"},
      {"k_pool, v_pool interleaved in one buffer, one element too close", "v_pool overlaps k_pool"},
      {"k_pool, v_pool interleaved with different strides (spans decide)", "v_pool overlaps k_pool"},
      {"num_wait 1, wait NULL", "num_wait"},
      {"wait[0] NULL", "wait[0]"},
  };
  const int n = (int)(sizeof calls / sizeof calls[0]);
  for (int i = 0; i < n; ++i) {
    fcl_kv_append_desc d = f.desc;
    fcl_context *ctx = env->fcl;
    cl_command_queue queue = env->queue;
    const fcl_kv_append_desc *dp = &d;
    cl_mem kn = f.k_new_buf, vn = f.v_new_buf, sl = f.slots_buf, kp = f.kp_buf, vp = f.vp_buf;
    cl_uint num_wait = 0;
    const cl_event *wait = NULL;
    switch (i) {
      case 0: ctx = NULL; break;
      case 1: queue = NULL; break;
      case 2: dp = NULL; break;
      case 3: d.num_tokens = -1; break;
      case 4: d.num_kv_heads = 0; break;
      case 5: d.head_dim = 0; break;
      case 6: d.dtype = (fcl_dtype)9; break;
      case 7: d.block_size = 0; break;
      case 8: d.num_blocks = 0; break;
      case 9: d.num_blocks = INT64_MAX / 2; break;
      case 10: d.k_new_stride[0] = -1; break;
      case 11: d.v_new_stride[1] = -3; break;
      case 12: d.k_pool_stride[0] = 1, d.k_pool_stride[1] = -1; break;
      case 13: d.v_pool_stride[2] = -1; break;
      case 14: d.k_new_offset = -1; break;
      case 15: d.v_pool_offset = -1; break;
      case 16: kn = NULL; break;
      case 17: vn = NULL; break;
      case 18: sl = NULL; break;
      case 19: kp = NULL; break;
      case 20: vp = NULL; break;
      case 21: d.k_new_offset = 1; break;
      case 22: d.v_new_stride[0] = c.heads * c.d + 1, d.v_new_stride[1] = c.d; break;
      case 23: sl = small_slots; break;
      case 24: d.num_blocks = c.num_blocks + 1; break;
      case 25: d.v_pool_offset = (int64_t)(f.vp_bytes / f.es); break;
      case 26: d.k_pool_stride[0] = INT64_MAX / 4, d.k_pool_stride[1] = c.block_size * c.d, d.k_pool_stride[2] = c.d; break;
      case 27: d.v_pool_stride[2] = 0; break;
      case 28: kp = foreign; break;
      case 29: vp = read_only; break;
      case 30: vp = kp; d.v_pool_stride[0] = d.v_pool_stride[1] = d.v_pool_stride[2] = 0; break;
      case 31: kp = big, kn = big; break;
      case 32: vp = big, sl = big; break;
      case 33:
      case 34: {
        /* FlashInfer's layout over `big` with V one element early: K's row r, column D-1 is V's column 0. */
        const int64_t blk = c.block_size * c.heads * c.d;
        kp = vp = big;
        d.num_blocks = 2; /* two blocks: the spans cross */
        d.k_pool_stride[0] = d.v_pool_stride[0] = 2 * blk;
        d.k_pool_stride[1] = d.v_pool_stride[1] = c.d;
        d.k_pool_stride[2] = d.v_pool_stride[2] = c.heads * c.d;
        d.k_pool_offset = 0, d.v_pool_offset = blk - (i == 33);
        if (i == 34) d.v_pool_stride[0] = 2 * blk + 1; /* disjoint elements, but only spans are compared */
        break;
      }
      case 35: num_wait = 1, wait = no_list; break;
      case 36: num_wait = 1, wait = &null_event; break;
    }
    if ((i == 28 && !foreign) || (i == 29 && !read_only) || (i == 31 && !big)) {
      check(0, "validation: %s: could not create the buffer", calls[i].what);
      continue;
    }
    cl_event ev = (cl_event)(uintptr_t)0x1; /* must stay as it is */
    const fcl_status st = fcl_kv_cache_append(ctx, queue, dp, kn, vn, sl, kp, vp, num_wait, wait, &ev);
    check(st == FCL_ERROR_INVALID_ARGUMENT && message_names(calls[i].field) && ev == (cl_event)(uintptr_t)0x1,
          "validation: %s -> %s naming %s: \"%s\"", calls[i].what, fcl_status_string(st), calls[i].field,
          fcl_last_error());
  }
  /* Nothing was enqueued: the pools still hold the sentinel. */
  clFinish(env->queue);
  size_t first;
  const size_t bad = pool_mismatches(env, &f, f.kp_init, f.vp_init, &first);
  check(bad == 0, "validation: refused calls left the pools untouched (%zu bytes differ)", bad);
  if (foreign) clReleaseMemObject(foreign);
  if (other) clReleaseContext(other);
  if (read_only) clReleaseMemObject(read_only);
  if (small_slots) clReleaseMemObject(small_slots);
  if (big) clReleaseMemObject(big);
  fixture_release(&f);
}

/* ---- events ---- */

/* An empty append still hands back an event, which completes; and a non-empty one with no event asked. */
static void run_empty(test_env *env, const void *unused) {
  (void)unused;
  rng_seed();
  const append_case c = {FCL_DTYPE_BF16, 16, 2, 2, 8, 0, POOL_HND, POOL_HND, NEW_PACKED, 0, 0};
  fixture f;
  int ok = fixture_make(env, &c, &f) == 0;
  cl_event done = NULL;
  const fcl_status st = ok ? fcl_kv_cache_append(env->fcl, env->queue, &f.desc, f.k_new_buf, f.v_new_buf, f.slots_buf,
                                                 f.kp_buf, f.vp_buf, 0, NULL, &done)
                           : FCL_ERROR_OPENCL;
  cl_int status = 1;
  if (st == FCL_SUCCESS && done) {
    clWaitForEvents(1, &done);
    clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    clReleaseEvent(done);
  }
  size_t first;
  const size_t bad = st ? (size_t)-1 : pool_mismatches(env, &f, f.kp_init, f.vp_init, &first);
  check(st == FCL_SUCCESS && done && status == CL_COMPLETE && bad == 0,
        "zero tokens: %s, an event %s with status %d, pools untouched (%zu bytes differ)", fcl_status_string(st),
        done ? "returned" : "missing", (int)status, bad);
  fixture_release(&f);
}

/* Behind a user event the application fails: no crash, the returned event reports the failure, the pools are
   untouched, and the next call without the list completes. tokens 0: the same for the marker. */
static void run_failed_dependency(test_env *env, const void *arg) {
  const int64_t tokens = *(const int64_t *)arg;
  rng_seed();
  const append_case c = {FCL_DTYPE_F32, 3, 4, 2, 7, tokens, POOL_NHD, POOL_PADDED, NEW_PACKED, 0, 1};
  fixture f;
  if (fixture_make(env, &c, &f)) {
    check(0, "failed dependency: setting up buffers");
    fixture_release(&f);
    return;
  }
  cl_int err;
  cl_event user = clCreateUserEvent(env->context, &err), done = NULL;
  fcl_status st = fcl_kv_cache_append(env->fcl, env->queue, &f.desc, f.k_new_buf, f.v_new_buf, f.slots_buf, f.kp_buf,
                                      f.vp_buf, 1, &user, &done);
  clSetUserEventStatus(user, -1);
  cl_int status = 0;
  if (st == FCL_SUCCESS) {
    clWaitForEvents(1, &done);
    clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    clReleaseEvent(done);
  }
  clFinish(env->queue);
  size_t first;
  const size_t bad = st ? (size_t)-1 : pool_mismatches(env, &f, f.kp_init, f.vp_init, &first);
  check(st == FCL_SUCCESS && status < 0 && bad == 0,
        "%lld tokens behind a failed user event: %s, event status %d, pools untouched (%zu bytes differ)",
        (long long)tokens, fcl_status_string(st), (int)status, bad);
  /* The failure does not outlive the call. */
  cl_event again = NULL;
  cl_int again_status = 1;
  st = fcl_kv_cache_append(env->fcl, env->queue, &f.desc, f.k_new_buf, f.v_new_buf, f.slots_buf, f.kp_buf, f.vp_buf,
                           0, NULL, &again);
  if (st == FCL_SUCCESS) {
    clWaitForEvents(1, &again);
    clGetEventInfo(again, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof again_status, &again_status, NULL);
    clReleaseEvent(again);
  }
  check(st == FCL_SUCCESS && again_status == CL_COMPLETE, "the next call without a wait list: %s, event status %d",
        fcl_status_string(st), (int)again_status);
  clReleaseEvent(user);
  fixture_release(&f);
}

/* ---- the exact test that admits interleaved pools ---- */

/* fcl_check_no_overlap's rule: ordered by stride, each stride clears the extent of the dimensions inside it. */
static int nested(const int64_t n[3], const int64_t s[3], int64_t d) {
  int64_t c[3] = {n[0], n[1], n[2]}, st[3] = {s[0], s[1], s[2]};
  for (int i = 0; i < 3; ++i)
    for (int j = i; j > 0 && st[j] < st[j - 1]; --j) {
      int64_t t = st[j];
      st[j] = st[j - 1], st[j - 1] = t, t = c[j], c[j] = c[j - 1], c[j - 1] = t;
    }
  int64_t extent = d;
  for (int i = 0; i < 3; ++i) {
    if (c[i] <= 1) continue;
    if (st[i] < extent) return 0;
    extent += st[i] * (c[i] - 1);
  }
  return 1;
}

/* fcl_kv_pools_disjoint against marking every element of one pool and probing the other's, over random small
   geometries that pass the self-overlap rule and random distances between the two pools. */
static void run_disjoint_brute_force(test_env *env, const void *unused) {
  (void)env, (void)unused;
  rng_seed();
  long tried = 0, disjoint = 0, wrong = 0;
  char *mark = malloc(4096);
  while (tried < 20000) {
    const int64_t n[3] = {1 + rand_below(4), 1 + rand_below(3), 1 + rand_below(4)}, d = 1 + rand_below(4);
    const int64_t s[3] = {rand_below(40), rand_below(40), rand_below(40)}, delta = rand_below(201) - 100;
    if (!nested(n, s, d)) continue;
    ++tried;
    const int64_t span = (n[0] - 1) * s[0] + (n[1] - 1) * s[1] + (n[2] - 1) * s[2] + d;
    memset(mark, 0, (size_t)span);
    int shared = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t b = 0; b < n[0]; ++b)
        for (int64_t h = 0; h < n[1]; ++h)
          for (int64_t r = 0; r < n[2]; ++r)
            for (int64_t c = 0; c < d; ++c) {
              const int64_t x = b * s[0] + h * s[1] + r * s[2] + c;
              if (pass == 0) mark[x] = 1;
              else if (x + delta >= 0 && x + delta < span && mark[x + delta]) shared = 1;
            }
    const int got = fcl_kv_pools_disjoint(n[0], n[1], n[2], d, s, delta);
    disjoint += got;
    if (got == shared && !wrong++)
      printf("     counts %lld %lld %lld, strides %lld %lld %lld, d %lld, delta %lld: %s, brute force says %s\n",
             (long long)n[0], (long long)n[1], (long long)n[2], (long long)s[0], (long long)s[1], (long long)s[2],
             (long long)d, (long long)delta, got ? "disjoint" : "shared", shared ? "shared" : "disjoint");
  }
  free(mark);
  check(wrong == 0 && disjoint > 0 && disjoint < tried,
        "pools_disjoint: %ld geometries (%ld disjoint), %ld disagree with brute force", tried, disjoint, wrong);
}

/* ---- the case list ---- */

static int add(append_case *list, int n, append_case c) {
  list[n] = c;
  return n + 1;
}

static int small_cases(append_case *l) {
  int n = 0;
  n = add(l, n, (append_case){FCL_DTYPE_F32, 3, 5, 2, 7, 24, POOL_NHD, POOL_PADDED, NEW_PACKED, 0, 1});
  n = add(l, n, (append_case){FCL_DTYPE_F16, 16, 2, 3, 9, 40, POOL_HND, POOL_HND, NEW_QKV, 1, 1});
  n = add(l, n, (append_case){FCL_DTYPE_BF16, 1, 6, 1, 4, 12, POOL_PADDED, POOL_NHD, NEW_PACKED, 0, 1});
  n = add(l, n, (append_case){FCL_DTYPE_F32, 4, 3, 2, 5, 14, POOL_NHD, POOL_NHD, NEW_PACKED, 2, 1});
  return n;
}

static int full_cases(append_case *l) {
  static const fcl_dtype dtypes[3] = {FCL_DTYPE_F32, FCL_DTYPE_F16, FCL_DTYPE_BF16};
  static const int64_t block_sizes[5] = {1, 3, 16, 64, 256};
  static const int64_t dims[3] = {7, 40, 128};
  static const int64_t heads[4] = {1, 2, 4, 8};
  int n = 0, i = 0;
  for (int b = 0; b < 5; ++b)
    for (int t = 0; t < 3; ++t, ++i) {
      const int64_t bs = block_sizes[b], D = dims[(b + t) % 3], H = heads[i % 4];
      const int64_t nb = bs >= 64 ? 3 : 8 + i; /* room for every token, with unused slots left */
      const int64_t tokens = bs * nb / 2 + 12; /* >= 9 planted bad slots and some good ones */
      const int kl = i % 3, vl = (i + 1 + t) % 3;
      n = add(l, n, (append_case){dtypes[t], bs, nb, H, D, tokens, kl, vl, i % 2 ? NEW_QKV : NEW_PACKED, i % 4 == 3,
                                  i % 5 != 4});
    }
  /* More tokens than slots (the rest -1), and decode: one token per sequence. */
  n = add(l, n, (append_case){FCL_DTYPE_F16, 16, 2, 8, 128, 40, POOL_NHD, POOL_NHD, NEW_PACKED, 1, 0});
  n = add(l, n, (append_case){FCL_DTYPE_F32, 16, 64, 4, 64, 1, POOL_NHD, POOL_NHD, NEW_QKV, 0, 0});
  /* K and V interleaved block by block in one buffer: their spans cross, their elements do not. */
  n = add(l, n, (append_case){FCL_DTYPE_F16, 16, 5, 2, 40, 60, POOL_NHD, POOL_NHD, NEW_PACKED, 2, 1});
  n = add(l, n, (append_case){FCL_DTYPE_BF16, 1, 30, 3, 7, 25, POOL_NHD, POOL_NHD, NEW_QKV, 2, 1});
  return n;
}

int main(int argc, char **argv) {
  test_cli cli = {0, NULL, 0};
  if (test_cli_parse(&cli, argc, argv)) return 2;
  enum { MAX = 40 };
  static append_case cases[32];
  static test_case list[MAX];
  static const int64_t dep_tokens[2] = {9, 0};
  const int count = cli.small ? small_cases(cases) : full_cases(cases);
  int n = 0;
  char name[TEST_CASE_NAME_MAX];
  for (int i = 0; i < count; ++i) {
    case_name(&cases[i], name, sizeof name);
    n = test_case_add(list, n, MAX, "", name, run_append, &cases[i]);
  }
  if (!cli.small) {
    n = test_case_add(list, n, MAX, "", "duplicate_slots", run_duplicates, NULL);
    n = test_case_add(list, n, MAX, "", "pools_disjoint_brute_force", run_disjoint_brute_force, NULL);
    n = test_case_add(list, n, MAX, "", "validation", run_validation, NULL);
    n = test_case_add(list, n, MAX, "", "zero_tokens_event", run_empty, NULL);
    n = test_case_add(list, n, MAX, "", "failed_user_event", run_failed_dependency, &dep_tokens[0]);
    n = test_case_add(list, n, MAX, "", "failed_user_event_zero_tokens", run_failed_dependency, &dep_tokens[1]);
  }
  return test_cases_main("test_kv_append", &cli, list, n);
}
