/* How fast can work-groups stream device memory into local memory on this GPU, by each copy mechanism
 * (docs/notes-nvidia.md, v23)? Every work-group reads its own contiguous range through a ring of STAGES tiles
 * of 16 KiB (a decode tile: 64 keys of 256 bytes), as the tensor-core kernels do:
 *   cp.async   16 bytes a work-item a copy, cp.async groups and a barrier a tile (the library's kernels);
 *   bulk-row   Hopper's cp.async.bulk, one copy a 256-byte row, completing on an mbarrier a buffer;
 *   bulk-tile  one cp.async.bulk of the whole 16 KiB tile by one work-item.
 * Each tile's words are summed (one a work-item) and checked against the host, so no copy can be skipped.
 * Median of 10 after 2 warm-ups, from OpenCL events. Not part of the library.
 * Build (GPU machine, repository root):  gcc -O2 -Iinclude bench/nv_dev/stream_read.c -lOpenCL -o stream_read
 * Run:  ./stream_read [MiB [work-groups...]]   (default 2048 MiB; 512 and 792 work-groups) */
#include <stdint.h>
#include <string.h>

#include "dev_util.h"

static const char *src =
    "#define SMEM_ADDR(p) ((uint)(size_t)(p))\n"
    "#define TILE 16384\n"
    "#define ROW 256\n"
    "__kernel void fill(__global uint *x) { const size_t i = get_global_id(0); x[i] = (uint)i * 2654435761u; }\n"
    "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))\n"
    "void stream(__global const uchar *src, __global uint *out, int tiles) {\n"
    "  __local uint4 ring[STAGES][TILE / 16];\n"
    "  __local ulong bar[STAGES];\n"
    "  const int lid = get_local_id(0);\n"
    "  __global const uchar *base = src + (size_t)get_group_id(0) * tiles * TILE;\n"
    "#if MODE != 0\n"
    "  if (lid < STAGES) asm volatile(\"mbarrier.init.shared.b64 [%0], 1;\\n\" ::\"r\"(SMEM_ADDR(&bar[lid])) : \"memory\");\n"
    "  asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "#endif\n"
    "#if MODE == 0\n"
    "#define LOAD(n) do { if ((n) < tiles) for (int i = lid; i < TILE / 16; i += WG) \\\n"
    "    asm volatile(\"cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\\n\" ::\"r\"(SMEM_ADDR(&ring[(n) % STAGES][i])), \\\n"
    "                 \"l\"((ulong)(base + (size_t)(n) * TILE + i * 16)) : \"memory\"); \\\n"
    "  asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\"); } while (0)\n"
    "#define STR_(x) #x\n"
    "#define STR(x) STR_(x)\n"
    "#define WAIT(n) asm volatile(\"cp.async.wait_group \" STR(PENDING) \";\\n\" ::: \"memory\")\n"
    "#else\n"
    "#if MODE == 1\n"
    "#define COPIES (TILE / ROW)\n"
    "#else\n"
    "#define COPIES 1\n"
    "#endif\n"
    "#define LOAD(n) do { if ((n) < tiles) { const uint b_ = SMEM_ADDR(&bar[(n) % STAGES]); \\\n"
    "    if (lid == 0) asm volatile(\"mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\\n\" ::\"r\"(b_), \"r\"(TILE) : \"memory\"); \\\n"
    "    for (int r = lid; r < COPIES; r += WG) \\\n"
    "      asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\\n\" \\\n"
    "                   ::\"r\"(SMEM_ADDR(&ring[(n) % STAGES][r * (TILE / COPIES / 16)])), \\\n"
    "                   \"l\"((ulong)(base + (size_t)(n) * TILE + r * (TILE / COPIES))), \"r\"(TILE / COPIES), \"r\"(b_) : \"memory\"); } } while (0)\n"
    "#define WAIT(n) asm volatile(\"{\\n .reg .pred p;\\n W:\\n mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\\n @!p bra W;\\n}\\n\" \\\n"
    "                             ::\"r\"(SMEM_ADDR(&bar[(n) % STAGES])), \"r\"(((n) / STAGES) & 1) : \"memory\")\n"
    "#endif\n"
    "  for (int n = 0; n < STAGES - 1; ++n) LOAD(n);\n"
    "  uint sum = 0;\n"
    "  for (int j = 0; j < tiles; ++j) {\n"
    "    WAIT(j);\n"
    "    barrier(CLK_LOCAL_MEM_FENCE); /* every work-item is done with tile j - 1, whose buffer is refilled */\n"
    "    LOAD(j + STAGES - 1);\n"
    "    for (int i = lid; i < TILE / 16; i += WG) sum += ring[j % STAGES][i].x;\n"
    "  }\n"
    "  out[get_global_id(0)] = sum;\n"
    "}\n";

