#!/bin/bash
# Where paged decode's extra time goes at batch 1 (docs/notes-nvidia.md, v14): the tensor-core kernel with
# paged K/V timed beside dense K/V and beside variants of its own source, built from cl/ into $OUT by sed and
# loaded through FLASHCL_KERNEL_DIR, timing only (the variants attend over other blocks than the table names):
#   notable    no block-table read: a sequence's block j is pool block j (at batch 1 flashcl-bench's pool then
#              holds the sequence's keys in dense order)
#   noseqlen   notable, and the sequence length taken from the kernel argument instead of seqlens_k
#   unrolled   notable, and the tile copy loop fully unrolled instead of by 8 (spills 292 B in v11)
# usage (GPU machine, repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/paged_diag.sh; the build
# goes to $BUILD (default build-nv-paged), logs and the variant sources to $OUT (or /tmp/nv_paged).
set -uo pipefail
out=${OUT:-/tmp/nv_paged}; mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
b=${BUILD:-build-nv-paged}
{ cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build "$b" -j 16 --target flashcl-bench; } \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }

# variant NAME FILE PATTERN REPLACEMENT [FILE PATTERN REPLACEMENT ...]: cl/ copied to $out/NAME with each sed
# replacement applied, or exit when a pattern no longer matches the source.
variant() {
  local name=$1; shift
  rm -rf "${out:?}/$name" && cp -r cl "$out/$name"
  while [ $# -ge 3 ]; do
    grep -q -- "$2" "$out/$name/$1" || { echo "paged_diag: '$2' not in cl/$1 any more"; exit 1; }
    sed -i "s|$2|$3|" "$out/$name/$1"
    shift 3
  done
}
table='seq.table\[fcl_key_entry(&seq, (j0) + r_)\]'
variant notable nvidia/flash_fwd_mma.cl "$table" 'fcl_key_entry(\&seq, (j0) + r_)'
variant noseqlen nvidia/flash_fwd_mma.cl "$table" 'fcl_key_entry(\&seq, (j0) + r_)' \
  common.cl 'const int n_ = seqlens_k\[b\];' 'const int n_ = (nk_max);  '
variant unrolled nvidia/flash_fwd_mma.cl "$table" 'fcl_key_entry(\&seq, (j0) + r_)' \
  nvidia/flash_fwd_mma.cl '^#pragma unroll 8$' '#pragma unroll'

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null; date -u
# One flashcl-bench run: its median in µs, or its status.
us() {
  timeout 60 "$b/tools/flashcl-bench" --json --device H200 "$@" 2>>"$out/err" | python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        r = json.loads(line)
        print("%.1f" % (r["median_ms"] * 1e3) if r["status"] == "ok" else r["status"])'
}
for row in "1 32 8 1 4096" "1 32 8 1 32768"; do
  # shellcheck disable=SC2086
  set -- $row
  a="--batch $1 --heads $2 --kv-heads $3 --seqlen-q $4 --seqlen $5 --dtype f16 --head-dim 128 --impl flash
     --layout bnhd --flush 256 --iters 20 --warmup 3"
  line="B=$1 H=$2 HKV=$3 Q=$4 N=$5 (µs):"
  for _ in 1 2; do
    # shellcheck disable=SC2086
    line+=" dense $(FLASHCL_CACHE_DIR=/tmp/fcl-pd-dense us $a) paged $(FLASHCL_CACHE_DIR=/tmp/fcl-pd-paged us $a --paged 16)"
    for v in notable noseqlen unrolled; do
      # shellcheck disable=SC2086
      line+=" $v $(FLASHCL_KERNEL_DIR="$out/$v" FLASHCL_CACHE_DIR=/tmp/fcl-pd-$v us $a --paged 16)"
    done
    line+=" |"
  done
  echo "$line"
done 2>&1 | tee "$out/paged_diag.log"
