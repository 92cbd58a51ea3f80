#!/bin/bash
# Compile check of an NVIDIA kernel without a GPU: common.cl, nvidia/ptx.cl and the kernel file concatenated as src/program.c
# does (each after a #line directive), compiled to PTX by clang 15 (-target nvptx64-nvidia-nvidiacl, libclc and
# libdevice linked, PTX for sm_80 (the newest target clang 15 knows), exp2f/log2f mapped onto libdevice) and assembled by ptxas -arch=sm_90 -v, which prints
# registers and spill bytes. Those figures come from clang's code generator, not NVIDIA's OpenCL compiler: a
# hint only (bench/nv_dev/nvbuild.c with -cl-nv-verbose on the GPU gives the real ones).
# usage: bash bench/nv_dev/ptx_check.sh KERNEL_FILE "DEFINES" [OUT_PREFIX]   (KERNEL_FILE as cl/..., or any path)
#   e.g. bash bench/nv_dev/ptx_check.sh cl/nvidia/flash_bwd_mma.cl "-DMMA_KIND=1 -DDTYPE=1 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=32"
# PTX that uses Hopper's instructions is declared PTX 8.0 for sm_90 before ptxas reads it. DEFINES follow the
# options every tensor-core program gets from the library (-cl-std=CL1.2 -DFCL_PTX=1), as nvbuild.c's do.
# Prints one line: "ok REGS SPILL_STORES SPILL_LOADS STACK SMEM DEFINES" or "FAIL (stage) DEFINES" and the errors.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
file=$1 defs=$2 pre=${3:-/tmp/ptx_check.$$}
# KERNEL_FILE relative to the repository root (common.cl and ptx.cl are always the repository's) or any path.
src=$file; [ -f "$src" ] || src=$root/$file
[ -f "$src" ] || { echo "FAIL (no such file: $file) $defs"; exit 1; }
libdevice=${LIBDEVICE:-$(ls /usr/local/cuda/nvvm/libdevice/libdevice*.bc 2>/dev/null | head -1)}
clc=${LIBCLC:-/usr/lib/clc/nvptx64--nvidiacl.bc}
{
  printf 'float __nv_exp2f(float);\nfloat __nv_log2f(float);\nfloat exp2f(float x) { return __nv_exp2f(x); }\nfloat log2f(float x) { return __nv_log2f(x); }\n'
  printf '#line 1 "common.cl"\n'; cat "$root/cl/common.cl"
  printf '\n#line 1 "nvidia/ptx.cl"\n'; cat "$root/cl/nvidia/ptx.cl"
  printf '\n#line 1 "%s"\n' "${file#cl/}"; cat "$src"; printf '\n'
} >"$pre.cl"
# shellcheck disable=SC2086
if ! clang-15 -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvidiacl -Xclang -target-cpu -Xclang sm_80 -O2 -fgnu89-inline -Xclang -finclude-default-header \
    -Xclang -mlink-builtin-bitcode -Xclang "$clc" ${libdevice:+-Xclang -mlink-builtin-bitcode -Xclang "$libdevice"} \
    -Dasm=__asm__ -DFCL_PTX=1 $defs -S -o "$pre.ptx" "$pre.cl" 2>"$pre.clang.log"; then
  echo "FAIL (clang) $defs"; grep -E "error" "$pre.clang.log" | head -10; exit 1
fi
# Hopper's instructions (mbarrier waits on a parity) need PTX 8.0 for sm_90, which clang 15 does not write.
grep -q "mbarrier" "$pre.ptx" && sed -i 's/^\.version .*/.version 8.0/; s/^\.target sm_80/.target sm_90/' "$pre.ptx"
# ptxas alone refuses static shared memory beyond 48 KiB ("uses too much shared data", 0xc000 max), which NVIDIA's
# OpenCL compiler accepts up to the multiprocessor's per-block maximum (docs/notes-nvidia.md v37): for such a tile
# the figures below are still reported.
if ! ptxas -arch=sm_90 -v "$pre.ptx" -o "$pre.o" 2>"$pre.ptxas.log" &&
   ! { grep -q "too much shared data" "$pre.ptxas.log" && [ "$(grep -c "error" "$pre.ptxas.log")" = 1 ]; }; then
  echo "FAIL (ptxas) $defs"; head -10 "$pre.ptxas.log"; exit 1
fi
regs=$(grep -oE 'Used [0-9]+ registers' "$pre.ptxas.log" | grep -oE '[0-9]+' | head -1)
spill=$(grep -oE '[0-9]+ bytes spill stores, [0-9]+ bytes spill loads' "$pre.ptxas.log" | head -1 | grep -oE '[0-9]+' | tr '\n' ' ')
# The kernel's stack frame: arrays clang left in local memory (e.g. passed to a function it did not inline), which
# spill bytes do not count.
stack=$(grep -oE '[0-9]+ bytes stack frame' "$pre.ptxas.log" | head -1 | grep -oE '[0-9]+')
[ -n "$regs" ] || { echo "FAIL (no kernel in ptxas's report) $defs"; exit 1; }
smem=$(grep -oE '[0-9]+ bytes smem' "$pre.ptxas.log" | grep -oE '[0-9]+' | head -1)
warn=$(grep -E "warning:" "$pre.clang.log" | grep -vc "Linking two modules")
echo "ok regs=$regs spill(st ld)=${spill% } stack=${stack:-0} smem=${smem:-0} clang_warnings=$warn $defs"
