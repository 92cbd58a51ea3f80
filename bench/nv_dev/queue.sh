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

# 1. Issue 15's forward table on the defaults.
timeout $(($(left) - 10)) python3 bench/compare_torch.py --flashcl-bench $bench --device "$FLASHCL_TEST_DEVICE" \
  --skip math --dtype f16,bf16 --head-dim 64,128 --causal both --seqlen 1024,4096,16384 --json "$out/fwd.jsonl" \
  >"$out/fwd.txt" 2>"$out/fwd.err"
echo "== forward table (rc $?), $(el) s"; tail -28 "$out/fwd.txt"

# 2. NVIDIA's registers, stack frames and spills of the backward's default shapes, the tree's kernels.
if [ "$(left)" -gt 90 ]; then
  OUT=$out/verbose-tree BUDGET=$(($(left) - 30)) bash bench/nv_dev/ab.sh cl verbose 2>&1 | tail -40
  echo "== verbose (the tree), $(el) s"
fi

# 3. The two prepared backward kernel changes, alone and together, against the tree (one build).
P=bench/nv_dev/patches
if [ "$(left)" -gt 150 ] && patched inline $P/bwd-always-inline.patch && patched sfirst $P/bwd-s-first.patch &&
   patched both $P/bwd-always-inline.patch $P/bwd-s-first.patch; then
  echo "== backward kernels: tree, always-inline, S first, both (median ms, two rounds)"
  OUT=$out/kdirs BUILD=build-gpu ROWS=bench/nv_dev/ab_rows_bwd_kernels.txt timeout $(($(left) - 60)) bash bench/nv_dev/kdirs.sh \
    . /tmp/queue-cl/inline/cl /tmp/queue-cl/sfirst/cl /tmp/queue-cl/both/cl 2>&1 | tail -9
  echo "$(el) s"
  if [ "$(left)" -gt 60 ]; then
    OUT=$out/verbose-inline BUDGET=$(($(left) - 20)) bash bench/nv_dev/ab.sh /tmp/queue-cl/inline/cl verbose 2>&1 | tail -40
    echo "== verbose (always-inline), $(el) s"
  fi
  for t in backward sequences_backward; do
    [ "$(left)" -lt 90 ] && { echo "test_$t (both changes) skipped"; continue; }
    FLASHCL_KERNEL_DIR=/tmp/queue-cl/both/cl FLASHCL_CACHE_DIR=/tmp/queue-cache-both timeout $(($(left) - 40)) \
      build-gpu/tests/test_$t >"$out/test_${t}_both.log" 2>&1
    echo "test_$t with both changes (rc $?): $(grep -E 'passed, .* failed' "$out/test_${t}_both.log" | tail -1), $(el) s"
  done
fi

# 4. The backward beside PyTorch (issue 14's table).
if [ "$(left)" -gt 120 ]; then
  timeout $(($(left) - 10)) python3 bench/compare_torch.py --flashcl-bench $bench --device "$FLASHCL_TEST_DEVICE" \
    --backward --skip math,naive --dtype f16,bf16 --head-dim 64,128 --causal both --seqlen 1024,4096,16384 \
    --json "$out/bwd.jsonl" >"$out/bwd.txt" 2>"$out/bwd.err"
  echo "== backward table (rc $?), $(el) s"; tail -28 "$out/bwd.txt"
fi

# 5. The forward suites with head_dim 64's FlashAttention-2 tile forced on every case.
for t in forward sequences; do
  [ "$(left)" -lt 30 ] && { echo "test_$t (forced shape) skipped"; continue; }
  FLASHCL_FORWARD_MMA_SHAPE=4,2,128,1,2,0 timeout $(($(left) - 5)) build-gpu/tests/test_$t >"$out/test_${t}_forced.log" 2>&1
  echo "test_$t at 4,2,128,1,2,0 (rc $?): $(grep -E 'passed, .* failed' "$out/test_${t}_forced.log" | tail -1), $(el) s"
done
