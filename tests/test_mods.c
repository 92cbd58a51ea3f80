#include "test_mods.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static cl_mem upload_bytes(test_env *env, const void *data, size_t bytes) {
  cl_int err;
  cl_mem buf = clCreateBuffer(env->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, (void *)data, &err);
  return err == CL_SUCCESS ? buf : NULL;
}

int mods_create(test_env *env, const test_mods *m, fcl_attention_desc *desc, mod_buffers *out) {
  memset(out, 0, sizeof *out);
  const long long B = desc->batch, H = desc->num_heads, Nq = desc->seqlen_q, Nk = desc->seqlen_k;
  desc->softcap = m->softcap;
  desc->window = m->window;
  desc->window_left = m->left;
  desc->window_right = m->right;
  if (m->alibi) {
    /* Slopes as ALiBi makes them (2^(-8 (h + 1) / H)), perturbed so heads and batches differ. */
    const long long offset = m->alibi == 2 ? 3 : 0, bs = m->alibi == 2 ? H : 0;
    const size_t n = (size_t)(offset + (m->alibi == 2 ? B * H : H));
    float *raw = malloc(n * sizeof(float));
    out->slope_values = malloc((size_t)(B * H) * sizeof(double));
    for (size_t i = 0; i < n; ++i) raw[i] = NAN;
    for (long long b = 0; b < (m->alibi == 2 ? B : 1); ++b)
      for (long long h = 0; h < H; ++h)
        raw[offset + b * bs + h] = (float)(pow(2.0, -8.0 * (double)(h + 1) / (double)H) * (1.0 + 0.25 * test_uniform()));
    for (long long b = 0; b < B; ++b)
      for (long long h = 0; h < H; ++h) out->slope_values[b * H + h] = raw[offset + b * bs + h];
    out->slopes = upload_bytes(env, raw, n * sizeof(float));
    free(raw);
    if (!out->slopes) return -1;
    desc->alibi_slopes = out->slopes;
    desc->alibi_batch_stride = bs;
    desc->alibi_offset = offset;
    out->host.slopes = out->slope_values;
  }
  if (m->mask) {
    const fcl_dtype t = m->mask == MASK_FULL_F32 ? FCL_DTYPE_F32 : m->mask == MASK_GGML_F16 ? FCL_DTYPE_F16 : FCL_DTYPE_BF16;
    long long stride[3], offset = 0;
    /* Padded rows catch a wrong row stride. The f32 and ggml-style masks pad to an even row stride (as ggml pads
       its rows), which gives NVIDIA's forward the pair loads (MASK_PAIRS), and where the stride comes out a
       multiple of 16 bytes (f32 for about half the Nk, the ggml-style mask for every odd Nk) the runs of 16-byte
       loads (MASK_VEC); the bf16 mask's rows of Nk keys take single loads where Nk is odd. */
    const long long ld = m->mask == MASK_FULL_F32   ? (Nk + 3) & ~1LL
                         : m->mask == MASK_GGML_F16 ? (Nk % 2 ? (Nk + 7) & ~7LL : Nk + 2)
                                                    : Nk;
    if (m->mask == MASK_FULL_F32) stride[0] = H * Nq * ld, stride[1] = Nq * ld, stride[2] = ld, offset = 4;
    else if (m->mask == MASK_GGML_F16) stride[0] = 0, stride[1] = 0, stride[2] = ld;
    else stride[0] = 0, stride[1] = Nq * ld, stride[2] = ld;
    const long long hb = stride[0] ? B : 1, hh = stride[1] ? H : 1;
    const size_t n = (size_t)(offset + (hb - 1) * stride[0] + (hh - 1) * stride[1] + (Nq - 1) * ld + Nk);
    const size_t es = dtype_size(t);
    unsigned char *raw = malloc(n * es);
    for (size_t i = 0; i < n; ++i) encode_dtype(NAN, t, raw + i * es); /* padding: NaN, never read */
    for (long long b = 0; b < hb; ++b)
      for (long long h = 0; h < hh; ++h)
        for (long long i = 0; i < Nq; ++i)
          for (long long j = 0; j < Nk; ++j) {
            const double u = test_uniform();
            const int hidden = (m->hide_rows && i % 5 == 2) || fabs(u) > 0.85;
            const float x = hidden ? -INFINITY : (float)(2.0 * u);
            encode_dtype(x, t, raw + (size_t)(offset + b * stride[0] + h * stride[1] + i * stride[2] + j) * es);
          }
    out->mask_values = malloc((size_t)(B * H * Nq * Nk) * sizeof(double));
    for (long long b = 0; b < B; ++b)
      for (long long h = 0; h < H; ++h)
        for (long long i = 0; i < Nq; ++i)
          for (long long j = 0; j < Nk; ++j) {
            const size_t at = (size_t)(offset + (stride[0] ? b : 0) * stride[0] + (stride[1] ? h : 0) * stride[1] +
                                       i * stride[2] + j);
            out->mask_values[((b * H + h) * Nq + i) * Nk + j] = decode_dtype(raw + at * es, t);
          }
    out->mask = upload_bytes(env, raw, n * es);
    free(raw);
    if (!out->mask) return -1;
    desc->mask = out->mask;
    desc->mask_dtype = t;
    for (int i = 0; i < 3; ++i) desc->mask_stride[i] = stride[i];
    desc->mask_offset = offset;
    out->host.mask = out->mask_values;
  }
  if (m->sinks) {
    float *raw = malloc((size_t)H * sizeof(float));
    out->sink_values = malloc((size_t)H * sizeof(double));
    for (long long h = 0; h < H; ++h) out->sink_values[h] = raw[h] = (float)(1.5 * test_uniform());
    out->sinks = upload_bytes(env, raw, (size_t)H * sizeof(float));
    free(raw);
    if (!out->sinks) return -1;
    desc->sinks = out->sinks;
    out->host.sinks = out->sink_values;
  }
  return 0;
}

