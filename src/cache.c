/* On-disk binary cache: one `<key>.bin` file per built program under ctx->cache_dir.
 *
 * The key is the SHA-256 of (library version, platform name and version, device name and version,
 * driver version, the program's full source text, its full build options), each field length-prefixed.
 * A file holds a fixed header, a label and the driver's binary:
 *
 *   offset  size  field
 *        0     8  magic "FLASHCL\x1a"
 *        8     4  format version (little-endian)
 *       12     4  header size (little-endian)
 *       16    32  the full key
 *       48    16  device tag: SHA-256 prefix of the device identity alone (lets tools count entries per device)
 *       64     8  payload size in bytes (little-endian)
 *       72    32  SHA-256 of the label and the payload
 *      104     4  label size in bytes (little-endian)
 *      108     4  zero
 *      112     -  label: the kernel name, NUL, the full build options, NUL
 *        -     -  payload: the program binary from CL_PROGRAM_BINARIES
 *
 * Trust. The payload is native code, so whoever can write the directory can run code in the process: a
 * directory that exists but is not owned by this user, or is writable by group or others, is not used
 * (fcl_cache_dir_check; the context runs without the disk cache and its stats say why); directories the
 * cache creates are 0700. The checksum catches accidents, the label catches an entry of another kernel
 * or variant filed under a key, and program.c treats any failure after a load (no such kernel) as a miss.
 * Entries are opened without following symbolic links and without blocking, only regular files of at most
 * CACHE_MAX_FILE bytes are read.
 *
 * Entries are written to a uniquely named temporary file in the same directory and renamed into place, so
 * readers in other threads or processes see either no file or a whole one. Anything that goes wrong on
 * load (missing, short, corrupt, another key, refused by the driver) is a miss; anything that goes wrong
 * on store leaves the program usable and the cache unchanged. A successful store also removes temporary
 * files over an hour old (left by a writer that died). Nothing here prints or records an error.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define CACHE_MAGIC "FLASHCL\x1a"
#define CACHE_FORMAT_VERSION 2u
/* Program binaries are a few MiB at most; a larger file is not read. */
#define CACHE_MAX_FILE ((uint64_t)64 << 20)
#define CACHE_MAX_LABEL 65536u

/* ---- keys ---- */

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

/* A field with its length in front, so ("ab", "c") and ("a", "bc") hash differently. */
static void hash_field(fcl_sha256_state *s, const char *text) {
  unsigned char len[8];
  const size_t n = text ? strlen(text) : 0;
  put_u64(len, n);
  fcl_sha256_update(s, len, 8);
  if (n) fcl_sha256_update(s, text, n);
}

static void hash_device(fcl_sha256_state *s, const fcl_device_caps *caps) {
  hash_field(s, caps->platform_name);
  hash_field(s, caps->platform_version);
  hash_field(s, caps->device_name);
  hash_field(s, caps->device_version);
  hash_field(s, caps->driver_version);
}

void fcl_cache_key_compute(const fcl_device_caps *caps, const char *source, const char *options,
                           fcl_cache_key *key) {
  fcl_sha256_state s;
  fcl_sha256_init(&s);
  hash_field(&s, "flashcl program");
  hash_field(&s, fcl_version());
  hash_device(&s, caps);
  hash_field(&s, source);
  hash_field(&s, options);
  fcl_sha256_final(&s, key->bytes);
}

void fcl_cache_device_tag(const fcl_device_caps *caps, unsigned char tag[FCL_CACHE_TAG_SIZE]) {
  fcl_sha256_state s;
  unsigned char full[32];
  fcl_sha256_init(&s);
  hash_field(&s, "flashcl device");
  hash_device(&s, caps);
  fcl_sha256_final(&s, full);
  memcpy(tag, full, FCL_CACHE_TAG_SIZE);
}

void fcl_cache_key_hex(const fcl_cache_key *key, char hex[2 * FCL_CACHE_KEY_SIZE + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < FCL_CACHE_KEY_SIZE; ++i) {
    hex[2 * i] = digits[key->bytes[i] >> 4];
    hex[2 * i + 1] = digits[key->bytes[i] & 15];
  }
  hex[2 * FCL_CACHE_KEY_SIZE] = '\0';
}

/* ---- files ---- */

/* dir + "/" + name, or NULL. */
static char *join_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *path = malloc(n);
  if (path) snprintf(path, n, "%s/%s", dir, name);
  return path;
}

static char *entry_path(const char *dir, const fcl_cache_key *key) {
  char name[2 * FCL_CACHE_KEY_SIZE + 8];
  fcl_cache_key_hex(key, name);
  strcat(name, ".bin");
  return join_path(dir, name);
}

