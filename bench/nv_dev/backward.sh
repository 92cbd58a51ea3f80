#!/bin/bash
# One-call validation of the tensor-core backward (cl/nvidia/flash_bwd_mma.cl; docs/notes-nvidia.md, v10) on the
# GPU machine, inside the 600 s of one device call (or BUDGET s of it). Run from the root of the tree to test, after
# `bash .gpu/setup.sh`:  bash bench/nv_dev/backward.sh [STEP...]  (default: verbose variant tests compare tests_off)
# Logs go to $OUT (or /tmp/nv_backward); the build to $BUILD (default build-nv-bwd in the tree, ignored by git).
# Needs an OpenCL device whose name contains H200 (FLASHCL_TEST_DEVICE). Steps, each under its own timeout, a
# step skipped when the call's time is nearly spent; a short summary is printed last:
#   build    Release, -DFLASHCL_WERROR=ON, library + tests + tools, and bench/nv_dev/nvbuild.c
#   verbose  -cl-nv-verbose registers/spills of the planner's shapes (NVIDIA's compiler: the real figures)
#   variant  test_variant (the backward's planner and the variant fcl_describe_plan reports: nvidia_mma)
#   tests    test_backward and test_sequences_backward with the tensor-core path on, then with
#            FLASHCL_PORTABLE_ONLY=1 (the portable kernels, as a control)
#   compare  bench/compare_torch.py --backward: f16/bf16, d=64/128, N=1024,4096, causal and not, B=4 H=16,
#            beside PyTorch SDPA's flash, efficient and cuDNN backwards
#   tests_off test_backward and test_sequences_backward with FLASHCL_PORTABLE_ONLY=1
#   alone    (not in the default) where the time goes: f16 (or ALONE_DTYPE), B=4, H=16, N=4096, d=64/128, causal and not, the
#            whole backward and then with the dK/dV or the dQ kernel returning at once (forward_parts.sh's bwdnodkdv
#            and bwdnodq copies of cl/, through FLASHCL_KERNEL_DIR); each kernel's time is the whole less the run
#            without it
set -uo pipefail
t_start=$(date +%s)
out=${OUT:-/tmp/nv_backward}; mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
b=${BUILD:-build-nv-bwd}
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200} FLASHCL_CACHE_DIR=${FLASHCL_CACHE_DIR:-/tmp/fcl-cache-bwd}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u; git log --oneline -1; } 2>&1 | tee "$out/device.txt"
summary=""
steps=" ${*:-verbose variant tests compare tests_off} "
left() { echo $(( ${BUDGET:-590} - ($(date +%s) - t_start) )); }
# step NAME NEEDED_S: 0 when at least NEEDED_S seconds are left, else notes the skip.
step() {
  [[ $steps == *" $1 "* || ($1 == tests_off_seq && $steps == *" tests_off "*) ]] || return 1
  if [ "$(left)" -lt "$2" ]; then summary+=$'\n'"$1: skipped ($(left) s left)"; return 1; fi; return 0
}
tally() { # log label
  local line; line=$(grep -E 'passed, .* failed' "$1" | tail -1)
  summary+=$'\n'"$2: ${line:-no summary line (rc $3; see $(basename "$1"))}"
  summary+="$(grep -E '^FAIL' "$1" | head -8 | cut -c1-220 | sed 's/^/\n    /')"
}

t0=$(date +%s)
{ cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build "$b" -j 16; } >"$out/build.log" 2>&1
rc=$?
gcc -O2 -Iinclude bench/nv_dev/nvbuild.c -lOpenCL -o "$b/nvbuild" >>"$out/build.log" 2>&1
summary+=$'\n'"build: rc $rc [$(( $(date +%s) - t0 )) s]"
if [ $rc -ne 0 ]; then tail -30 "$out/build.log"; echo "== summary$summary"; exit 1; fi

if step verbose 60; then
  t0=$(date +%s)
  for cfg in "-DD=64 -DDP=64 -DDS=72 -DMMA_KIND=1 -DNW=4 -DBN=64" "-DD=64 -DDP=64 -DDS=72 -DMMA_KIND=2 -DNW=4 -DBN=64" \
             "-DD=128 -DDP=128 -DDS=136 -DMMA_KIND=1 -DNW=2 -DBN=32" "-DD=128 -DDP=128 -DDS=136 -DMMA_KIND=2 -DNW=4 -DBN=32"; do
    for mods in "-DWINDOW=0" "-DWINDOW=2 -DSOFTCAP=1 -DALIBI=1 -DMASK=2 -DSINKS=1 -DVARLEN_Q=1 -DKV=1 -DSEQLENS_K=1"; do
      echo "== -DDTYPE=1 $cfg $mods" >>"$out/verbose.log"
      timeout 30 "$b/nvbuild" "-cl-nv-verbose -DDTYPE=1 $cfg $mods" cl/common.cl cl/nvidia/ptx.cl cl/nvidia/flash_bwd_mma.cl 2>&1 |
        grep -iE "rc=|registers|spill|error|smem" >>"$out/verbose.log"
    done
  done
  summary+=$'\n'"verbose: $(grep -c '^rc=0' "$out/verbose.log") of 8 built [$(( $(date +%s) - t0 )) s]"
  summary+="$(grep -E '^==|Used|spill' "$out/verbose.log" | sed 's/ptxas info *: //' | cut -c1-160 | sed 's/^/\n    /')"
