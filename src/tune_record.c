/* The tuned shape of the portable forward: its record and its place in planning (fcl_plan_forward_tuned).
 *
 * A record lives in the context (per dtype and head_dim, under ctx->lock) and, with a disk cache, in an
 * entry of the binary cache's format (cache.c: header with magic, key, payload size and SHA-256) written
 * by fcl_cache_write_entry (temporary file + rename). Its key is fcl_cache_key_compute of the device
 * identity and library version (as for binaries), the embedded source of the portable forward kernel, and
 * options naming the record's format, head_dim, dtype and the context's build options: another device,
 * driver, library or kernel source never finds it. The payload is a few lines of text, checked again on
 * load (head_dim, dtype, shape values); a record whose shape no longer fits is ignored by planning.
 * fcl_tune_forward (tune.c) makes the records; the planner (forward.c) reads them.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TUNE_FORMAT 1 /* of the record's key options and payload */
#define TUNE_PAYLOAD_MAX 512

static const char *const forward_sources[] = {"common.cl", "flash_fwd.cl"};

static int shape_valid(const fcl_forward_shape *s) {
  return s->tr >= 1 && s->tr <= 255 && s->tc >= 1 && s->tc <= 255 && s->rm >= 1 && s->rm <= 255 && s->rn >= 1 &&
         s->rn <= 255 && (s->pad == 0 || s->pad == 1) && (s->kt == 0 || s->kt == 1);
}

void fcl_forward_shape_of_plan(const fcl_tile_plan *t, fcl_forward_shape *s) {
  s->tr = t->tr, s->tc = t->tc, s->rm = t->rm, s->rn = t->rn, s->kt = t->kt;
  s->pad = t->ds != t->dp;
}

void fcl_forward_shape_string(const fcl_tile_plan *t, char *out, size_t size) {
  snprintf(out, size, "%d,%d,%d,%d,%d", t->tr, t->tc, t->rm, t->rn, t->kt);
}

/* ---- the record's key, path and payload ---- */

static void tune_key(const fcl_context *ctx, int head_dim, fcl_dtype dtype, fcl_cache_key *key) {
  /* The embedded kernel source (FLASHCL_KERNEL_DIR, a development override, is not followed here). */
  size_t n = 1;
  const char *parts[2] = {"", ""};
  for (int f = 0; f < 2; ++f)
    for (int i = 0; i < fcl_embedded_source_count; ++i)
      if (strcmp(fcl_embedded_sources[i].name, forward_sources[f]) == 0) parts[f] = fcl_embedded_sources[i].text;
  n += strlen(parts[0]) + strlen(parts[1]);
  char *source = malloc(n);
  if (source) snprintf(source, n, "%s%s", parts[0], parts[1]);
  char options[1024];
  snprintf(options, sizeof options, "flashcl forward tune %d; head_dim %d; dtype %d; build options %s", TUNE_FORMAT,
           head_dim, (int)dtype, ctx->build_options ? ctx->build_options : "");
  /* Without memory for the source, key the record by the file names: it is then simply not found. */
  fcl_cache_key_compute(&ctx->caps, source ? source : "flash_fwd.cl (source unavailable)", options, key);
  free(source);
}

char *fcl_tune_file_path(const fcl_context *ctx, int head_dim, fcl_dtype dtype) {
  if (!ctx || !ctx->cache_dir) return NULL;
  fcl_cache_key key;
  tune_key(ctx, head_dim, dtype, &key);
  char hex[2 * FCL_CACHE_KEY_SIZE + 1];
  fcl_cache_key_hex(&key, hex);
  const size_t n = strlen(ctx->cache_dir) + sizeof hex + 8;
  char *path = malloc(n);
  if (path) snprintf(path, n, "%s/%s.bin", ctx->cache_dir, hex);
  return path;
}

static int format_payload(char *out, size_t size, int head_dim, fcl_dtype dtype, const fcl_forward_shape *s,
                          double best_ms, double default_ms) {
  return snprintf(out, size,
                  "flashcl forward tune %d\nhead_dim %d\ndtype %d\nshape %d,%d,%d,%d pad %d kt %d\n"
                  "best_ms %.6f\ndefault_ms %.6f\n",
                  TUNE_FORMAT, head_dim, (int)dtype, s->tr, s->tc, s->rm, s->rn, s->pad, s->kt, best_ms, default_ms);
}

/* 0 when the payload is a record of this format for (head_dim, dtype) with a valid shape. */
static int parse_payload(const unsigned char *data, size_t size, int head_dim, fcl_dtype dtype, fcl_forward_shape *s) {
  char text[TUNE_PAYLOAD_MAX + 1];
  if (size == 0 || size > TUNE_PAYLOAD_MAX) return -1;
  memcpy(text, data, size);
  text[size] = '\0';
  int format = 0, hd = 0, dt = -1;
  if (sscanf(text, "flashcl forward tune %d head_dim %d dtype %d shape %d,%d,%d,%d pad %d kt %d", &format, &hd, &dt,
             &s->tr, &s->tc, &s->rm, &s->rn, &s->pad, &s->kt) != 9)
    return -1;
  return format == TUNE_FORMAT && hd == head_dim && dt == (int)dtype && shape_valid(s) ? 0 : -1;
}

