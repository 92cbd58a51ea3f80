#!/bin/bash
# Every define combination fcl_plan_nvidia_backward can emit for cl/nvidia/flash_bwd_mma.cl, through
# bench/nv_dev/ptx_check.sh (clang 15 -> PTX -> ptxas -arch=sm_90 -v; no GPU needed): f32/f16/bf16 x head_dim
# 40/64/96/128 x both kernels with the planner's shapes for that head_dim (within 48 KiB, and beyond it where two
# work-groups fit a multiprocessor: f32 32-row steps and 32-key tiles, f16/bf16 K and V resident with 64-row steps
# and 64-key tiles, at head_dim 64 and below with 128-row steps) x no modifier / causal / window+softcap+ALiBi+f16
# mask+sinks x dense / packed sequences (VARLEN_Q, KV 1, SEQLENS_K).
# usage: [DTYPES="0 1 2"] [KERNEL=path/flash_bwd_mma.cl] bash bench/nv_dev/ptx_check_bwd.sh [OUT_DIR]   (one line a build; a FAIL count last; exit 1 on a FAIL)
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/ptx_check_bwd}; mkdir -p "$out"
fails=0 n=0
for dt in ${DTYPES:-0 1 2}; do
  for d in 40 64 96 128; do
    if [ "$dt" = 0 ]; then
      dp=$(( (d + 7) / 8 * 8 )); ds=$(( dp + 4 ))
      if [ "$d" -le 64 ]; then shapes=("1 4 32" "2 4 32"); else shapes=("1 4 16" "2 4 16" "1 4 32" "2 4 32"); fi
    else
      dp=$(( (d + 15) / 16 * 16 )); ds=$(( dp + 8 ))
      if [ "$d" -le 64 ]; then shapes=("1 4 64" "2 4 64" "1 4 128 -DKV_RESIDENT=1")
      else shapes=("1 4 32" "2 4 32" "1 4 64 -DKV_RESIDENT=1" "2 4 64"); fi
    fi
    for sh in "${shapes[@]}"; do
      set -- $sh
      for mods in "-DWINDOW=0" "-DWINDOW=1" "-DWINDOW=2 -DSOFTCAP=1 -DALIBI=1 -DMASK=2 -DSINKS=1"; do
        for seqs in "" "-DVARLEN_Q=1 -DKV=1 -DSEQLENS_K=1"; do
          defs="-DMMA_KIND=$1 -DDTYPE=$dt -DD=$d -DDP=$dp -DDS=$ds -DNW=$2 -DBN=$3 ${4:+$4 }$mods $seqs"
          n=$((n + 1))
          bash "$dir/ptx_check.sh" "${KERNEL:-cl/nvidia/flash_bwd_mma.cl}" "$defs" "$out/k$n" || fails=$((fails + 1))
        done
      done
    done
  done
done
echo "$n builds, $fails failed"
[ "$fails" -eq 0 ]
