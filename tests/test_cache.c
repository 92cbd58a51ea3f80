/* The on-disk binary cache: a second context and a second process load from disk without compiling and
 * reach their first result sooner; damaged, mismatched or driver-refused entries fall back to a source
 * build and are rewritten; an unwritable directory still runs; four processes populating one key leave one
 * valid file; the key follows the source text, the build options and the device identity.
 *
 * Every forward run is checked against the float64 host reference (run_forward_case, bounds in
 * forward_check.h). Scratch directories live under FLASHCL_CACHE_TEST_DIR in the build tree.
 *
 *   test_cache                         the suite
 *   test_cache --child-load DIR        (internal) one forward from DIR's cache; exit 0 when it was a disk hit
 *   test_cache --child-populate DIR T  (internal) one forward after CLOCK_REALTIME T (ns); exit 0 on success
 *   test_cache --child-refused DIR     (internal) one forward over DIR's damaged entry; exit 0 when it was
 *                                      rejected, rebuilt from source and rewritten
 *   FLASHCL_CACHE_TEST_DIR (environment) moves the scratch directories elsewhere
 */
#include "forward_check.h"
#include "internal.h"

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FLASHCL_CACHE_TEST_DIR
#error "FLASHCL_CACHE_TEST_DIR must name a scratch directory in the build tree"
#endif
#ifndef FLASHCL_CL_DIR
#error "FLASHCL_CL_DIR must name the source tree's cl/ directory"
#endif

static const char *self_path;
/* The file name of this device's loop budget record (loop_budget.c), an entry every cache directory gets
   beside the kernels; count_files leaves it out. */
static char budget_record[2 * FCL_CACHE_KEY_SIZE + 8];

/* The problem every phase runs: small, so the host reference is quick; one kernel variant. */
static const fwd_case base_case = {1, 2, 0, 67, 45, 64, FCL_DTYPE_F32, 0, LAYOUT_BHND, 0, 1};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- files ---- */

static char *path_join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

static unsigned char *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *data = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n + 1))) {
      if (fread(data, 1, (size_t)n, f) != (size_t)n) {
        free(data);
        data = NULL;
      } else {
        *size = (size_t)n;
      }
    }
  }
  fclose(f);
  return data;
}

static int spit(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, size, f) == size;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    chmod(path, 0755);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char *child = path_join(path, e->d_name);
      remove_tree(child);
      free(child);
    }
    if (d) closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static int copy_tree(const char *from, const char *to) {
  struct stat st;
  if (stat(from, &st) != 0) return -1;
  if (S_ISDIR(st.st_mode)) {
    if (mkdir(to, 0755) != 0 && errno != EEXIST) return -1;
    DIR *d = opendir(from);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char *a = path_join(from, e->d_name), *b = path_join(to, e->d_name);
      rc |= copy_tree(a, b);
      free(a);
      free(b);
    }
    closedir(d);
    return rc;
  }
  size_t n = 0;
  unsigned char *data = slurp(from, &n);
  int rc = data ? spit(to, data, n) : -1;
  free(data);
  return rc;
}

/* Counts files in dir but the loop budget record: entries named <64 hex>.bin, and anything else (temporary
   files). Returns the
   path of the last entry in *entry (caller frees) when entry is not NULL. */
static int count_files(const char *dir, int *others, char **entry) {
  int bins = 0;
  *others = 0;
  if (entry) *entry = NULL;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, budget_record)) continue;
    size_t n = strlen(e->d_name);
    int hex = n == 2 * FCL_CACHE_KEY_SIZE + 4 && strcmp(e->d_name + n - 4, ".bin") == 0;
    for (size_t i = 0; hex && i < n - 4; ++i) hex = strchr("0123456789abcdef", e->d_name[i]) != NULL;
    if (hex) {
      ++bins;
      if (entry) {
        free(*entry);
        *entry = path_join(dir, e->d_name);
      }
    } else {
      ++*others;
    }
  }
  closedir(d);
  return bins;
}

static char *make_dir(const char *base, const char *name) {
  char *p = path_join(base, name);
  remove_tree(p);
  if (mkdir(p, 0755) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", p, strerror(errno));
    exit(1);
  }
  return p;
}

/* ---- one phase: a fresh fcl_context on the shared cl_context, one checked forward ---- */

typedef struct phase {
  fcl_cache_stats st;
  double seconds; /* context creation to the result read back */
  int result;     /* run_forward_case's: 0 pass */
  int created;
  char refused[512]; /* st.cache_refused, copied: the context owns the original */
} phase;

