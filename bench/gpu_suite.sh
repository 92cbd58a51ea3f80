#!/bin/bash
# Builds flashcl and runs the test suite on the machine's first GPU; logs go to $OUT (or ./gpu-logs).
# Usage: bench/gpu_suite.sh [ctest -R regex]
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; clinfo -l; } 2>&1 | tee "$out/device.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j 16 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
cd build-gpu
ctest -V -E oclgrind ${1:+-R "$1"} >"$out/ctest.log" 2>&1; status=$?
grep -E "^(FAIL|skip)|device:|passed, .* failed" "$out/ctest.log" | sort | uniq -c | tail -40
exit $status