int main(int argc, char **argv) {
  const size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 2048, bytes = mib << 20, tile = 16384;
  int groups_list[8] = {512, 792}, ng = 2;
  if (argc > 2) {
    ng = 0;
    for (int i = 2; i < argc && ng < 8; ++i) groups_list[ng++] = atoi(argv[i]);
  }
  cl_device_id dev = dev_first_gpu();
  if (!dev) return fprintf(stderr, "no OpenCL GPU\n"), 1;
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CK(err);
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  CK(err);
  cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)1024 * 128 * 4, NULL, &err);
  CK(err);
  static const char *modes[3] = {"cp.async", "bulk-row", "bulk-tile"};
  printf("%zu MiB, 16 KiB tiles: median us (TB/s)\n", mib);
  int fills = 0;
  for (int mode = 0; mode < 3; ++mode)
    for (int wg = 32; wg <= 128; wg *= 4)
      for (int stages = 2; stages <= 3; ++stages) {
        if (mode && stages == 3) continue; /* three tiles and the mbarriers pass 48 KiB */
        char opt[128];
        snprintf(opt, sizeof opt, "-DMODE=%d -DWG=%d -DSTAGES=%d -DPENDING=%d", mode, wg, stages, stages - 2);
        cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
        if (clBuildProgram(p, 1, &dev, opt, NULL, NULL) != CL_SUCCESS) {
          printf("%s: build failed\n%s\n", opt, dev_build_log(p, dev));
          continue;
        }
        if (!fills++) {
          cl_kernel f = clCreateKernel(p, "fill", &err);
          CK(clSetKernelArg(f, 0, sizeof buf, &buf));
          const size_t n = bytes / 4;
          CK(clEnqueueNDRangeKernel(q, f, 1, NULL, &n, NULL, 0, NULL, NULL));
          clReleaseKernel(f);
        }
        cl_kernel k = clCreateKernel(p, "stream", &err);
        CK(err);
        for (int gi = 0; gi < ng; ++gi) {
          const int groups = groups_list[gi], tiles = (int)(bytes / tile / (size_t)groups);
          const size_t global = (size_t)groups * wg, local = (size_t)wg;
          if (global > 1024 * 128) continue;
          CK(clSetKernelArg(k, 0, sizeof buf, &buf));
          CK(clSetKernelArg(k, 1, sizeof out, &out));
          CK(clSetKernelArg(k, 2, sizeof tiles, &tiles));
          double t[10];
          for (int it = -2; it < 10; ++it) {
            cl_event e;
            CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, &e));
            CK(clWaitForEvents(1, &e));
            if (it >= 0) t[it] = 1000.0 * dev_event_ms(e);
            clReleaseEvent(e);
          }
          qsort(t, 10, sizeof t[0], dev_cmp_double);
          /* Check: work-item l of group g sums word 0 of every 16-byte chunk l, l + WG, ... of its tiles. */
          uint32_t *got = malloc(global * 4);
          CK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, global * 4, got, 0, NULL, NULL));
          size_t bad = 0;
          for (size_t w = 0; w < global; ++w) {
            const size_t g = w / wg, l = w % wg;
            uint32_t s = 0;
            for (int j = 0; j < tiles; ++j)
              for (size_t c = l; c < tile / 16; c += wg) {
                const size_t word = ((g * tiles + j) * tile + c * 16) / 4;
                s += (uint32_t)word * 2654435761u;
              }
            bad += s != got[w];
          }
          free(got);
          const double med = (t[4] + t[5]) / 2, read = (double)groups * tiles * tile;
          printf("%-9s WG %3d stages %d groups %4d: %9.1f us (%.2f TB/s)%s\n", modes[mode], wg, stages, groups, med,
                 read / med / 1e6, bad ? " WRONG SUMS" : "");
        }
        clReleaseKernel(k);
        clReleaseProgram(p);
      }
  return 0;
}
