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
# (Step 1 builds flashcl-bench through kdirs.sh.)

# 1. Where the local-memory reads cost (notes v42, call 2): the B operands read once per k step in the dK/dV kernel's
#    S^T and dP^T only, in fcl_mma_ab only (its dV, dK and the dQ kernel's dS K), in the dQ kernel's S and dP only,
#    and the dQ kernel gone (bench/nv_dev/forward_parts.sh's copies of cl/), each row timed with every folder.
PREPARE=1 bash bench/nv_dev/forward_parts.sh bwdnodq bwdbonce_abt bwdbonce_ab bwdbonce_dq >/dev/null || exit 1
OUT=$out/parts ROWS=bench/nv_dev/ab_rows_backward.txt timeout $(($(left) - 10)) bash bench/nv_dev/kdirs.sh . \
  /tmp/fwd-parts/bwdnodq /tmp/fwd-parts/bwdbonce_abt /tmp/fwd-parts/bwdbonce_ab /tmp/fwd-parts/bwdbonce_dq 2>&1 |
  tee "$out/parts.txt"
echo "== parts, $(el) s"