static void run_phase(test_env *env, const char *dir, const char *build_options, const fwd_case *c,
                      const char *label, phase *out) {
  memset(out, 0, sizeof *out);
  out->result = 1;
  fcl_context_options o = {dir, build_options, 0};
  fcl_context *ctx = NULL;
  const double t0 = now_s();
  fcl_status s = fcl_context_create(env->context, env->device, &o, &ctx);
  if (s != FCL_SUCCESS) {
    check(0, "%s: fcl_context_create: %s: %s", label, fcl_status_string(s), fcl_last_error());
    return;
  }
  out->created = 1;
  fcl_context *saved = env->fcl;
  env->fcl = ctx;
  out->result = run_forward_case(env, env->queue, c, fcl_attention_forward, label);
  out->seconds = now_s() - t0;
  fcl_context_cache_stats(ctx, &out->st);
  out->st.cache_dir = NULL; /* owned by ctx */
  snprintf(out->refused, sizeof out->refused, "%s", out->st.cache_refused ? out->st.cache_refused : "");
  out->st.cache_refused = NULL;
  env->fcl = saved;
  fcl_context_release(ctx);
}

static void print_stats(const char *label, const phase *p) {
  printf("     %s: %.3f s to first result; disk hits %llu, rejected %llu, source builds %llu, writes %llu, "
         "write failures %llu\n",
         label, p->seconds, (unsigned long long)p->st.disk_hits, (unsigned long long)p->st.disk_rejected,
         (unsigned long long)p->st.source_builds, (unsigned long long)p->st.disk_writes,
         (unsigned long long)p->st.disk_write_failures);
}

static int is_disk_hit(const phase *p) {
  return p->result == 0 && p->st.disk_hits >= 1 && p->st.source_builds == 0;
}
static int is_rebuilt(const phase *p) {
  return p->result == 0 && p->st.disk_hits == 0 && p->st.source_builds >= 1 && p->st.disk_writes == p->st.source_builds;
}

/* ---- children ---- */

static int child_main(int argc, char **argv) {
  const int populate = strcmp(argv[1], "--child-populate") == 0;
  const int refused = strcmp(argv[1], "--child-refused") == 0;
  if (argc < 3 || (populate && argc < 4)) return 2;
  test_seed();
  test_env env;
  fcl_context_options none = {"", NULL, 0};
  if (test_open(&env, &none)) return 2;
  fcl_context_options o = {argv[2], NULL, 0};
  fcl_context *ctx = NULL;
  if (populate) {
    /* Everyone compiles at once: wait for the common start time, with OpenCL already up. */
    const long long start = atoll(argv[3]);
    for (;;) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      long long t = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
      if (t >= start) break;
      struct timespec nap = {0, 1000000};
      nanosleep(&nap, NULL);
    }
  }
  const double t0 = now_s();
  if (fcl_context_create(env.context, env.device, &o, &ctx) != FCL_SUCCESS) return 3;
  fcl_context *saved = env.fcl;
  env.fcl = ctx;
  int r = run_forward_case(&env, env.queue, &base_case, fcl_attention_forward,
                           populate ? "populate" : refused ? "refused binary" : "child");
  const double seconds = now_s() - t0;
  fcl_cache_stats st;
  fcl_context_cache_stats(ctx, &st);
  printf("     process %ld: %.3f s to first result; disk hits %llu, source builds %llu, writes %llu\n", (long)getpid(),
         seconds, (unsigned long long)st.disk_hits, (unsigned long long)st.source_builds,
         (unsigned long long)st.disk_writes);
  env.fcl = saved;
  fcl_context_release(ctx);
  test_close(&env);
  if (r != 0) return 1;
  if (refused)
    return st.disk_rejected == 1 && st.disk_hits == 0 && st.source_builds >= 1 && st.disk_writes == st.source_builds ? 0
                                                                                                                      : 4;
  if (!populate && !(st.disk_hits >= 1 && st.source_builds == 0)) return 4;
  return 0;
}

static pid_t spawn(const char *mode, const char *dir, const char *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    char *args[] = {(char *)self_path, (char *)mode, (char *)dir, (char *)arg, NULL};
    execv(self_path, args);
    _exit(127);
  }
  return pid;
}

static int wait_status(pid_t pid) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* ---- the key, without a device ---- */

static int key_equal(const fcl_cache_key *a, const fcl_cache_key *b) { return memcmp(a->bytes, b->bytes, 32) == 0; }

