#!/bin/bash
# Development run of the NVIDIA tensor-core forward on a GPU machine (figures in docs/notes-nvidia.md).
# Builds the library of the tree this script lives in (Release, into build-nv) and nvbench, then runs
# the named steps; logs go to $OUT (or /tmp/nv_dev). Needs an OpenCL device whose name contains H200
# (FLASHCL_TEST_DEVICE, default H200).
# usage: bash bench/nv_dev/run.sh [tests] [verbose] [sweep] [bench] [torch]
#   tests    test_variant, test_forward, and test_forward with FLASHCL_PORTABLE_ONLY=1 (tests_on: the first two)
#   verbose  -cl-nv-verbose register/spill report of several kernel shapes
#   sweep    kernel shapes built directly, timed against the library's output on the same inputs
#   bench    fcl_attention_forward on the 24 rows (B=4, H=16, f16/bf16, d 64/128, N 1024/4096/16384)
#   torch    PyTorch SDPA flash and cuDNN backends on the same rows
set -uo pipefail
out=${OUT:-/tmp/nv_dev}; mkdir -p "$out"
dev=$(cd "$(dirname "$0")" && pwd)
cd "$dev/../.." || exit 1
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200} FLASHCL_CACHE_DIR=
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u; } | tee "$out/device.txt"
{ cmake -S . -B build-nv -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON -DFLASHCL_BUILD_TOOLS=OFF && cmake --build build-nv -j 16; } >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -DCL_TARGET_OPENCL_VERSION=120 -Iinclude -Isrc "$dev/nvbench.c" build-nv/libflashcl.a -lOpenCL -lpthread -lm -o build-nv/nvbench >>"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
summary=""
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    tests|tests_on)
      timeout 150 ./build-nv/tests/test_variant >"$out/variant.log" 2>&1
      timeout 200 ./build-nv/tests/test_forward >"$out/forward_on.log" 2>&1
      logs="variant forward_on"
      if [ "$step" = tests ]; then
        FLASHCL_PORTABLE_ONLY=1 timeout 200 ./build-nv/tests/test_forward >"$out/forward_off.log" 2>&1
        logs="$logs forward_off"
      fi
      for f in $logs; do summary+="$f: $(grep -E 'passed, .* failed' "$out/$f.log" | tail -1)"$'\n'; grep -h "^FAIL" "$out/$f.log" | head -10; done ;;
    verbose) timeout 120 ./build-nv/nvbench verbose >"$out/verbose.log" 2>&1
      grep -E "^\[|registers|spill|error" "$out/verbose.log" | head -60 ;;
    sweep) timeout 200 ./build-nv/nvbench sweep 2>&1 | tee "$out/sweep.log" ;;
    bench) timeout 200 ./build-nv/nvbench bench 2>&1 | tee "$out/bench.log" ;;
    torch) PYTHONUNBUFFERED=1 timeout 200 python3 "$dev/torch_sdpa.py" 2>&1 | grep -v Warning | tee "$out/torch.log" ;;
  esac
  summary+="step $step: $(( $(date +%s) - t0 )) s"$'\n'
done
echo "== summary"; echo "$summary"
