#!/bin/bash
# A/B of a prepared change on the GPU machine (docs/notes-nvidia.md, v16): the tree as it is (A) against a copy
# of it with PATCH applied (B), each built (Release, -DFLASHCL_WERROR=ON) into its own folder, then the steps
# named, each skipped when too little of the call's 590 s (or BUDGET s) is left; a summary is printed last,
# logs go to $OUT. When the first argument is a folder of kernel sources (a copy of cl/), B is A's build reading
# its kernels from there (FLASHCL_KERNEL_DIR): a kernel-only change needs one build.
# usage (repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/ab.sh PATCH|KERNEL_DIR STEP...
#   bench    the rows of $ROWS (default bench/nv_dev/ab_rows.txt; one flashcl-bench argument list a line, after
#            optional NAME=VALUE settings; # starts a comment) on A and B in turn, two rounds: median ms each,
#            and B's plan when a shape override was asked for ("forced" when it was taken)
#   verbose  -cl-nv-verbose registers and spills of the backward's dK/dV shapes, as B builds them (VERBOSE_CFGS:
#            other shapes, `;`-separated define sets of flash_bwd_mma.cl with their MMA_KIND)
#   tests    on B: test_variant, test_backward (the planner's shapes, then FLASHCL_BACKWARD_SHAPE=4,16,4,32),
#            test_sequences_backward, test_decode, test_sequences, test_forward (TESTS="NAME[@SHAPE] ..." for others)
# Needs an OpenCL device whose name contains H200 (FLASHCL_TEST_DEVICE).
set -uo pipefail
t_start=$(date +%s)
out=${OUT:-/tmp/nv_ab}; mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
change=$(realpath "$1"); shift
kdir=""; [ -d "$change" ] && kdir=$change
rows=${ROWS:-bench/nv_dev/ab_rows.txt}
export FLASHCL_TEST_DEVICE=${FLASHCL_TEST_DEVICE:-H200}
budget=${BUDGET:-590}
left() { echo $(( budget - ($(date +%s) - t_start) )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; date -u; } 2>&1 | tee "$out/device.txt"

# B: the tree without build folders, patched, built into build_b; or, with a kernel folder, A's build reading it
# (b_env), with $bt/cl pointing at the folder for the verbose step.
bt=/tmp/ab-b; rm -rf "$bt"; mkdir -p "$bt"
trees="a b" build_b=/tmp/ab-build-b b_env=()
if [ -n "$kdir" ]; then
  trees=a build_b=/tmp/ab-build-a b_env=("FLASHCL_KERNEL_DIR=$kdir"); ln -s "$kdir" "$bt/cl"
else
  tar --exclude='./build*' --exclude=./.gpu --exclude=./.git -cf - . | tar -xf - -C "$bt"
  (cd "$bt" && python3 bench/nv_dev/apply_patch.py "$change") || { echo "the patch does not apply"; exit 1; }
fi
# `verbose` builds only the kernels (nvbuild); the other steps need the library.
needs_build=0
for step in "$@"; do [ "$step" = verbose ] || needs_build=1; done
for t in $trees; do
  [ $needs_build = 1 ] || break
  src=.; [ $t = b ] && src=$bt
  { cmake -S "$src" -B "/tmp/ab-build-$t" -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON &&
    cmake --build "/tmp/ab-build-$t" -j 16; } >"$out/build-$t.log" 2>&1 || { echo "build $t failed"; tail -20 "$out/build-$t.log"; exit 1; }
done
summary="built $([ $needs_build = 0 ] && echo "nothing (verbose only)" || { [ -n "$kdir" ] && echo "A (B reads $kdir)" || echo "A and B"; }) in $(( $(date +%s) - t_start )) s"

# bench1 TREE LINE: median ms of one row on a tree, and its plan tag.
bench1() {
  local tree=$1; shift
  local envs=() args=()
  for w in $*; do if [[ $w == *=* && ${#args[@]} -eq 0 ]]; then envs+=("$w"); else args+=("$w"); fi; done
  local build=/tmp/ab-build-a; [ "$tree" = b ] && { build=$build_b; envs+=("${b_env[@]}"); }
  env "${envs[@]}" FLASHCL_CACHE_DIR=/tmp/ab-cache-$tree timeout 60 "$build/tools/flashcl-bench" --json \
    --device "$FLASHCL_TEST_DEVICE" "${args[@]}" 2>>"$out/bench.err" | python3 -c '
import json, sys
r = next((json.loads(l) for l in sys.stdin if l.startswith("{")), None)
if not r or r.get("status") != "ok": print("failed"); sys.exit()
if r.get("timer") == "wall": print("wall-clock"); sys.exit()  # no event time: not comparable with the other side
plan = r.get("plan", "")
print("%.4g%s" % (r["median_ms"], " (forced)" if "_SHAPE)" in plan else ""))'
}
for step in "$@"; do
  case $step in
    bench)
      while IFS= read -r line; do
        [[ -z $line || $line == \#* ]] && continue
        [ "$(left)" -lt 30 ] && { summary+=$'\n'"bench: stopped ($(left) s left)"; break; }
        res=""
        for r in 1 2; do res+=" A $(bench1 a $line) B $(bench1 b $line) |"; done
        summary+=$'\n'"$line:$res"
        echo "$line:$res" >>"$out/summary.txt" # kept under $OUT should the call be cut short
      done <"$rows" ;;
    verbose)
      [ "$(left)" -lt 40 ] && { summary+=$'\n'"verbose: skipped ($(left) s left)"; continue; }
      gcc -O2 -Iinclude bench/nv_dev/nvbuild.c -lOpenCL -o /tmp/ab-nvbuild >>"$out/build-b.log" 2>&1 || continue
      # The dK/dV kernel's default shapes (src/plan_nvidia.c's backward_defaults, compute capability 9.0), or VERBOSE_CFGS.
      IFS=';' read -r -a cfgs <<<"${VERBOSE_CFGS:-"-DMMA_KIND=1 -DD=128 -DDP=128 -DDS=136 -DNW=4 -DBN=64 -DKV_RESIDENT=1 -DWARP2D=1;-DMMA_KIND=1 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=128 -DKV_RESIDENT=1;-DMMA_KIND=1 -DD=64 -DDP=64 -DDS=72 -DNW=4 -DBN=64"}"
      for cfg in "${cfgs[@]}"; do
        for mods in "-DWINDOW=0" "-DWINDOW=1 -DVARLEN_Q=1 -DKV=1 -DSEQLENS_K=1" \
                    "-DWINDOW=2 -DSOFTCAP=1 -DALIBI=1 -DMASK=2 -DSINKS=1 -DVARLEN_Q=1 -DKV=1 -DSEQLENS_K=1"; do
          echo "== $cfg $mods" >>"$out/verbose.log"
          (cd "$bt" && /tmp/ab-nvbuild "-cl-nv-verbose -DDTYPE=1 $cfg $mods" cl/common.cl cl/nvidia/ptx.cl \
            cl/nvidia/flash_bwd_mma.cl) 2>&1 | grep -iE "rc=|Used|spill|error" >>"$out/verbose.log"
        done
      done
      summary+=$'\n'"$(grep -E '==|Used|spill|rc=-|error' "$out/verbose.log" | grep -v ' 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads' |
        sed -e 's/-DWINDOW=2 .*/(every modifier)/' -e 's/-DWINDOW=1 .*/(causal, sequences)/')" ;;
    tests)
      for t in ${TESTS:-variant backward backward@4,16,4,32 sequences_backward decode sequences forward}; do
        [ "$(left)" -lt 40 ] && { summary+=$'\n'"test_$t: skipped ($(left) s left)"; continue; }
        name=${t%@*} shape=""; [[ $t == *@* ]] && shape=${t#*@}
        log="$out/test_${name}${shape:+_$shape}.log"
        env "${b_env[@]}" FLASHCL_BACKWARD_SHAPE=$shape FLASHCL_CACHE_DIR=/tmp/ab-cache-b timeout $(( $(left) - 20 )) \
          "$build_b/tests/test_$name" >"$log" 2>&1
        summary+=$'\n'"test_$t (rc $?): $(grep -E 'passed, .* failed' "$log" | tail -1)"
        echo "${summary##*$'\n'}" >>"$out/summary.txt"
        summary+="$(grep -E '^FAIL' "$log" | head -5 | cut -c1-200 | sed 's/^/\n    /')"
      done ;;
    *) summary+=$'\n'"unknown step $step" ;;
  esac
done
echo "$summary"