static void test_keys(const fcl_device_caps *real) {
  /* SHA-256 itself, against FIPS 180-4's examples. */
  static const char *inputs[] = {"abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", ""};
  static const char *digests[] = {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                                  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"};
  for (int i = 0; i < 3; ++i) {
    fcl_cache_key k;
    char hex[65];
    fcl_sha256(inputs[i], strlen(inputs[i]), k.bytes);
    fcl_cache_key_hex(&k, hex);
    check(strcmp(hex, digests[i]) == 0, "sha256(\"%.8s...\") = %.16s...", inputs[i], hex);
  }
  /* A million 'a's crosses many blocks. */
  char *million = malloc(1000000);
  memset(million, 'a', 1000000);
  fcl_cache_key k;
  char hex[65];
  fcl_sha256(million, 1000000, k.bytes);
  fcl_cache_key_hex(&k, hex);
  check(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
        "sha256(10^6 x 'a') = %.16s...", hex);
  free(million);

  const char *src = "__kernel void f(__global float *x) { x[0] = 1.0f; }";
  const char *opt = "-cl-std=CL1.2 -DD=64";
  fcl_cache_key base, again, other;
  fcl_cache_key_compute(real, src, opt, &base);
  fcl_cache_key_compute(real, src, opt, &again);
  check(key_equal(&base, &again), "the key is a function of its inputs");
  fcl_cache_key_compute(real, "__kernel void f(__global float *x) { x[0] = 2.0f; }", opt, &other);
  check(!key_equal(&base, &other), "one changed character of source changes the key");
  fcl_cache_key_compute(real, src, "-cl-std=CL1.2 -DD=65", &other);
  check(!key_equal(&base, &other), "changed build options change the key");
  /* Moving text between source and options must not collide. */
  fcl_cache_key a, b;
  fcl_cache_key_compute(real, "xy", "z", &a);
  fcl_cache_key_compute(real, "x", "yz", &b);
  check(!key_equal(&a, &b), "fields are delimited: (\"xy\",\"z\") and (\"x\",\"yz\") differ");

  struct {
    const char *what;
    size_t offset, size;
  } fields[] = {
      {"platform name", offsetof(fcl_device_caps, platform_name), sizeof real->platform_name},
      {"platform version", offsetof(fcl_device_caps, platform_version), sizeof real->platform_version},
      {"device name", offsetof(fcl_device_caps, device_name), sizeof real->device_name},
      {"device version", offsetof(fcl_device_caps, device_version), sizeof real->device_version},
      {"driver version", offsetof(fcl_device_caps, driver_version), sizeof real->driver_version},
  };
  unsigned char tag0[FCL_CACHE_TAG_SIZE], tag1[FCL_CACHE_TAG_SIZE];
  fcl_cache_device_tag(real, tag0);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
    fcl_device_caps caps = *real;
    char *s = (char *)&caps + fields[i].offset;
    size_t n = strlen(s);
    if (n + 2 < fields[i].size) {
      s[n] = '2';
      s[n + 1] = '\0';
    } else {
      s[0] ^= 1;
    }
    fcl_cache_key_compute(&caps, src, opt, &other);
    fcl_cache_device_tag(&caps, tag1);
    check(!key_equal(&base, &other) && memcmp(tag0, tag1, sizeof tag0) != 0,
          "a different %s (\"%s\") changes the key and the device tag", fields[i].what, s);
  }
  /* What the plan depends on but the binary does not (e.g. local memory size) stays out of the key. */
  fcl_device_caps caps = *real;
  caps.local_mem_size /= 2;
  fcl_cache_key_compute(&caps, src, opt, &other);
  check(key_equal(&base, &other), "capabilities outside the device identity do not change the key");
}

/* ---- damaged entries ---- */

typedef enum { TRUNCATED, FLIPPED, BAD_MAGIC, EMPTY, OTHER_KEY, REFUSED, NUM_DAMAGE } damage;
static const char *damage_names[] = {"truncated file", "flipped payload bytes", "wrong magic", "zero-length file",
                                     "entry of another key", "binary the driver refuses (valid header)"};

/* After a damaged entry was replaced: one entry with this key's header, and it loads from disk. */
static void damage_after(test_env *env, const char *dir, const char *path, damage kind, const unsigned char *good) {
  phase q;
  int others;
  int bins = count_files(dir, &others, NULL);
  size_t size = 0;
  unsigned char *now = slurp(path, &size);
  /* The driver's binary may differ in size from one build to the next; the header must be this key's. */
  check(bins == 1 && others == 0 && now && size > FCL_CACHE_HEADER_SIZE && memcmp(now, good, 16) == 0 &&
            memcmp(now + 16, good + 16, FCL_CACHE_KEY_SIZE) == 0,
        "%s: one entry left, %zu bytes with this key's header", damage_names[kind], size);
  free(now);
  run_phase(env, dir, NULL, &base_case, "reload", &q);
  check(is_disk_hit(&q), "%s: the rewritten entry loads from disk (hits %llu, builds %llu)", damage_names[kind],
        (unsigned long long)q.st.disk_hits, (unsigned long long)q.st.source_builds);
}