/* mkdir -p, private to the user; 0 when the directory exists afterwards. */
static int make_dirs(const char *dir) {
  struct stat st;
  if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : -1;
  char *path = strdup(dir);
  if (!path) return -1;
  int rc = 0;
  for (char *p = path + 1; rc == 0; ++p) {
    if (*p != '/' && *p != '\0') continue;
    const char saved = *p;
    *p = '\0';
    if (mkdir(path, 0700) != 0 && errno != EEXIST) rc = -1;
    else if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) rc = -1;
    *p = saved;
    if (saved == '\0') break;
  }
  free(path);
  return rc;
}

int fcl_cache_dir_check(const char *dir, char *why, size_t why_size) {
  struct stat st;
  /* Nothing there yet (created 0700 by the first store), or nothing that can be: writes will fail and be
     counted, and every store and load checks again. */
  if (stat(dir, &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, why_size, "the cache directory %s is not a directory", dir);
    return -1;
  }
  if (st.st_uid != geteuid()) {
    snprintf(why, why_size, "the cache directory %s is owned by uid %ld, not by this user (uid %ld)", dir,
             (long)st.st_uid, (long)geteuid());
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, why_size, "the cache directory %s is writable by %s (mode %03o)", dir,
             (st.st_mode & S_IWOTH) ? "others" : "its group", (unsigned)(st.st_mode & 0777));
    return -1;
  }
  return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

/* The label: name, NUL, options, NUL. Its length, or 0 when it does not fit CACHE_MAX_LABEL. */
static size_t label_length(const char *name, const char *options) {
  const size_t n = strlen(name) + strlen(options) + 2;
  return n <= CACHE_MAX_LABEL ? n : 0;
}

static void encode_header(unsigned char h[FCL_CACHE_HEADER_SIZE], const fcl_cache_key *key,
                          const unsigned char tag[FCL_CACHE_TAG_SIZE], const unsigned char *label, size_t label_size,
                          const void *payload, size_t size) {
  memset(h, 0, FCL_CACHE_HEADER_SIZE);
  memcpy(h, CACHE_MAGIC, 8);
  put_u32(h + 8, CACHE_FORMAT_VERSION);
  put_u32(h + 12, FCL_CACHE_HEADER_SIZE);
  memcpy(h + 16, key->bytes, FCL_CACHE_KEY_SIZE);
  memcpy(h + 48, tag, FCL_CACHE_TAG_SIZE);
  put_u64(h + 64, size);
  fcl_sha256_state s;
  fcl_sha256_init(&s);
  fcl_sha256_update(&s, label, label_size);
  fcl_sha256_update(&s, payload, size);
  fcl_sha256_final(&s, h + 72);
  put_u32(h + 104, (uint32_t)label_size);
}

/* Removes temporary files that writers which died mid-write left behind (older than an hour: a live writer
   renames its file within the time it takes to write one program binary). */
#define CACHE_STALE_TMP_SECONDS 3600
static void remove_stale_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  const time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".tmp.", 5) != 0) continue;
    char *path = join_path(dir, e->d_name);
    struct stat st;
    if (path && lstat(path, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > CACHE_STALE_TMP_SECONDS)
      unlink(path);
    free(path);
  }
  closedir(d);
}

int fcl_cache_write_entry(const char *dir, const fcl_cache_key *key, const unsigned char tag[FCL_CACHE_TAG_SIZE],
                          const char *name, const char *options, const void *payload, size_t size) {
  static atomic_uint counter;
  static _Thread_local char thread_marker;
  char why[8];
  const size_t label_size = label_length(name, options);
  if (!dir || !label_size || size > CACHE_MAX_FILE - FCL_CACHE_HEADER_SIZE - label_size || make_dirs(dir) != 0 ||
      fcl_cache_dir_check(dir, why, sizeof why) != 0)
    return -1;
  unsigned char *label = malloc(label_size);
  char *path = entry_path(dir, key);
  if (!label || !path) {
    free(label);
    free(path);
    return -1;
  }
  memcpy(label, name, strlen(name) + 1);
  memcpy(label + strlen(name) + 1, options, strlen(options) + 1);
  /* Unique among processes (pid), threads (an address private to this thread) and calls (counter). */
  char tmp_name[128];
  snprintf(tmp_name, sizeof tmp_name, ".tmp.%ld.%lx.%u", (long)getpid(),
           (unsigned long)(uintptr_t)&thread_marker, atomic_fetch_add(&counter, 1u));
  char *tmp = join_path(dir, tmp_name);
  int rc = -1;
  if (tmp) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      unsigned char header[FCL_CACHE_HEADER_SIZE];
      encode_header(header, key, tag, label, label_size, payload, size);
      int ok = write_all(fd, header, sizeof header) == 0 && write_all(fd, label, label_size) == 0 &&
               write_all(fd, payload, size) == 0;
      ok = close(fd) == 0 && ok;
      if (ok && rename(tmp, path) == 0) rc = 0;
      else unlink(tmp);
    }
  }
  if (rc == 0) remove_stale_temporaries(dir);
  free(tmp);
  free(path);
  free(label);
  return rc;
}

