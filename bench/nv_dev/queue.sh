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
# The dQ kernel with two m16 tiles of query rows a warp (bench/nv_dev/patches/bwd-dq-two-tiles.patch, notes v44,
# predicted 2-6% less backward time at head_dim 64): ab.sh's A/B of the patch, rows bench/nv_dev/ab_rows_dq_tiles.txt,
# then test_variant, test_backward and test_sequences_backward on it with the two tiles forced
# (FLASHCL_BACKWARD_SHAPE=4,128,4,64,1,2), and NVIDIA's registers of the dQ kernel at head_dim 64 with two tiles and one.
d64="-DMMA_KIND=2 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=64"
ROWS=bench/nv_dev/ab_rows_dq_tiles.txt TESTS="variant backward@4,128,4,64,1,2 sequences_backward@4,128,4,64,1,2" \
  VERBOSE_CFGS="$d64 -DQT=2;$d64" OUT=$out/dq2 BUDGET=$(($(left) - 10)) \
  bash bench/nv_dev/ab.sh bench/nv_dev/patches/bwd-dq-two-tiles.patch bench tests verbose 2>&1 | tail -30
echo "== dq2, $(el) s"
