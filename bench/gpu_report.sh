#!/bin/bash
# The GPU record: `bench/gpu_report.sh tests` builds into build-gpu and runs the test suite (the NVIDIA
# path on, then the forward tests with it forced off) and flashcl-probe; `bench/gpu_report.sh bench`
# runs the benchmark tables against PyTorch and the memory sweep. Logs and tables go to $OUT (or
# ./gpu-logs). Run on the GPU machine after `bash .gpu/setup.sh`; the device is picked by name.
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200}
dev=$FLASHCL_TEST_DEVICE
bench=build-gpu/tools/flashcl-bench
case "${1:-}" in
tests)
  bash bench/gpu_suite.sh >"$out/suite.txt" 2>&1
  echo "suite rc=$?" >>"$out/suite.txt"
  (cd build-gpu && FLASHCL_PORTABLE_ONLY=1 ctest -R "^(forward|threads|validation|variant)" >"$out/ctest_portable.log" 2>&1;
   echo "portable-only rc=$?" >>"$out/ctest_portable.log")
  build-gpu/tools/flashcl-probe --device "$dev" >"$out/probe.txt" 2>&1
  echo "probe rc=$?" >>"$out/probe.txt"
  grep -E "tests passed|rc=" "$out"/suite.txt "$out"/ctest_portable.log "$out"/probe.txt
  ;;
bench)
  export PYTHONUNBUFFERED=1
  cmp="python3 bench/compare_torch.py --flashcl-bench $bench --device $dev"
  $cmp --skip math --dtype f16,bf16 --head-dim 64,128 --causal both --seqlen 1024,4096,16384 --json "$out/fwd_half.jsonl" \
    >"$out/fwd_half.txt" 2>"$out/fwd_half.err"
  $cmp --dtype f32 --head-dim 64,128 --causal both --seqlen 4096 --with-reference --json "$out/fwd_f32.jsonl" \
    >"$out/fwd_f32.txt" 2>"$out/fwd_f32.err"
  $cmp --skip math,naive --backward --dtype f32,f16 --head-dim 64,128 --causal both --seqlen 4096 --json "$out/bwd.jsonl" \
    >"$out/bwd.txt" 2>"$out/bwd.err"
  $bench --device "$dev" --dtype f16 --batch 1 --heads 16 --head-dim 128 --sweep --max-seqlen 131072 \
    --impl flash,reference --iters 10 --warmup 1 >"$out/sweep.txt" 2>"$out/sweep.err"
  tail -n 40 "$out/fwd_half.txt" "$out/fwd_f32.txt" "$out/bwd.txt" "$out/sweep.txt"
  ;;
*)
  echo "usage: $0 tests|bench" >&2
  exit 2
  ;;
esac
