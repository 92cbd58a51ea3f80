#!/bin/bash
# On this machine (it has the network; the GPU machine has none): downloads the wheels the Python package's tests
# need beyond what the GPU machine has (PyTorch and numpy are there; pyopencl and its pure dependencies are not)
# into .whl/ (ignored by git), for CPython 3.10-3.13 on x86_64 Linux. Pass `carry: [".gpu", ".whl"]` to the
# device call that runs bench/nv_dev/fa2_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
for v in 3.10 3.11 3.12 3.13; do
  for pkg in pyopencl siphash24; do
    pip download -q --no-deps --only-binary=:all: --python-version "$v" --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg"
  done
done
pip download -q --no-deps --only-binary=:all: -d .whl pytools platformdirs typing_extensions pytest pluggy iniconfig \
  packaging
du -sh .whl