static void test_damage(test_env *env, const char *base, damage kind, const unsigned char *good, size_t good_size,
                        const char *entry_name, const unsigned char *other, size_t other_size,
                        const unsigned char tag[FCL_CACHE_TAG_SIZE]) {
  char name[32];
  snprintf(name, sizeof name, "damage%d", (int)kind);
  char *dir = make_dir(base, name);
  char *path = path_join(dir, entry_name);
  unsigned char *data = malloc(good_size + 1);
  memcpy(data, good, good_size);
  int written = 0;
  switch (kind) {
    case TRUNCATED: written = spit(path, data, good_size / 2); break;
    case FLIPPED:
      for (size_t i = 0; i < 3; ++i) data[FCL_CACHE_HEADER_SIZE + (good_size - FCL_CACHE_HEADER_SIZE) * (i + 1) / 4] ^= 0x5a;
      written = spit(path, data, good_size);
      break;
    case BAD_MAGIC: data[0] ^= 0xff; written = spit(path, data, good_size); break;
    case EMPTY: written = spit(path, data, 0); break;
    case OTHER_KEY: written = spit(path, other, other_size); break;
    case REFUSED: {
      /* The header is right (key, size, checksum); the payload is random bytes. */
      fcl_cache_key key;
      memcpy(key.bytes, good + 16, FCL_CACHE_KEY_SIZE);
      unsigned char garbage[4096];
      for (size_t i = 0; i < sizeof garbage; ++i) garbage[i] = (unsigned char)(test_uniform() * 127.0 + 128.0);
      written = fcl_cache_write_entry(dir, &key, tag, "flash_fwd", (const char *)good + FCL_CACHE_HEADER_SIZE + 10, garbage, sizeof garbage);
      break;
    }
    default: break;
  }
  free(data);
  if (written != 0) {
    check(0, "%s: could not write the damaged entry", damage_names[kind]);
  } else if (kind == REFUSED) {
    /* In a child process: a driver may abort on a binary it cannot parse instead of returning
       CL_INVALID_BINARY (rusticl of Mesa 22.3 panics with "unknown version"). The library cannot catch that. */
    int rc = wait_status(spawn("--child-refused", dir, NULL));
    if (rc > 128) {
      skip("%s: the OpenCL driver killed the process (signal %d) in clCreateProgramWithBinary instead of "
           "returning CL_INVALID_BINARY; a driver fault, not the cache's", damage_names[kind], rc - 128);
    } else {
      check(rc == 0, "%s: rejected, built from source, correct, rewritten (child exit %d)", damage_names[kind], rc);
      damage_after(env, dir, path, kind, good);
    }
  } else {
    phase p;
    run_phase(env, dir, NULL, &base_case, damage_names[kind], &p);
    print_stats(damage_names[kind], &p);
    check(is_rebuilt(&p) && p.st.disk_rejected == 1,
          "%s: rejected (%llu), built from source (%llu), correct, rewritten (%llu)", damage_names[kind],
          (unsigned long long)p.st.disk_rejected, (unsigned long long)p.st.source_builds,
          (unsigned long long)p.st.disk_writes);
    damage_after(env, dir, path, kind, good);
  }
  free(path);
  free(dir);
}

/* ---- what a hostile writer of the cache directory can plant ---- */

/* Calls that would block forever on a FIFO end the test instead of hanging it. */
static void arm_alarm(unsigned seconds) {
  signal(SIGALRM, SIG_DFL);
  alarm(seconds);
}

/* A valid entry (right key, checksum and label) holding payload. */
static int plant_entry(const char *dir, const unsigned char *good, const unsigned char tag[FCL_CACHE_TAG_SIZE],
                       const char *name, const char *options, const void *payload, size_t size) {
  fcl_cache_key key;
  memcpy(key.bytes, good + 16, FCL_CACHE_KEY_SIZE);
  return fcl_cache_write_entry(dir, &key, tag, name, options, payload, size);
}

/* Bytes of the label (kernel name and build options) that follows an entry's fixed header. */
static size_t label_size(const unsigned char *entry) {
  return (size_t)entry[104] | (size_t)entry[105] << 8 | (size_t)entry[106] << 16 | (size_t)entry[107] << 24;
}

/* The binary of a program that has no flash_fwd kernel. */
static unsigned char *foreign_binary(test_env *env, size_t *size) {
  const char *src = "kernel void not_flash_fwd(global float *x) { x[get_global_id(0)] = 1.0f; }";
  cl_int err;
  cl_program p = clCreateProgramWithSource(env->context, 1, &src, NULL, &err);
  unsigned char *bin = NULL;
  *size = 0;
  if (err == CL_SUCCESS && clBuildProgram(p, 1, &env->device, "", NULL, NULL) == CL_SUCCESS &&
      clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof *size, size, NULL) == CL_SUCCESS && *size &&
      (bin = malloc(*size)) && clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
    free(bin);
    bin = NULL;
  }
  if (err == CL_SUCCESS) clReleaseProgram(p);
  return bin;
}

