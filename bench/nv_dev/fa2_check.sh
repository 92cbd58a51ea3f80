#!/bin/bash
# On the GPU machine: FlashAttention-2's criterion for the backward (docs/testing.md): dQ, dK and dV's max error
# against float64 at most twice that of PyTorch's own f16/bf16 gradients, python/tests/test_torch.py -k backward,
# with flashcl built into $BUILD (default build). pyopencl comes from the wheels bench/nv_dev/wheels.sh put in .whl
# (carried with the call), installed into /tmp/pyo. Logs to $OUT (or /tmp/nv_fa2).
# usage (repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/fa2_check.sh [pytest -k expression]
set -uo pipefail
out=${OUT:-/tmp/nv_fa2}; mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
b=${BUILD:-build}
[ -f "$b/libflashcl.so" ] || { cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON >"$out/build.log" 2>&1 &&
  cmake --build "$b" -j 16 >>"$out/build.log" 2>&1; } || { tail -20 "$out/build.log"; exit 1; }
pkgs="pyopencl siphash24 pytools platformdirs typing_extensions"
python3 -c 'import pytest' 2>/dev/null || pkgs+=" pytest pluggy iniconfig packaging"
python3 -m pip install -q --no-index --no-deps --find-links .whl --target /tmp/pyo $pkgs >"$out/pip.log" 2>&1 ||
  { tail -5 "$out/pip.log"; exit 1; }
cd python && PYTHONPATH=/tmp/pyo FLASHCL_LIBRARY="../$b/libflashcl.so" FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200} \
  python3 -m pytest -q tests/test_torch.py -k "${1:-backward}" 2>&1 | tee "$out/fa2.log" | tail -5
# Each failing case's name and seed (pytest shows the rng fixture's output for failures only; FLASHCL_TEST_SEED
# repeats the case), since $OUT may not come back.
grep -E "^(_+ test_|seed [0-9]+)" "$out/fa2.log" | tail -12
