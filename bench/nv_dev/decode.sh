#!/bin/bash
# Decode run of issue 12 on the GPU machine (figures in docs/notes-nvidia.md, v7, and docs/benchmarks.md).
# Run from the repository root after building the library and tools into $BUILD (default /tmp/b); logs go
# to $OUT (or /tmp/nv_decode). Needs an OpenCL device whose name contains H200 (FLASHCL_TEST_DEVICE).
# usage: bash bench/nv_dev/decode.sh [verbose] [tests] [sweep] [compare] [paged]
#   verbose  -cl-nv-verbose registers/spills of the decode kernel shapes (bench/nv_dev/nvbuild.c builds one
#            program and prints its log)
#   tests    test_variant, test_decode (planner's splits, then FLASHCL_FORWARD_SPLITS=5 and 100, then a ring of
#            five K/V buffers: FLASHCL_FORWARD_MMA_SHAPE=2,1,32,0,5), test_forward
#   sweep    flashcl-bench on three batch-1 rows with FLASHCL_FORWARD_SPLITS forced to 8..128 (0: the planner)
#   compare  bench/compare_torch.py --decode: the six rows beside PyTorch SDPA
#   paged    the six rows dense and paged (--paged 16) at the planner's split counts, and the vLLM-shaped batch
#            (64 sequences of 100-8000 keys) from packed dense and from paged K/V
set -uo pipefail
out=${OUT:-/tmp/nv_decode}; mkdir -p "$out"
b=${BUILD:-/tmp/b}
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200} FLASHCL_CACHE_DIR=${FLASHCL_CACHE_DIR:-/tmp/fcl-cache}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u; } | tee "$out/device.txt"
summary=""
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    verbose)
      gcc -O2 -Iinclude bench/nv_dev/nvbuild.c -lOpenCL -o /tmp/nvbuild || continue
      base="-cl-nv-verbose -DDTYPE=1 -DD=128 -DDP=128 -DDS=136 -DQSMEM=0 -DSTAGES=2 -DWINDOW=0"
      for shape in "-DNW=1 -DMT=1 -DBC=64 -DPACK=1 -DSPLIT=1" "-DNW=1 -DMT=1 -DBC=64 -DPACK=0 -DSPLIT=1" \
                   "-DNW=1 -DMT=1 -DBC=64 -DPACK=1 -DSPLIT=1 -DALIBI=1 -DMASK=2 -DSOFTCAP=1 -DWINDOW=2" \
                   "-DNW=4 -DMT=1 -DBC=64 -DPACK=1 -DSPLIT=0" "-DNW=2 -DMT=2 -DBC=32 -DQSMEM=1 -DPACK=0 -DSPLIT=0"; do
        echo "== $shape" >>"$out/verbose.log"
        /tmp/nvbuild "$base $shape" cl/common.cl cl/nvidia/ptx.cl cl/nvidia/flash_fwd_mma.cl 2>&1 | grep -iE "rc=|registers|spill|error" >>"$out/verbose.log"
      done
      summary+=$'\n'"verbose: $(grep -c 'Used' "$out/verbose.log") builds reported"$'\n'"$(grep -E '==|Used|spill|rc=-|error' "$out/verbose.log" | grep -v 'bytes spill stores, 0 bytes spill loads' | head -20)" ;;
    tests)
      timeout 120 "$b/tests/test_variant" >"$out/variant.log" 2>&1
      timeout 150 "$b/tests/test_decode" >"$out/decode.log" 2>&1
      FLASHCL_FORWARD_SPLITS=5 timeout 150 "$b/tests/test_decode" >"$out/decode_split5.log" 2>&1
      FLASHCL_FORWARD_SPLITS=100 timeout 150 "$b/tests/test_decode" >"$out/decode_split100.log" 2>&1
      # a deeper K/V ring (five tile buffers) than the defaults' two
      FLASHCL_FORWARD_MMA_SHAPE=2,1,32,0,5 timeout 150 "$b/tests/test_decode" >"$out/decode_ring5.log" 2>&1
      timeout 200 "$b/tests/test_forward" >"$out/forward.log" 2>&1
      for l in variant decode decode_split5 decode_split100 decode_ring5 forward; do
        summary+=$'\n'"$l: $(grep -E 'passed, .* failed' "$out/$l.log" | tail -1)"
        summary+="$(grep -E '^FAIL' "$out/$l.log" | head -5 | sed 's/^/\n  /')"
      done ;;
    sweep)
      for row in "1 32 8 1 4096" "1 32 8 1 32768" "1 32 32 1 131072"; do
        set -- $row
        line="sweep B=$1 H=$2 Hkv=$3 Q=$4 N=$5 (splits: median us, K+V GB/s):"
        for s in 0 8 16 32 64 128; do
          r=$(FLASHCL_FORWARD_SPLITS=$s "$b/tools/flashcl-bench" --json --device H200 --dtype f16 --batch $1 --heads $2 \
                --kv-heads $3 --seqlen-q $4 --seqlen $5 --head-dim 128 --impl flash --layout bnhd --flush 256 --iters 20 \
                --warmup 3 2>>"$out/sweep.err" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("%.1f/%.0f" % (r["median_ms"]*1e3, r["kv_gbps"]) if r["status"]=="ok" else r["status"])')
          line+=" $s: $r;"
        done
        echo "$line" >>"$out/sweep.log"
      done
      summary+=$'\n'"$(cat "$out/sweep.log")" ;;
    paged)
      # One flashcl-bench JSON line into "median us sSPLITS".
      med() { python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("%.1f us s%s" % (r["median_ms"] * 1e3, r.get("splits")) if r["status"] == "ok" else r["status"])'; }
      for row in "1 32 8 1 4096" "1 32 8 1 32768" "8 32 8 1 8192" "32 32 8 1 4096" "1 32 32 1 131072" "4 32 8 4 16384"; do
        set -- $row
        a="--json --device H200 --dtype f16 --batch $1 --heads $2 --kv-heads $3 --seqlen-q $4 --seqlen $5 --head-dim 128
           --impl flash --layout bnhd --flush 256 --iters 20 --warmup 3"
        # shellcheck disable=SC2086
        echo "paged B=$1 H=$2 Hkv=$3 Q=$4 N=$5: dense $("$b/tools/flashcl-bench" $a 2>>"$out/paged.err" | med)," \
             "paged 16 $("$b/tools/flashcl-bench" $a --paged 16 2>>"$out/paged.err" | med)" >>"$out/paged.log"
      done
      a="--json --device H200 --dtype f16 --varlen 100:8000 --batch 64 --heads 32 --kv-heads 8 --head-dim 128 --causal
         --impl flash --seed 1 --seqlen-q 1 --iters 20 --warmup 3"
      # shellcheck disable=SC2086
      echo "vLLM-shaped decode: dense $("$b/tools/flashcl-bench" $a 2>>"$out/paged.err" | med)," \
           "paged 16 $("$b/tools/flashcl-bench" $a --paged 16 2>>"$out/paged.err" | med)" >>"$out/paged.log"
      summary+=$'\n'"$(cat "$out/paged.log")" ;;
    compare)
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/compare_torch.py --flashcl-bench "$b/tools/flashcl-bench" --device H200 \
        --decode --json "$out/decode.jsonl" >"$out/compare.log" 2>"$out/compare.err"
      summary+=$'\n'"$(cat "$out/compare.log")" ;;
  esac
  summary+=$'\n'"[$step: $(( $(date +%s) - t0 )) s]"
done
echo "$summary"
