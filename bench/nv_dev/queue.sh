#!/bin/bash
# The measurements waiting for the GPU, in the order docs/notes-nvidia.md's "What remains" gives them, in one call of
# at most LIMIT seconds (default 560): each step starts only while enough of them is left, and the tables come back
# under $OUT even when the call is cut short. Edit the steps as measurements land; the figures go to the notes.
# usage (repository root, after `bash .gpu/setup.sh`): LIMIT=S bash bench/nv_dev/queue.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/nv_queue}; mkdir -p "$out"
D=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -oE 'H[12]00' | head -1)
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-$D}
t0=$(date +%s) L=${LIMIT:-560}
el() { echo $(($(date +%s) - t0)); }
left() { echo $((L - $(el))); }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee "$out/device.txt"
# (Step 1 builds the tree and the patched tree through ab.sh.)

# 1. FlashAttention-2's warp tiles in the dK/dV kernel (bench/nv_dev/patches/bwd-warp-tiles.patch, notes v42):
#    timed against the tree's defaults (rows with FLASHCL_BACKWARD_SHAPE=4,64,4,64,2, which only the patched tree
#    takes), then the backward suites on the warp tiles and on the defaults, then NVIDIA's register figures of
#    both. Predicted 4-6% less time at head_dim 128, N = 4096.
ROWS=bench/nv_dev/ab_rows_warp2d.txt TESTS="variant backward@4,64,4,64,2 sequences_backward@4,64,4,64,2 backward" \
  VERBOSE_SHAPE="-DD=128 -DDP=128 -DDS=136 -DNW=4 -DBN=64 -DKV_RESIDENT=1 -DWARP2D=1" \
  OUT=$out/warp2d BUDGET=$(($(left) - 10)) bash bench/nv_dev/ab.sh bench/nv_dev/patches/bwd-warp-tiles.patch bench tests verbose 2>&1 |
  tail -40
echo "== warp tiles, $(el) s"
