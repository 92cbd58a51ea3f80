#!/bin/bash
# Several kernel folders against each other on the GPU machine: one Release build of the tree, then each row of
# $ROWS (as bench/nv_dev/ab.sh reads them) timed with every folder in turn (FLASHCL_KERNEL_DIR; "." is the tree's
# cl/), ROUNDS rounds (default 2) interleaved; median ms a run, one line a row, the folders in the order given.
# usage (repository root, after `bash .gpu/setup.sh`): ROWS=FILE bash bench/nv_dev/kdirs.sh DIR...
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/nv_kdirs}; mkdir -p "$out"
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200}
build=${BUILD:-/tmp/kdirs-build} # BUILD: an existing build folder of the tree, reused
{ cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build $build -j 16 --target flashcl-bench; } \
  >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "folders: $*"
while IFS= read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  envs=() args=()
  for w in $line; do if [[ $w == *=* && ${#args[@]} -eq 0 ]]; then envs+=("$w"); else args+=("$w"); fi; done
  res=""
  for r in $(seq "${ROUNDS:-2}"); do
    for d in "$@"; do
      dir=$(realpath "$d"); [ "$d" = . ] && dir=$(realpath cl)
      ms=$(env "${envs[@]}" FLASHCL_KERNEL_DIR="$dir" FLASHCL_CACHE_DIR="/tmp/kdirs-cache-$(echo "$dir" | md5sum | cut -c1-8)" \
        timeout 60 $build/tools/flashcl-bench --json --device "$FLASHCL_TEST_DEVICE" "${args[@]}" 2>>"$out/bench.err" |
        python3 -c 'import json,sys; r=next((json.loads(l) for l in sys.stdin if l.startswith("{")),None); print("%.4g"%r["median_ms"] if r and r.get("status")=="ok" else "failed")')
      res+=" $ms"
    done
    res+=" |"
  done
  echo "$line:$res"
done <"${ROWS:?ROWS names a file of rows}"
