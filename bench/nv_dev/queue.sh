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
# STEPS (default "dq2") names which of these run, each only while enough is left:
#   dq2    the dQ kernel with two m16 tiles of query rows a warp (bench/nv_dev/patches/bwd-dq-two-tiles.patch, notes
#          v44, predicted 2-6% less backward time at head_dim 64): ab.sh's A/B of the patch, rows
#          bench/nv_dev/ab_rows_dq_tiles.txt, then test_backward and test_sequences_backward on it with the two tiles
#          forced (FLASHCL_BACKWARD_SHAPE=4,128,4,64,1,2) and test_variant, and NVIDIA's registers of the dQ kernel at
#          head_dim 64 with two tiles and one.
# The steps v44 ran for the warp tiles of FlashAttention-2 in the dK/dV kernel (kv_resident 2), in one build
# (build-gpu):
#   rows   bench/nv_dev/ab_rows_warp2d.txt at FLASHCL_BACKWARD_SHAPE=4,64,4,64,1 (K and V resident, no warp tiles)
#          and 4,64,4,64,2 (the warp tiles), two rounds: median ms each (modifiers, head_dim 96, bf16 at 16384)
#   table  issue 14's table (bench/compare_torch.py --backward) beside PyTorch's backends
#   suite  the whole suite on the GPU (ctest, the Oclgrind groups and the tools' label left out)
steps=${STEPS:-dq2}
if [[ " $steps " == *" dq2 "* ]]; then
  d64="-DMMA_KIND=2 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=64"
  ROWS=bench/nv_dev/ab_rows_dq_tiles.txt TESTS="variant backward@4,128,4,64,1,2 sequences_backward@4,128,4,64,1,2" \
    VERBOSE_CFGS="$d64 -DQT=2;$d64" OUT=$out/dq2 BUDGET=$(($(left) - 10)) \
    bash bench/nv_dev/ab.sh bench/nv_dev/patches/bwd-dq-two-tiles.patch bench tests verbose 2>&1 | tail -30
  echo "== dq2, $(el) s"
  steps=${steps/dq2/}
  [ -z "${steps// /}" ] && exit 0
fi
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build build-gpu -j 16; } \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "== built, $(el) s"
export FLASHCL_CACHE_DIR=/tmp/fcl-cache-queue
bench1() { # SHAPE ARGS...: median ms of one flashcl-bench row at FLASHCL_BACKWARD_SHAPE=SHAPE ("forced" when taken)
  local shape=$1; shift
  FLASHCL_BACKWARD_SHAPE=$shape timeout 90 build-gpu/tools/flashcl-bench --json --device "$FLASHCL_TEST_DEVICE" "$@" \
    2>>"$out/bench.err" | python3 -c '
import json, sys
r = next((json.loads(l) for l in sys.stdin if l.startswith("{")), None)
if not r or r.get("status") != "ok": print("failed"); sys.exit()
print("%.4g%s" % (r["median_ms"], " (forced)" if "_SHAPE)" in r.get("plan", "") else ""))'
}
if [[ " $steps " == *" rows "* ]]; then
  while IFS= read -r line; do
    [[ -z $line || $line == \#* ]] && continue
    [ "$(left)" -lt 200 ] && { echo "rows: stopped, $(left) s left"; break; }
    res=""
    for r in 1 2; do res+=" resident $(bench1 4,64,4,64,1 $line) warp tiles $(bench1 4,64,4,64,2 $line) |"; done
    echo "$line:$res" | tee -a "$out/rows.txt"
  done <bench/nv_dev/ab_rows_warp2d.txt
  echo "== rows, $(el) s"
fi
if [[ " $steps " == *" table "* ]] && [ "$(left)" -gt 150 ]; then
  timeout $(($(left) - 10)) python3 bench/compare_torch.py --flashcl-bench build-gpu/tools/flashcl-bench \
    --device "$FLASHCL_TEST_DEVICE" --backward --skip math,naive --dtype f16,bf16 --head-dim 64,128 --causal both \
    --seqlen 1024,4096,16384 >"$out/table_backward.txt" 2>"$out/table_backward.err"
  tail -32 "$out/table_backward.txt"
  echo "== table, $(el) s"
fi
if [[ " $steps " == *" suite "* ]] && [ "$(left)" -gt 120 ]; then
  (cd build-gpu && timeout $(($(left) - 10)) ctest -j 14 -E oclgrind -LE tools --timeout 200 >"$out/ctest.log" 2>&1)
  grep -E "tests passed|Failed|\*\*\*|Total Test" "$out/ctest.log" | tail -25
  echo "== suite, $(el) s"
fi