fi

if step variant 30; then
  timeout 60 "$b/tests/test_variant" >"$out/variant.log" 2>&1; tally "$out/variant.log" variant $?
  summary+="$(grep -E 'backward (f16|bf16) head_dim (64|128) runs' "$out/variant.log" | grep default | head -2 | cut -c1-200 | sed 's/^/\n    /')"
fi

if step tests 200; then
  t0=$(date +%s)
  timeout 150 "$b/tests/test_backward" >"$out/backward_on.log" 2>&1; tally "$out/backward_on.log" "test_backward (tensor cores on)" $?
  timeout 60 "$b/tests/test_sequences_backward" >"$out/seq_backward_on.log" 2>&1
  tally "$out/seq_backward_on.log" "test_sequences_backward (on)" $?
  summary+=$'\n'"[tests on: $(( $(date +%s) - t0 )) s]"
fi
if step compare 150; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 100 > 240 ? 240 : $(left) - 100 )) python3 bench/compare_torch.py \
    --flashcl-bench "$b/tools/flashcl-bench" --device H200 --backward --dtype f16,bf16 --head-dim 64,128 \
    --seqlen 1024,4096 --causal both --iters 10 --warmup 2 --skip math,naive --json "$out/compare.jsonl" \
    >"$out/compare.log" 2>"$out/compare.err"
  summary+=$'\n'"compare (rc $?, $(( $(date +%s) - t0 )) s):"$'\n'"$(cat "$out/compare.log")"
fi
if step tests_off 60; then
  t0=$(date +%s)
  FLASHCL_PORTABLE_ONLY=1 timeout $(( $(left) - 40 > 150 ? 150 : $(left) - 40 )) "$b/tests/test_backward" >"$out/backward_off.log" 2>&1
  tally "$out/backward_off.log" "test_backward (FLASHCL_PORTABLE_ONLY=1)" $?
  if step tests_off_seq 30; then
    FLASHCL_PORTABLE_ONLY=1 timeout $(( $(left) - 10 > 60 ? 60 : $(left) - 10 )) "$b/tests/test_sequences_backward" \
      >"$out/seq_backward_off.log" 2>&1
    tally "$out/seq_backward_off.log" "test_sequences_backward (FLASHCL_PORTABLE_ONLY=1)" $?
  fi
  summary+=$'\n'"[tests off: $(( $(date +%s) - t0 )) s]"
fi
if step alone 90; then
  # Copies of cl/ in which one heavy kernel returns at once (its outputs are left unwritten: timing only), as
  # forward_parts.sh writes them: /tmp/fwd-parts/bwdnodkdv and /tmp/fwd-parts/bwdnodq.
  PREPARE=1 bash bench/nv_dev/forward_parts.sh bwdnodkdv bwdnodq >/dev/null || exit 1
  bench_ms() { # KERNEL_DIR ARGS...: the median ms of one flashcl-bench row
    local dir=$1; shift
    env ${dir:+FLASHCL_KERNEL_DIR=$dir} FLASHCL_CACHE_DIR="/tmp/fcl-cache-alone${dir//\//-}" timeout 60 \
      "$b/tools/flashcl-bench" --json --device H200 "$@" 2>>"$out/alone.err" |
      python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin if l.startswith("{")]; print("%.3f" % r[0]["median_ms"] if r and r[0].get("status") == "ok" else "failed")'
  }
  adt=${ALONE_DTYPE:-f16}
  summary+=$'\n'"alone: d causal | whole | without dK/dV | without dQ (ms, $adt, B=4 H=16 N=4096, two rounds)"
  for d in 64 128; do
    for causal in "" --causal; do
      row=(--batch 4 --heads 16 --dtype $adt --head-dim $d --seqlen 4096 --layout bnhd --impl backward --iters 10 --warmup 2 $causal)
      line="$d ${causal:-no}"
      for r in 1 2; do
        line+=" | $(bench_ms "" "${row[@]}") | $(bench_ms /tmp/fwd-parts/bwdnodkdv "${row[@]}") | $(bench_ms /tmp/fwd-parts/bwdnodq "${row[@]}")"
      done
      summary+=$'\n'"    $line"
    done
  done
fi
echo "$summary" >"$out/summary.txt"
echo "== summary ($(( $(date +%s) - t_start )) s; logs in $out)$summary"