static void test_trust(test_env *env, const char *base, const char *entry_name, const unsigned char *good,
                       size_t good_size, const unsigned char *other, size_t other_size,
                       const unsigned char tag[FCL_CACHE_TAG_SIZE], const char *good_options) {
  int others;
  phase p;
  /* A FIFO where the entry belongs: neither the load nor the stats may block on it. */
  {
    char *dir = make_dir(base, "fifo");
    char *path = path_join(dir, entry_name);
    fcl_context_options o = {dir, NULL, 0};
    fcl_context *ctx = NULL;
    fcl_cache_stats st;
    /* The entries a context leaves there by itself (its device's loop-budget record), before the FIFO. */
    uint64_t before = UINT64_MAX;
    if (fcl_context_create(env->context, env->device, &o, &ctx) == FCL_SUCCESS &&
        fcl_context_cache_stats(ctx, &st) == FCL_SUCCESS)
      before = st.device_entries;
    fcl_context_release(ctx);
    ctx = NULL;
    int made = mkfifo(path, 0600) == 0;
    arm_alarm(120);
    int stats_ok = made && fcl_context_create(env->context, env->device, &o, &ctx) == FCL_SUCCESS &&
                   fcl_context_cache_stats(ctx, &st) == FCL_SUCCESS && st.device_entries == before;
    fcl_context_release(ctx);
    check(stats_ok, "a FIFO named as an entry: fcl_context_cache_stats returns and does not count it");
    run_phase(env, dir, NULL, &base_case, "FIFO in place of the entry", &p);
    alarm(0);
    struct stat sb;
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode),
          "a FIFO in place of the entry: not opened for reading, rejected, rebuilt and replaced by a regular file");
    free(path);
    free(dir);
  }
  /* A symbolic link as the entry is not followed. */
  {
    char *dir = make_dir(base, "symlink");
    char *target = path_join(dir, "target"), *path = path_join(dir, entry_name);
    int made = spit(target, good, good_size) == 0 && symlink(target, path) == 0;
    run_phase(env, dir, NULL, &base_case, "symbolic link as the entry", &p);
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1, "a symbolic link as the entry: not followed, rebuilt");
    free(path);
    free(target);
    free(dir);
  }
  /* A 512 MiB sparse entry is refused by its size, before a byte is read. */
  {
    char *dir = make_dir(base, "huge");
    char *path = path_join(dir, entry_name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int made = fd >= 0 && ftruncate(fd, (off_t)512 << 20) == 0;
    if (fd >= 0) close(fd);
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    run_phase(env, dir, NULL, &base_case, "512 MiB entry", &p);
    getrusage(RUSAGE_SELF, &after);
    const long grown_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1 && grown_mib < 256,
          "a 512 MiB sparse entry: rejected without reading it (peak memory grew %ld MiB)", grown_mib);
    free(path);
    free(dir);
  }
  /* Another variant's entry filed under this key (header key rewritten, its own checksum still valid). */
  {
    char *dir = make_dir(base, "planted_variant");
    char *path = path_join(dir, entry_name);
    unsigned char *data = malloc(other_size);
    memcpy(data, other, other_size);
    memcpy(data + 16, good + 16, FCL_CACHE_KEY_SIZE);
    int made = spit(path, data, other_size) == 0;
    free(data);
    run_phase(env, dir, NULL, &base_case, "another variant's entry under this key", &p);
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1,
          "another variant's entry under this key: its build options differ, rejected, rebuilt, correct");
    free(path);
    free(dir);
  }
  /* A well-formed entry whose program lacks the kernel: a miss, rebuilt and overwritten, never a failure. */
  {
    char *dir = make_dir(base, "planted_kernel");
    size_t size = 0;
    unsigned char *bin = foreign_binary(env, &size);
    int made = bin && plant_entry(dir, good, tag, "flash_fwd", good_options, bin, size) == 0;
    free(bin);
    run_phase(env, dir, NULL, &base_case, "a program without the kernel", &p);
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1,
          "a valid entry whose program lacks flash_fwd: rejected after loading, rebuilt, correct");
    phase q;
    run_phase(env, dir, NULL, &base_case, "reload", &q);
    check(is_disk_hit(&q), "the overwritten entry then loads from disk");
    free(dir);
  }
  /* The label: an entry naming another kernel or other build options is refused. */
  {
    char *dir = make_dir(base, "label");
    const unsigned char *payload = good + FCL_CACHE_HEADER_SIZE + label_size(good);
    size_t size = good_size - (size_t)(payload - good);
    int made = plant_entry(dir, good, tag, "flash_bwd_dq", good_options, payload, size) == 0;
    run_phase(env, dir, NULL, &base_case, "label names another kernel", &p);
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1, "an entry labelled with another kernel name: rejected");
    made = plant_entry(dir, good, tag, "flash_fwd", "-cl-std=CL1.2 -DD=128", payload, size) == 0;
    run_phase(env, dir, NULL, &base_case, "label names other options", &p);
    check(made && is_rebuilt(&p) && p.st.disk_rejected == 1, "an entry labelled with other build options: rejected");
    free(dir);
  }
  /* A directory others may write is not trusted: no disk cache, and the stats say why. */
  {
    char *dir = make_dir(base, "world_writable");
    chmod(dir, 0777);
    run_phase(env, dir, NULL, &base_case, "world-writable directory", &p);
    const int bins = count_files(dir, &others, NULL);
    check(p.result == 0 && p.st.disk_writes == 0 && p.st.disk_hits == 0 && bins == 0 && strstr(p.refused, "writable"),
          "a directory writable by others: run without the disk cache, nothing written, the stats say why (\"%s\")",
          p.refused);
    chmod(dir, 0700);
    free(dir);
  }
  /* A directory the library creates is private to the user. */
  {
    char *parent = make_dir(base, "fresh");
    char *dir = path_join(parent, "a/b");
    run_phase(env, dir, NULL, &base_case, "new directory", &p);
    struct stat sb;
    memset(&sb, 0, sizeof sb); /* printed even when a check before the stat fails */
    check(p.result == 0 && p.st.disk_writes == 1 && stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700,
          "a new cache directory is created with mode 0700 (%o)", (unsigned)(sb.st_mode & 0777));
    free(dir);
    free(parent);
  }
}

