#!/bin/bash
# The measurements waiting for the GPU, in the order docs/notes-nvidia.md's "What remains" gives them, in one call of
# at most LIMIT seconds (default 560): each step starts only while enough of them is left, and the tables come back
# under $OUT even when the call is cut short. Edit the steps as measurements land; the figures go to the notes.
# usage (repository root, after `bash .gpu/setup.sh`): LIMIT=S bash bench/nv_dev/queue.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$(pwd)
out=${OUT:-/tmp/nv_queue}; mkdir -p "$out"
D=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -oE 'H[12]00' | head -1)
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-$D}
t0=$(date +%s) L=${LIMIT:-560}
el() { echo $(($(date +%s) - t0)); }
left() { echo $((L - $(el))); }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee "$out/device.txt"
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build build-gpu -j 16; } \
  >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "built, $(el) s"
bench=build-gpu/tools/flashcl-bench

# A copy of cl/ with the named patches applied, at /tmp/queue-cl/NAME/cl.
patched() {
  local name=$1 dir=/tmp/queue-cl/$1; shift
  rm -rf "$dir" && mkdir -p "$dir" && cp -r cl "$dir/" || return 1
  for p in "$@"; do (cd "$dir" && python3 "$root/bench/nv_dev/apply_patch.py" "$root/$p") || return 1; done
}

# 1. NVIDIA's registers, stack frames and spills of the backward's default shapes, the tree's kernels (never seen:
#    v41's run built without -DFCL_PTX=1, which nvbuild.c now adds).
OUT=$out/verbose-tree BUDGET=$(($(left) - 10)) bash bench/nv_dev/ab.sh cl verbose 2>&1 | tail -40
echo "== verbose (the tree), $(el) s"
