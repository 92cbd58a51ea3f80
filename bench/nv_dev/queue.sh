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
# (Step 1 builds flashcl-bench through kdirs.sh; step 2 builds its kernels through nvbuild.c.)

# 1. What the dK/dV kernel's parts cost (notes v42): the backward with the dK/dV kernel gone, its exponentials or its
#    whole elementwise step dropped, the products' B operands read once per k step, products alone, and both
#    kernels' steps without the branch to the mask layer
#    (bench/nv_dev/forward_parts.sh's bwd* copies of cl/), each row timed with every folder in turn.
PREPARE=1 bash bench/nv_dev/forward_parts.sh bwdnodkdv bwdnoexp bwdnoelem bwdbonce bwdmmaonly bwdonebb >/dev/null || exit 1
OUT=$out/parts ROWS=bench/nv_dev/ab_rows_backward.txt timeout $(($(left) - 60)) bash bench/nv_dev/kdirs.sh . \
  /tmp/fwd-parts/bwdnodkdv /tmp/fwd-parts/bwdnoexp /tmp/fwd-parts/bwdnoelem /tmp/fwd-parts/bwdbonce \
  /tmp/fwd-parts/bwdmmaonly /tmp/fwd-parts/bwdonebb 2>&1 | tee "$out/parts.txt"
echo "== parts, $(el) s"

# 2. NVIDIA's registers, stack frames and spills of the backward's default shapes, the tree's kernels (never seen:
#    v41's run built without -DFCL_PTX=1, which nvbuild.c now adds).
OUT=$out/verbose-tree BUDGET=$(($(left) - 10)) bash bench/nv_dev/ab.sh cl verbose 2>&1 | tail -40
echo "== verbose (the tree), $(el) s"