/* ---- threads of one process, each with its own context, populating one key at once ---- */

typedef struct writer {
  test_env env; /* a copy of the shared one with its own fcl_context and queue */
  const char *dir;
  int result;
  fcl_cache_stats st;
} writer;

static void *writer_run(void *arg) {
  writer *w = arg;
  w->result = run_forward_case(&w->env, w->env.queue, &base_case, fcl_attention_forward, "thread");
  fcl_context_cache_stats(w->env.fcl, &w->st);
  return NULL;
}

static void test_threads(test_env *env, const char *base) {
  char *dir = make_dir(base, "threads");
  writer w[4];
  pthread_t t[4];
  int ready = 1;
  for (int i = 0; i < 4; ++i) {
    w[i].env = *env;
    w[i].dir = dir;
    w[i].result = 1;
    fcl_context_options o = {dir, NULL, 0};
    cl_int err;
    w[i].env.queue = clCreateCommandQueue(env->context, env->device, 0, &err);
    ready &= err == CL_SUCCESS && fcl_context_create(env->context, env->device, &o, &w[i].env.fcl) == FCL_SUCCESS;
  }
  if (!ready) {
    check(0, "threads: could not create four contexts and queues");
    return;
  }
  for (int i = 0; i < 4; ++i) pthread_create(&t[i], NULL, writer_run, &w[i]);
  int all = 1;
  unsigned long long builds = 0, hits = 0, writes = 0;
  for (int i = 0; i < 4; ++i) {
    pthread_join(t[i], NULL);
    all &= w[i].result == 0;
    builds += w[i].st.source_builds, hits += w[i].st.disk_hits, writes += w[i].st.disk_writes;
    fcl_context_release(w[i].env.fcl);
    clReleaseCommandQueue(w[i].env.queue);
  }
  int others;
  int n = count_files(dir, &others, NULL);
  check(all && builds + hits == 4 && writes == builds && n == 1 && others == 0,
        "four threads, four contexts, one key: all correct (%llu built, %llu loaded), one entry, no temporary files",
        builds, hits);
  free(dir);
}

