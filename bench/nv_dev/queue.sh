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
# Waiting (notes v50): patches/bwd-dkdv-mask-local.patch, the dK/dV kernel's mask blocks in local memory (step
# masklocal: bench/nv_dev/ab.sh's A/B on rows ab_rows_bwd_mask_local.txt, the backward suites on B, NVIDIA's registers
# of the two-key-tile kernel). The other steps check and time the tree as it is, built once into build-gpu; STEPS names
# which of these run, each only while enough of the call is left (carry .whl for fa2):
#   masklocal the A/B above, in at most MASK_BUDGET s (default 420)
#   stream the device's K/V streaming ceiling by cp.async (bench/nv_dev/stream_read.c, no build of the tree; notes
#          v23 has the H200's, v51 asks for the H100's beside the decode rows' 2.97-3.06 TB/s)
#   forced the backward suites (ctest -R backward) with FLASHCL_BACKWARD_SHAPE set to each of $FORCED (shapes the
#          defaults do not take, checked before they are timed; "default" is the planner's own)
#   rows   BACKWARD_SHAPES (FLASHCL_BACKWARD_SHAPE values, "default" the planner's) on rows BACKWARD_ROWS (shapes.sh's
#          "D N [FLAGS];..."), f16 and bf16; by default two key tiles against the defaults with an f16 mask
#   suite  the whole suite on the GPU (ctest, the Oclgrind groups and the tools' label left out)
#   portable the backward suites (ctest -R backward) with FLASHCL_PORTABLE_ONLY=1: the tensor-core backward off
#   table  issue 14's table (bench/compare_torch.py --backward) beside PyTorch's backends (TABLE_HEAD_DIMS, default
#          64,128)
#   fa2    FlashAttention-2's criterion (bench/nv_dev/fa2_check.sh; needs .whl carried)
#   decode issue 12's decode table (bench/compare_torch.py --decode --flush-read) beside PyTorch's backends
steps=" ${STEPS:-masklocal} "
if [[ $steps == *" masklocal "* ]]; then
  # verbose: NVIDIA's registers of the two-key-tile kernel (with every modifier: why a mask made it 30% slower, v50).
  ROWS=bench/nv_dev/ab_rows_bwd_mask_local.txt TESTS="variant backward sequences_backward" BUDGET=${MASK_BUDGET:-420} \
    VERBOSE_CFGS="-DMMA_KIND=1 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=128 -DKV_RESIDENT=1 -DQT=2" \
    OUT=$out/masklocal bash bench/nv_dev/ab.sh bench/nv_dev/patches/bwd-dkdv-mask-local.patch tests bench verbose |
    tail -30
  echo "== masklocal, $(el) s"
fi
if [[ $steps == *" stream "* ]] && [ "$(left)" -gt 40 ]; then
  gcc -O2 -Iinclude bench/nv_dev/stream_read.c -lOpenCL -o /tmp/stream_read >"$out/stream.log" 2>&1 &&
    timeout $(($(left) - 5)) /tmp/stream_read 2048 256 512 1056 >>"$out/stream.log" 2>&1
  grep -v bulk "$out/stream.log" | tail -14
  echo "== stream, $(el) s"
fi
[[ $steps =~ \ (forced|rows|suite|portable|table|fa2|decode)\  ]] || exit 0
export FLASHCL_CACHE_DIR=/tmp/fcl-cache-queue
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build build-gpu -j 16; } \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "== built, $(el) s"
# ctest in build-gpu (the Oclgrind groups left out) within what is left of the call, with its own arguments after
# NAME; its log goes to $out/NAME.log and its summary is printed. NAME=VALUE settings before the call reach the tests.
gpu_ctest() {
  local name=$1
  shift
  (cd build-gpu && timeout $(($(left) - 10)) ctest -j 14 -E oclgrind --timeout 200 "$@" >"$out/$name.log" 2>&1)
  grep -E "tests passed|Failed|\*\*\*|Total Test" "$out/$name.log" | grep -v Skipped | tail -12
}
# bench/compare_torch.py with build-gpu's flashcl-bench beside PyTorch's backends, its own arguments after NAME and
# LINES: the table to $out/NAME.txt (rows also as NAME.jsonl, errors NAME.err), its last LINES lines printed.
gpu_compare() {
  local name=$1 lines=$2
  shift 2
  timeout $(($(left) - 10)) python3 bench/compare_torch.py --flashcl-bench build-gpu/tools/flashcl-bench \
    --device "$FLASHCL_TEST_DEVICE" "$@" --json "$out/$name.jsonl" >"$out/$name.txt" 2>"$out/$name.err"
  tail -"$lines" "$out/$name.txt"
}
if [[ $steps == *" forced "* ]] && [ "$(left)" -gt 150 ]; then
  for shape in ${FORCED:-default}; do
    echo "FLASHCL_BACKWARD_SHAPE=$shape:"
    FLASHCL_BACKWARD_SHAPE=$shape gpu_ctest "forced_${shape//,/_}" -R backward
  done
  echo "== forced, $(el) s"
fi
if [[ $steps == *" rows "* ]]; then
  for dt in f16 bf16; do
    [ "$(left)" -gt 200 ] || break
    DEVICE=$FLASHCL_TEST_DEVICE BUILD=build-gpu BACKWARD_DTYPE=$dt \
      BACKWARD_ROWS="${BACKWARD_ROWS:-64 4096 --mask f16;32 4096 --mask f16}" \
      BACKWARD_SHAPES="${BACKWARD_SHAPES:-default 4,128,4,64,1,2,2}" OUT=$out/rows \
      bash bench/nv_dev/shapes.sh backward 2>&1 | grep "^backward" | tee -a "$out/rows.txt"
  done
  echo "== rows, $(el) s"
fi
if [[ $steps == *" suite "* ]] && [ "$(left)" -gt 120 ]; then
  gpu_ctest ctest -LE tools
  echo "== suite, $(el) s"
fi
if [[ $steps == *" portable "* ]] && [ "$(left)" -gt 120 ]; then
  FLASHCL_PORTABLE_ONLY=1 gpu_ctest portable -R backward
  echo "== portable, $(el) s"
fi
if [[ $steps == *" table "* ]] && [ "$(left)" -gt 150 ]; then
  gpu_compare table_backward 32 --backward --skip math,naive --dtype f16,bf16 --head-dim "${TABLE_HEAD_DIMS:-64,128}" \
    --causal both --seqlen 1024,4096,16384
  echo "== table, $(el) s"
fi
if [[ $steps == *" fa2 "* ]] && [ "$(left)" -gt 90 ]; then
  BUILD=build-gpu OUT=$out/fa2 timeout $(($(left) - 10)) bash bench/nv_dev/fa2_check.sh
  echo "== fa2, $(el) s"
fi
if [[ $steps == *" decode "* ]] && [ "$(left)" -gt 90 ]; then
  gpu_compare table_decode 12 --decode --flush-read
  echo "== decode, $(el) s"
fi