/* ---- planning ---- */

static fcl_tuned_slot *slot_of(fcl_context *ctx, int head_dim, fcl_dtype dtype) {
  if (head_dim < 1 || head_dim > FCL_MAX_HEAD_DIM || (int)dtype < 0 || (int)dtype > 2) return NULL;
  return &ctx->tuned[dtype][head_dim];
}

static void set_slot(fcl_tuned_slot *slot, const fcl_forward_shape *s) {
  if (!s) {
    memset(slot, 0, sizeof *slot);
    slot->state = 1;
    return;
  }
  slot->state = 2;
  slot->tr = (unsigned char)s->tr, slot->tc = (unsigned char)s->tc, slot->rm = (unsigned char)s->rm;
  slot->rn = (unsigned char)s->rn, slot->pad = (unsigned char)s->pad, slot->kt = (unsigned char)s->kt;
}

/* Looks the record up on disk once; a missing, corrupt or mismatching one leaves the default. */
static void load_slot(fcl_context *ctx, int head_dim, fcl_dtype dtype, fcl_tuned_slot *slot) {
  set_slot(slot, NULL);
  if (!ctx->cache_dir) return;
  fcl_cache_key key;
  tune_key(ctx, head_dim, dtype, &key);
  size_t size = 0;
  unsigned char *data = fcl_cache_read_entry(ctx->cache_dir, &key, FCL_TUNE_ENTRY_NAME, "", &size);
  fcl_forward_shape s;
  if (data && parse_payload(data, size, head_dim, dtype, &s) == 0) set_slot(slot, &s);
  free(data);
}

int fcl_plan_forward_tuned(fcl_context *ctx, const fcl_problem *p, const size_t *kernel_wg, fcl_tile_plan *out) {
  const int head_dim = (int)p->d;
  fcl_tuned_slot *slot = slot_of(ctx, head_dim, p->dtype);
  if (!slot || ctx->overrides.forward_shape[0] || p->block_table) return -1; /* FLASHCL_FORWARD_SHAPE wins; paged keys keep the rule */
  if (slot->state == 0) load_slot(ctx, head_dim, p->dtype, slot);
  if (slot->state != 2 ||
      fcl_plan_forward_shape(&ctx->caps, head_dim, kernel_wg ? kernel_wg[0] : 0, slot->tr, slot->tc, slot->rm,
                             slot->rn, slot->pad, slot->kt, out) != 0 ||
      fcl_forward_block_rows(p) < out->br) /* few rows: the planner's decode shape */
    return -1;
  out->pack = fcl_forward_packs(p);
  snprintf(out->reason, sizeof out->reason,
           "tuned on this device (fcl_tune_forward): %dx%d work-items, each %d rows x %d keys, %d output columns%s",
           out->tr, out->tc, out->rm, out->rn, out->dn, out->kt ? ", K tile transposed" : "");
  return 0;
}

fcl_status fcl_tune_record(fcl_context *ctx, int head_dim, fcl_dtype dtype, const fcl_forward_shape *shape,
                           double best_ms, double default_ms, int *saved) {
  if (saved) *saved = 0;
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  fcl_tuned_slot *slot = slot_of(ctx, head_dim, dtype);
  if (!slot) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "head_dim %d or dtype %d is out of range", head_dim, (int)dtype);
  if (shape && !shape_valid(shape))
    return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "shape %d,%d,%d,%d pad %d kt %d is not a valid forward shape", shape->tr,
                    shape->tc, shape->rm, shape->rn, shape->pad, shape->kt);
  char payload[TUNE_PAYLOAD_MAX];
  int n = shape ? format_payload(payload, sizeof payload, head_dim, dtype, shape, best_ms, default_ms) : 0;
  char *path = fcl_tune_file_path(ctx, head_dim, dtype);
  pthread_mutex_lock(&ctx->lock);
  set_slot(slot, shape);
  if (ctx->cache_dir && shape && n > 0 && n < (int)sizeof payload) {
    fcl_cache_key key;
    unsigned char tag[FCL_CACHE_TAG_SIZE];
    tune_key(ctx, head_dim, dtype, &key);
    fcl_cache_device_tag(&ctx->caps, tag);
    if (fcl_cache_write_entry(ctx->cache_dir, &key, tag, FCL_TUNE_ENTRY_NAME, "", payload, (size_t)n) == 0 && saved) *saved = 1;
  } else if (path && !shape) {
    unlink(path); /* no record: the default stays, for new contexts too */
  }
  pthread_mutex_unlock(&ctx->lock);
  free(path);
  return FCL_SUCCESS;
}