/* Opens an entry for reading: never through a symbolic link, never blocking (a FIFO), and only a regular
   file of at most CACHE_MAX_FILE bytes. -1 when it is anything else; *st describes it. */
static int open_entry(const char *path, struct stat *st) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_size <= 0 || (uint64_t)st->st_size > CACHE_MAX_FILE) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Reads a whole entry file; NULL on any failure. */
static unsigned char *read_file(const char *path, size_t *size) {
  struct stat st;
  int fd = open_entry(path, &st);
  if (fd < 0) return NULL;
  unsigned char *data = malloc((size_t)st.st_size);
  size_t got = 0;
  while (data && got < (size_t)st.st_size) {
    ssize_t r = read(fd, data + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (data && got != (size_t)st.st_size) {
    free(data);
    data = NULL;
  }
  if (data) *size = got;
  return data;
}

const unsigned char *fcl_cache_parse_entry(const unsigned char *data, size_t size, const fcl_cache_key *key,
                                           const char *name, const char *options, size_t *payload_size) {
  if (size <= FCL_CACHE_HEADER_SIZE || memcmp(data, CACHE_MAGIC, 8) != 0 ||
      get_u32(data + 8) != CACHE_FORMAT_VERSION || get_u32(data + 12) != FCL_CACHE_HEADER_SIZE ||
      memcmp(data + 16, key->bytes, FCL_CACHE_KEY_SIZE) != 0 || get_u32(data + 108) != 0)
    return NULL;
  /* Sizes are checked by subtraction from what is there, so no sum can wrap. */
  const size_t rest = size - FCL_CACHE_HEADER_SIZE;
  const uint32_t label_size = get_u32(data + 104);
  const uint64_t payload = get_u64(data + 64);
  if (label_size == 0 || label_size > CACHE_MAX_LABEL || label_size >= rest || payload != rest - label_size)
    return NULL;
  /* The label must be exactly name NUL options NUL. */
  const char *label = (const char *)data + FCL_CACHE_HEADER_SIZE;
  const size_t name_len = strlen(name), options_len = strlen(options);
  if ((size_t)label_size != name_len + options_len + 2 || memcmp(label, name, name_len + 1) != 0 ||
      memcmp(label + name_len + 1, options, options_len + 1) != 0)
    return NULL;
  unsigned char sum[32];
  fcl_sha256(data + FCL_CACHE_HEADER_SIZE, rest, sum);
  if (memcmp(sum, data + 72, 32) != 0) return NULL;
  *payload_size = (size_t)payload;
  return data + FCL_CACHE_HEADER_SIZE + label_size;
}

unsigned char *fcl_cache_read_entry(const char *dir, const fcl_cache_key *key, const char *name, const char *options,
                                    size_t *size) {
  char why[8];
  if (!dir || fcl_cache_dir_check(dir, why, sizeof why) != 0) return NULL;
  char *path = entry_path(dir, key);
  size_t file_size = 0, payload_size = 0;
  unsigned char *data = path ? read_file(path, &file_size) : NULL;
  free(path);
  const unsigned char *payload = data ? fcl_cache_parse_entry(data, file_size, key, name, options, &payload_size) : NULL;
  unsigned char *copy = payload ? malloc(payload_size) : NULL;
  if (copy) {
    memcpy(copy, payload, payload_size);
    *size = payload_size;
  }
  free(data);
  return copy;
}

/* ---- the hooks used by program.c (called outside ctx->lock: a build runs with it released) ---- */

/* Counts one kernel request's outcome (and where it was served from, when last >= 0). Builds run outside
   ctx->lock, so the counters have their own. */
static void note(fcl_context *ctx, uint64_t *counter, int last) {
  pthread_mutex_lock(&ctx->stats_lock);
  ++*counter;
  if (last >= 0) ctx->cache_last = last;
  pthread_mutex_unlock(&ctx->stats_lock);
}

cl_program fcl_cache_load(fcl_context *ctx, const char *source, const char *options, const char *name,
                          fcl_cache_key *key, cl_kernel *kernel) {
  fcl_cache_key_compute(&ctx->caps, source, options, key);
  char why[8];
  if (!ctx->cache_dir || fcl_cache_dir_check(ctx->cache_dir, why, sizeof why) != 0) return NULL;
  char *path = entry_path(ctx->cache_dir, key);
  if (!path) return NULL;
  size_t size = 0, payload_size = 0;
  unsigned char *data = read_file(path, &size);
  struct stat st;
  int present = data != NULL || lstat(path, &st) == 0;
  free(path);
  const unsigned char *payload = data ? fcl_cache_parse_entry(data, size, key, name, options, &payload_size) : NULL;
  cl_program program = NULL;
  if (payload) {
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    program = clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &payload_size, &payload, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
      if (program && err == CL_SUCCESS) clReleaseProgram(program);
      program = NULL;
    } else {
      /* The program must build and hold the kernel asked for; anything else is a miss. */
      *kernel = NULL;
      if (clBuildProgram(program, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS ||
          !(*kernel = clCreateKernel(program, name, &err)) || err != CL_SUCCESS) {
        if (*kernel) clReleaseKernel(*kernel);
        *kernel = NULL;
        clReleaseProgram(program);
        program = NULL;
      }
    }
  }
  free(data);
  if (program) note(ctx, &ctx->cache_disk_hits, FCL_CACHE_DISK);
  else if (present) note(ctx, &ctx->cache_disk_rejected, -1);
  return program;
}

void fcl_cache_store(fcl_context *ctx, const fcl_cache_key *key, const char *name, const char *options,
                     cl_program program) {
  note(ctx, &ctx->cache_source_builds, FCL_CACHE_SOURCE);
  if (!ctx->cache_dir) return;
  cl_uint devices = 0;
  size_t size = 0;
  if (clGetProgramInfo(program, CL_PROGRAM_NUM_DEVICES, sizeof devices, &devices, NULL) != CL_SUCCESS ||
      devices != 1 ||
      clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || size == 0 ||
      size > CACHE_MAX_FILE) {
    note(ctx, &ctx->cache_disk_write_failures, -1);
    return;
  }
  unsigned char *binary = malloc(size);
  unsigned char tag[FCL_CACHE_TAG_SIZE];
  fcl_cache_device_tag(&ctx->caps, tag);
  if (binary && clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof binary, &binary, NULL) == CL_SUCCESS &&
      fcl_cache_write_entry(ctx->cache_dir, key, tag, name, options, binary, size) == 0)
    note(ctx, &ctx->cache_disk_writes, -1);
  else
    note(ctx, &ctx->cache_disk_write_failures, -1);
  free(binary);
}

void fcl_cache_note_memory_hit(fcl_context *ctx) { note(ctx, &ctx->cache_memory_hits, FCL_CACHE_MEMORY); }

/* Counts the entries in dir whose header names this device (valid magic, version and device tag). */
static void count_device_entries(const char *dir, const fcl_device_caps *caps, uint64_t *count, uint64_t *bytes) {
  *count = *bytes = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  unsigned char tag[FCL_CACHE_TAG_SIZE];
  fcl_cache_device_tag(caps, tag);
  struct dirent *e;
  while ((e = readdir(d))) {
    const size_t n = strlen(e->d_name);
    if (n != 2 * FCL_CACHE_KEY_SIZE + 4 || strcmp(e->d_name + n - 4, ".bin") != 0) continue;
    char *path = join_path(dir, e->d_name);
    if (!path) continue;
    struct stat st;
    int fd = open_entry(path, &st);
    free(path);
    if (fd < 0) continue;
    unsigned char h[FCL_CACHE_HEADER_SIZE];
    if (read(fd, h, sizeof h) == (ssize_t)sizeof h && memcmp(h, CACHE_MAGIC, 8) == 0 &&
        get_u32(h + 8) == CACHE_FORMAT_VERSION && memcmp(h + 48, tag, FCL_CACHE_TAG_SIZE) == 0) {
      ++*count;
      *bytes += (uint64_t)st.st_size;
    }
    close(fd);
  }
  closedir(d);
}

fcl_status fcl_context_cache_stats(fcl_context *ctx, fcl_cache_stats *out) {
  if (!ctx) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  if (!out) return fcl_fail(FCL_ERROR_INVALID_ARGUMENT, "out is NULL");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&ctx->stats_lock);
  out->cache_dir = ctx->cache_dir;
  out->memory_hits = ctx->cache_memory_hits;
  out->disk_hits = ctx->cache_disk_hits;
  out->disk_rejected = ctx->cache_disk_rejected;
  out->source_builds = ctx->cache_source_builds;
  out->disk_writes = ctx->cache_disk_writes;
  out->disk_write_failures = ctx->cache_disk_write_failures;
  out->last = (fcl_cache_source)ctx->cache_last;
  out->cache_refused = ctx->cache_refused[0] ? ctx->cache_refused : NULL;
  pthread_mutex_unlock(&ctx->stats_lock);
  if (ctx->cache_dir) count_device_entries(ctx->cache_dir, &ctx->caps, &out->device_entries, &out->device_bytes);
  return FCL_SUCCESS;
}