void mods_release(mod_buffers *b) {
  if (b->slopes) clReleaseMemObject(b->slopes);
  if (b->mask) clReleaseMemObject(b->mask);
  if (b->sinks) clReleaseMemObject(b->sinks);
  free(b->slope_values), free(b->mask_values), free(b->sink_values);
  memset(b, 0, sizeof *b);
}

void mods_describe(const test_mods *m, char *out, size_t size) {
  static const char *masks[] = {"", " mask-f32", " mask-ggml-f16", " mask-head-bf16"};
  size_t n = strlen(out);
  if (m->window) n += (size_t)snprintf(out + n, size - n, " window(%lld,%lld)", m->left, m->right);
  if (n < size && m->softcap > 0) n += (size_t)snprintf(out + n, size - n, " softcap %g", (double)m->softcap);
  if (n < size && m->alibi) n += (size_t)snprintf(out + n, size - n, " alibi%s", m->alibi == 2 ? "[B,H]" : "[H]");
  if (n < size && m->mask) n += (size_t)snprintf(out + n, size - n, "%s%s", masks[m->mask], m->hide_rows ? " hidden-rows" : "");
  if (n < size && m->sinks) snprintf(out + n, size - n, " sinks");
}

static void append(char *out, size_t size, const char *fmt, ...) {
  const size_t n = strlen(out);
  if (n + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + n, size - n, fmt, ap);
  va_end(ap);
}

void mods_name(const test_mods *m, char *out, size_t size) {
  static const char *masks[] = {"", "_mask-f32", "_mask-ggml-f16", "_mask-head-bf16"};
  if (m->window) {
    char left[24] = "inf", right[24] = "inf";
    if (m->left >= 0) snprintf(left, sizeof left, "%lld", m->left);
    if (m->right >= 0) snprintf(right, sizeof right, "%lld", m->right);
    append(out, size, "_window%s_%s", left, right);
  }
  if (m->softcap > 0) append(out, size, "_softcap%g", (double)m->softcap);
  if (m->alibi) append(out, size, "_alibi-%s", m->alibi == 2 ? "bh" : "h");
  if (m->mask) append(out, size, "%s%s", masks[m->mask], m->hide_rows ? "_hidden-rows" : "");
  if (m->sinks) append(out, size, "_sinks");
}