int main(int argc, char **argv) {
  self_path = argv[0];
  if (argc >= 2 && strncmp(argv[1], "--child-", 8) == 0) return child_main(argc, argv);

  /* PoCL keeps its own compiled-kernel cache; turned off here so that a "source build" compiles. */
  setenv("POCL_KERNEL_CACHE", "0", 1);
  unsetenv("FLASHCL_KERNEL_DIR");
  /* One program per forward: on a device with many compute units the planner would split this small problem's
     keys (a split kernel and the combine), and the counts below are of the one kernel's entries. */
  setenv("FLASHCL_FORWARD_SPLITS", "1", 1);
  test_seed();
  /* $FLASHCL_CACHE_TEST_DIR moves the scratch space (e.g. somewhere an unprivileged user may write). */
  const char *scratch = getenv("FLASHCL_CACHE_TEST_DIR");
  if (!scratch || !*scratch) scratch = FLASHCL_CACHE_TEST_DIR;
  mkdir(scratch, 0755);
  char base[4096];
  snprintf(base, sizeof base, "%s/run.%ld", scratch, (long)getpid());
  remove_tree(base);
  if (mkdir(base, 0755) != 0) {
    fprintf(stderr, "cannot create %s\n", base);
    return 1;
  }

  test_env env;
  fcl_context_options none = {"", NULL, 0};
  if (test_open(&env, &none)) return 1;
  test_keys(&env.fcl->caps);
  char *record = fcl_loop_budget_file_path(&env.fcl->caps, ".");
  snprintf(budget_record, sizeof budget_record, "%s", record ? record + 2 : "");
  free(record);

  /* ---- first context builds and writes; the second loads from disk ---- */
  char *d1 = make_dir(base, "main");
  phase a, b;
  run_phase(&env, d1, NULL, &base_case, "first context", &a);
  print_stats("first context", &a);
  int others;
  char *entry = NULL;
  int bins = count_files(d1, &others, &entry);
  check(is_rebuilt(&a) && a.st.source_builds == 1 && a.st.disk_rejected == 0 && a.st.last == FCL_CACHE_SOURCE,
        "first context: built from source and wrote the entry");
  check(bins == 1 && others == 0 && entry, "one entry in the cache directory, no temporary files (%d, %d)", bins,
        others);
  if (!entry) {
    test_close(&env);
    return test_summary("test_cache");
  }
  run_phase(&env, d1, NULL, &base_case, "second context", &b);
  print_stats("second context", &b);
  check(is_disk_hit(&b) && b.st.disk_hits == 1 && b.st.last == FCL_CACHE_DISK,
        "second context: loaded from disk, no compile");
  check(b.seconds < a.seconds, "second context is faster to its first result: %.3f s from disk vs %.3f s from source",
        b.seconds, a.seconds);
  {
    /* The loop budget record is this device's too, unless FLASHCL_LOOP_BUDGET forced the budget. */
    char *rec = path_join(d1, budget_record);
    struct stat rs;
    const unsigned long long expected = 1 + (stat(rec, &rs) == 0);
    free(rec);
    check(b.st.device_entries == expected && b.st.device_bytes > FCL_CACHE_HEADER_SIZE,
          "stats count the entry and the loop budget record as this device's (%llu entries of %llu, %llu bytes)",
          (unsigned long long)b.st.device_entries, expected, (unsigned long long)b.st.device_bytes);
  }

  /* A second request in the same context is a memory hit. */
  {
    fcl_context_options o = {d1, NULL, 0};
    fcl_context *ctx;
    fcl_plan_info info;
    fcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1, desc.num_heads = 2, desc.seqlen_q = 67, desc.seqlen_k = 45, desc.head_dim = 64;
    fcl_cache_stats st;
    int ok = fcl_context_create(env.context, env.device, &o, &ctx) == FCL_SUCCESS &&
             fcl_describe_plan(ctx, FCL_OP_FORWARD, &desc, &info) == FCL_SUCCESS &&
             fcl_describe_plan(ctx, FCL_OP_FORWARD, &desc, &info) == FCL_SUCCESS &&
             fcl_context_cache_stats(ctx, &st) == FCL_SUCCESS;
    check(ok && st.disk_hits == 1 && st.memory_hits >= 1 && st.source_builds == 0 && st.last == FCL_CACHE_MEMORY &&
              st.cache_dir && strcmp(st.cache_dir, d1) == 0,
          "same context again: memory hit (memory %llu, disk %llu), cache_dir reported", ok ? (unsigned long long)st.memory_hits : 0ULL,
          ok ? (unsigned long long)st.disk_hits : 0ULL);
    if (ok) fcl_context_release(ctx);
    check(fcl_context_cache_stats(NULL, &st) == FCL_ERROR_INVALID_ARGUMENT, "cache stats of NULL: invalid argument");
  }

  /* ---- a second process ---- */
  int rc = wait_status(spawn("--child-load", d1, NULL));
  check(rc == 0, "second process: loaded from disk without compiling, correct result (exit %d)", rc);

  /* ---- damaged entries ---- */
  size_t good_size = 0, other_size = 0;
  unsigned char *good = slurp(entry, &good_size);
  const char *entry_name = strrchr(entry, '/') + 1;
  char *d_other = make_dir(base, "other");
  fwd_case other_case = base_case;
  other_case.d = 32;
  phase o;
  run_phase(&env, d_other, NULL, &other_case, "another kernel", &o);
  char *other_entry = NULL;
  count_files(d_other, &others, &other_entry);
  unsigned char *other = other_entry ? slurp(other_entry, &other_size) : NULL;
  unsigned char tag[FCL_CACHE_TAG_SIZE];
  fcl_cache_device_tag(&env.fcl->caps, tag);
  if (!good || !other || strcmp(strrchr(other_entry, '/'), strrchr(entry, '/')) == 0) {
    check(0, "could not prepare the damaged-entry cases");
  } else {
    for (int k = 0; k < NUM_DAMAGE; ++k)
      test_damage(&env, base, (damage)k, good, good_size, entry_name, other, other_size, tag);
  }

  /* The label of the good entry: "flash_fwd\0<its build options>\0". */
  if (good && other && good_size > FCL_CACHE_HEADER_SIZE + label_size(good) && label_size(good) > 10)
    test_trust(&env, base, entry_name, good, good_size, other, other_size, tag,
               (const char *)good + FCL_CACHE_HEADER_SIZE + strlen("flash_fwd") + 1);

  /* ---- an unwritable directory ---- */
  {
    char *file = path_join(base, "plain_file");
    spit(file, "x", 1);
    char *under_file = path_join(file, "cache");
    phase p;
    run_phase(&env, under_file, NULL, &base_case, "cache dir under a regular file", &p);
    check(p.result == 0 && p.st.source_builds == 1 && p.st.disk_writes == 0 && p.st.disk_write_failures == 1,
          "cache directory that cannot be created: runs, builds from source, write failure counted (%llu)",
          (unsigned long long)p.st.disk_write_failures);
    free(under_file);
    free(file);
    char *ro = make_dir(base, "readonly");
    chmod(ro, 0555);
    char *probe = path_join(ro, "probe");
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(probe);
      skip("read-only directory (chmod 0555): running as uid %ld, where file permissions do not stop writes; "
           "the unwritable case above covers it",
           (long)geteuid());
    } else {
      run_phase(&env, ro, NULL, &base_case, "read-only directory", &p);
      int bins_ro = count_files(ro, &others, NULL);
      check(p.result == 0 && p.st.source_builds == 1 && p.st.disk_writes == 0 && bins_ro == 0 && others == 0,
            "read-only directory: runs, nothing written");
    }
    free(probe);
    chmod(ro, 0755);
    free(ro);
  }

  test_threads(&env, base);

  /* ---- temporary files of a writer that died: removed once an hour old, left alone before ---- */
  {
    char *dt = make_dir(base, "stale");
    char *old_tmp = path_join(dt, ".tmp.99999.1.0"), *new_tmp = path_join(dt, ".tmp.99999.1.1");
    spit(old_tmp, "partial", 7);
    spit(new_tmp, "partial", 7);
    struct timespec times[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    int aged = utimensat(AT_FDCWD, old_tmp, times, 0) == 0;
    phase p;
    run_phase(&env, dt, NULL, &base_case, "with temporary files present", &p);
    struct stat st;
    check(aged && p.result == 0 && p.st.disk_writes == 1 && stat(old_tmp, &st) != 0 && stat(new_tmp, &st) == 0,
          "a store removes a two-hour-old temporary file and keeps a fresh one (a live writer's)");
    free(old_tmp);
    free(new_tmp);
    free(dt);
  }

  /* ---- four processes populate one key at once ---- */
  {
    char *dc = make_dir(base, "concurrent");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char start[32];
    snprintf(start, sizeof start, "%lld", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec + 2500000000LL);
    pid_t pids[4];
    for (int i = 0; i < 4; ++i) pids[i] = spawn("--child-populate", dc, start);
    int all = 1;
    for (int i = 0; i < 4; ++i) {
      int r = wait_status(pids[i]);
      all &= r == 0;
      if (r != 0) printf("     process %d exited with %d\n", i, r);
    }
    check(all, "four processes populating one key at once all succeed");
    char *e = NULL;
    int n = count_files(dc, &others, &e);
    check(n == 1 && others == 0, "they leave exactly one entry and no temporary files (%d entries, %d others)", n,
          others);
    phase p;
    run_phase(&env, dc, NULL, &base_case, "after concurrent writers", &p);
    check(is_disk_hit(&p), "the entry they left loads from disk");
    free(e);
    free(dc);
  }

  /* ---- the key follows the source text and the build options ---- */
  {
    char *same = path_join(base, "cl_same"), *changed = path_join(base, "cl_changed");
    int copied = copy_tree(FLASHCL_CL_DIR, same) == 0 && copy_tree(FLASHCL_CL_DIR, changed) == 0;
    /* common.cl: every kernel's program holds it, whichever forward the device takes (NVIDIA's f32 is the
       tensor-core kernel's, which does not read flash_fwd.cl). */
    char *common = path_join(changed, "common.cl");
    FILE *f = copied ? fopen(common, "ab") : NULL;
    if (f) {
      fputs("\n/* a comment that changes nothing but the text */\n", f);
      fclose(f);
    }
    check(copied && f, "copied cl/ twice, one with an added comment");
    phase p;
    setenv("FLASHCL_KERNEL_DIR", same, 1);
    run_phase(&env, d1, NULL, &base_case, "FLASHCL_KERNEL_DIR, same text", &p);
    check(is_disk_hit(&p), "the same source text read from FLASHCL_KERNEL_DIR: the same key, a disk hit");
    setenv("FLASHCL_KERNEL_DIR", changed, 1);
    run_phase(&env, d1, NULL, &base_case, "FLASHCL_KERNEL_DIR, comment added", &p);
    check(is_rebuilt(&p) && p.st.disk_rejected == 0, "an added comment: another key, built from source");
    unsetenv("FLASHCL_KERNEL_DIR");
    check(count_files(d1, &others, NULL) == 2 && others == 0, "two entries now");
    run_phase(&env, d1, "-DFLASHCL_CACHE_TEST_OPTION=1", &base_case, "extra build option", &p);
    check(is_rebuilt(&p) && p.st.disk_rejected == 0, "an extra build option: another key, built from source");
    check(count_files(d1, &others, NULL) == 3 && others == 0, "three entries now");
    run_phase(&env, d1, "-DFLASHCL_CACHE_TEST_OPTION=1", &base_case, "extra build option again", &p);
    check(is_disk_hit(&p), "the same option again: a disk hit");
    free(common);
    free(same);
    free(changed);
  }

  free(good);
  free(other);
  free(other_entry);
  free(d_other);
  free(entry);
  free(d1);
  test_close(&env);
  if (test_failed == 0) remove_tree(base);
  return test_summary("test_cache");
}
