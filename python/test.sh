#!/bin/bash
# Tests the Python package against the library in build/ ($FLASHCL_LIBRARY overrides): a virtual environment
# (build/python-venv, or $FLASHCL_PYTHON_VENV) with pyopencl, numpy, pytest and ml_dtypes from the package
# index, the package installed from python/, an import check, then pytest. Arguments go to pytest; when one
# names a test file or folder (python/tests/test_sequences.py, or ...::test_name), only those run.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FLASHCL_PYTHON_VENV:-build/python-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
venv=$(cd "$venv" && pwd)
"$venv/bin/pip" install -q --disable-pip-version-check pyopencl numpy pytest ml_dtypes
"$venv/bin/pip" install -q --disable-pip-version-check ./python
rm -rf python/build python/flashcl.egg-info # setuptools' in-tree leftovers

# Importing needs no library: it is loaded at the first call.
(cd / && env -u FLASHCL_LIBRARY "$venv/bin/python" -c "import flashcl")

export FLASHCL_LIBRARY=${FLASHCL_LIBRARY:-$PWD/build/libflashcl.so}
tests=python/tests
for a in "$@"; do [[ $a != -* && -e ${a%%::*} ]] && tests=; done
"$venv/bin/python" -m pytest -q -p no:cacheprovider ${tests:+"$tests"} "$@"
