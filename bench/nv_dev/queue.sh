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
# 1. FlashAttention-2's warp tiles in the dK/dV kernel (bench/nv_dev/patches/bwd-warp-tiles.patch, notes v42), in
#    one build: the patch's kernel in a copy of cl/ that takes the warp tiles wherever they apply (its WARP2D_FITS:
#    f16 and bf16, K and V resident, 4 warps; the defaults at head_dim 64 and 128), timed against the tree through
#    ab.sh's kernel folder mode, then the backward suites on it and NVIDIA's register figures of its shapes.
#    Predicted 4-6% less time at head_dim 128, N = 4096. (The patch's planner part, which selects the warp tiles, lands with it.)
w2=/tmp/warp2d
rm -rf "$w2" && mkdir -p "$w2" && cp -r cl "$w2/" &&
  awk '/^diff --git/ {keep = $3 ~ /^a\/cl\//} keep' bench/nv_dev/patches/bwd-warp-tiles.patch >"$w2/cl.patch" &&
  (cd "$w2" && python3 "$OLDPWD/bench/nv_dev/apply_patch.py" cl.patch) &&
  sed -i 's|^#ifndef WARP2D$|#if !defined(WARP2D) \&\& WARP2D_FITS\n#define WARP2D 1\n#endif\n&|' \
    "$w2/cl/nvidia/flash_bwd_mma.cl" &&
  ROWS=bench/nv_dev/ab_rows_warp2d.txt TESTS="backward sequences_backward" OUT=$out/warp2d BUDGET=$(($(left) - 10)) \
    bash bench/nv_dev/ab.sh "$w2/cl" bench tests verbose 2>&1 | tail -40
echo "== warp tiles, $(el) s"
