#!/bin/bash
# Shape sweeps of the tensor-core kernels through the development overrides, without rebuilding
# (docs/notes-nvidia.md, v12, v17): FLASHCL_FORWARD_MMA_SHAPE=warps,tiles,keys,qsmem[,stages] for the forward and for
# decode, FLASHCL_BACKWARD_SHAPE=dkdv_warps,dkdv_rows,dq_warps,dq_keys for the backward,
# FLASHCL_PORTABLE_BACKWARD_SHAPE=tr,tc,rm,rn[,tr,tc,rm,rn] for the portable (f32) backward. Each row prints the
# median time and the plan that ran (flashcl-bench's "plan"; "forced" when the override was taken, else the
# default plan's reason: the shape did not fit).
# The step `splits` times the six decode rows at forced split counts instead (FLASHCL_FORWARD_SPLITS; SPLITS
# lists them, "default" the planner's).
# usage (GPU machine, repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/shapes.sh [forward]
#   [f32] [backward] [portable] [decode] [splits] [grid]; the build goes to $BUILD (default build-nv-shapes), logs to $OUT
#   (or /tmp/nv_shapes).
# Set FORWARD_SHAPES, BACKWARD_SHAPES, PORTABLE_SHAPES or DECODE_SHAPES (space-separated; "default" is the
# planner's own; a decode shape SHAPE@N runs at N chunks) to time other shapes than the defaults' neighbours,
# DECODE_ROWS="B,H,HKV,Q,N;..." for other decode rows, BACKWARD_ROWS="D N [FLAGS];..." for other backward rows (B=4, H=16,
# BACKWARD_DTYPE, default f16; FLAGS: flashcl-bench's, --causal say), FORWARD_ROWS="DTYPE,D,N;..." for other forward rows (B=4,
# H=16), DEVICE for another device than the H200, FLUSH_READ=1 to clear the cache before each decode run by reading
# (flashcl-bench --flush-read, docs/notes-nvidia.md v27) rather than by writing.
# The step `grid` times forward rows of any grid (GRID_ROWS="DTYPE,D,B,H,NQ,NK[,causal];...") at GRID_SHAPES_64 or
# GRID_SHAPES_128 (by head_dim; SHAPE@N at N chunks, "default@N" the planner's shape at N chunks), behind --flush 256:
# what a grid of fewer blocks than the device holds at once gets from other shapes (docs/notes-nvidia.md v28).
set -uo pipefail
out=${OUT:-/tmp/nv_shapes}; mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
b=${BUILD:-build-nv-shapes}
device=${DEVICE:-H200} # flashcl-bench --device: an index or a name substring
decode_flush=(--flush 256); [ "${FLUSH_READ:-}" = 1 ] && decode_flush+=(--flush-read)
export FLASHCL_CACHE_DIR=${FLASHCL_CACHE_DIR:-/tmp/fcl-cache-shapes}
{ cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON && cmake --build "$b" -j 16 --target flashcl-bench; } \
  >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null; date -u

# One JSON line of flashcl-bench into "median (unit) [splits] | plan".
show() {
  python3 -c '
import json, sys
unit = sys.argv[1]
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("status") != "ok":
        print("failed: " + r.get("message", "")[:100]); continue
    t = r["median_ms"] * (1000 if unit == "us" else 1)
    plan = r.get("plan", "")
    tag = "forced" if "_SHAPE)" in plan else plan[:90]
    print("%9.3f %s%s %6.1f TFLOP/s %6.0f GB/s | %s" % (t, unit, " s%d" % r["splits"] if "splits" in r else "",
          r["tflops"], r["kv_gbps"], tag))' "$1"
}
# run ENV_NAME SHAPE UNIT ARGS...: one flashcl-bench row with the override set (none for "default").
run() {
  local name=$1 shape=$2 unit=$3; shift 3
  if [ "$shape" = default ]; then timeout 60 "$b/tools/flashcl-bench" --json --device "$device" "$@" 2>>"$out/bench.err" | show "$unit"
  else env "$name=$shape" timeout 60 "$b/tools/flashcl-bench" --json --device "$device" "$@" 2>>"$out/bench.err" | show "$unit"; fi
}

# The decode rows (issue 12's table; DECODE_ROWS="B,H,HKV,Q,N;..." for others).
decode_rows=("1 32 8 1 4096" "1 32 8 1 32768" "8 32 8 1 8192" "32 32 8 1 4096" "1 32 32 1 131072" "4 32 8 4 16384")
if [ -n "${DECODE_ROWS:-}" ]; then IFS=';' read -ra decode_rows <<<"${DECODE_ROWS//,/ }"; fi
grid_rows=("f16 128 1 16 1024 1024" "f16 128 1 16 1024 4096" "f16 128 2 16 1024 4096" "f16 128 4 16 1024 1024"
           "f16 64 1 16 1024 1024" "f16 64 1 16 1024 4096")
if [ -n "${GRID_ROWS:-}" ]; then IFS=';' read -ra grid_rows <<<"${GRID_ROWS//,/ }"; fi
forward_rows=("f16 64 16384" "bf16 64 16384" "f16 64 4096" "f16 128 4096" "f16 128 16384")
if [ -n "${FORWARD_ROWS:-}" ]; then IFS=';' read -ra forward_rows <<<"${FORWARD_ROWS//,/ }"; fi
for step in "$@"; do
  case $step in
    forward)
      for row in "${forward_rows[@]}"; do
        set -- $row
        if [ "$2" = 64 ]; then shapes=${FORWARD_SHAPES:-"default 4,2,64,0 4,2,64,0,3 4,2,64,1,3"}
        else shapes=${FORWARD_SHAPES:-"default 2,2,48,1 4,1,64,0"}; fi
        for causal in "" --causal; do
          for sh in $shapes; do
            echo "forward $1 d=$2 N=$3 ${causal:-not-causal} $sh | $(run FLASHCL_FORWARD_MMA_SHAPE "$sh" ms --batch 4 \
              --heads 16 --dtype "$1" --head-dim "$2" --seqlen "$3" $causal --impl flash --iters 20 --warmup 3)"
          done
        done
      done ;;
    grid)
      for row in "${grid_rows[@]}"; do
        set -- $row
        if [ "$2" -le 64 ]; then shapes=${GRID_SHAPES_64:-"default 4,1,128,0 4,1,64,0 4,2,64,0 8,1,64,0 default@2"}
        else shapes=${GRID_SHAPES_128:-"default 4,1,64,0 4,1,32,0 8,1,32,0 8,1,64,0 2,2,32,1 default@2"}; fi
        for sh in $shapes; do
          sp=; [[ $sh == *@* ]] && sp=${sh#*@}
          echo "grid $row $sh | $(FLASHCL_FORWARD_SPLITS=$sp run FLASHCL_FORWARD_MMA_SHAPE "${sh%@*}" ms --dtype "$1" --head-dim "$2" \
            --batch "$3" --heads "$4" --seqlen-q "$5" --seqlen "$6" ${7:+--causal} --impl flash --flush 256 --iters 30 --warmup 5)"
        done
      done ;;
    f32)
      # The f32 tensor-core forward (3xTF32): F32_SHAPES_64 and F32_SHAPES_128 (Q in local memory frees the 64
      # registers of its fragments at head_dim 128; docs/notes-portable.md v10).
      for d in 64 128; do
        if [ $d = 64 ]; then shapes=${F32_SHAPES_64:-"default 4,1,32,1,2 4,1,64,0,2 8,1,16,0,2"}
        else shapes=${F32_SHAPES_128:-"default 2,1,16,1,2 2,1,16,1,3 3,1,16,1,2 1,1,32,1,2 1,1,16,1,4"}; fi
        for causal in "" --causal; do
          for sh in $shapes; do
            echo "forward f32 d=$d N=4096 ${causal:-not-causal} $sh | $(run FLASHCL_FORWARD_MMA_SHAPE "$sh" ms --batch 4 \
              --heads 16 --dtype f32 --head-dim $d --seqlen 4096 $causal --impl flash --iters 10 --warmup 2)"
          done
        done
      done ;;
    backward)
      IFS=';' read -r -a brows <<<"${BACKWARD_ROWS:-128 4096;64 4096}"
      for row in "${brows[@]}"; do
        set -- $row
        if [ "$1" -gt 64 ]; then shapes=${BACKWARD_SHAPES:-"default 4,16,4,32 2,32,8,32 2,32,2,32"}
        else shapes=${BACKWARD_SHAPES:-"default 4,32,4,64 4,64,8,64 4,64,2,64"}; fi
        for sh in $shapes; do
          echo "backward ${BACKWARD_DTYPE:-f16} d=$1 N=$2 ${*:3} $sh | $(run FLASHCL_BACKWARD_SHAPE "$sh" ms --batch 4 --heads 16 \
            --dtype ${BACKWARD_DTYPE:-f16} --head-dim "$1" --seqlen "$2" --layout bnhd --impl backward --iters 10 --warmup 2 "${@:3}")"
        done
      done ;;
    portable)
      # The portable backward (f32), whose shapes no run has swept: four numbers for both kernels or eight (dK/dV,
      # then dQ) in FLASHCL_PORTABLE_BACKWARD_SHAPE's syntax (tr,tc,rm,rn); only 16 x 16 tiles fit 48 KiB at d = 128
      # (a row prints the plan that ran: the override is not named in it).
      for row in "64 4096" "128 4096"; do
        set -- $row
        if [ "$1" = 64 ]; then shapes=${PORTABLE_SHAPES:-"default 8,8,4,4 16,8,2,4 4,16,8,2 16,16,2,2 8,32,4,1
          8,16,4,2,16,8,4,2 8,16,4,2,8,16,8,1 8,16,4,2,8,8,4,4"}
        else shapes=${PORTABLE_SHAPES:-"default 8,8,2,2 16,8,1,2 4,16,4,1 16,16,1,1 8,4,2,4 4,8,4,2"}; fi
        for sh in $shapes; do
          echo "portable backward f32 d=$1 N=$2 $sh | $(run FLASHCL_PORTABLE_BACKWARD_SHAPE "$sh" ms --batch 4 --heads 16 \
            --dtype f32 --head-dim "$1" --seqlen "$2" --layout bnhd --impl backward --iters 10 --warmup 1)"
        done
      done ;;
    decode)
      for row in "${decode_rows[@]}"; do
        set -- $row
        for sh in ${DECODE_SHAPES:-default 2,1,32,0,3 2,1,32,0,5 1,1,32,0,5 2,1,16,0,8 2,1,64,0 4,1,64,0}; do
          sp=; [[ $sh == *@* ]] && sp=${sh#*@} # SHAPE@N: with FLASHCL_FORWARD_SPLITS=N
          echo "decode $row $sh | $(FLASHCL_FORWARD_SPLITS=$sp run FLASHCL_FORWARD_MMA_SHAPE "${sh%@*}" us --batch "$1" --heads "$2" --kv-heads "$3" \
            --seqlen-q "$4" --seqlen "$5" --dtype f16 --head-dim 128 --impl flash --layout bnhd "${decode_flush[@]}" \
            --iters 20 --warmup 3)"
        done
      done ;;
    splits)
      for row in "${decode_rows[@]}"; do
        set -- $row
        for sp in ${SPLITS:-default 4 8 16 32 64 128}; do
          echo "decode $row splits $sp | $(run FLASHCL_FORWARD_SPLITS "$sp" us --batch "$1" --heads "$2" --kv-heads "$3" \
            --seqlen-q "$4" --seqlen "$5" --dtype f16 --head-dim 128 --impl flash --layout bnhd "${decode_flush[@]}" \
            --iters 20 --warmup 3)"
        done
      done ;;
    *) echo "unknown step $step (forward, f32, backward, portable, decode, splits, grid)"; exit 2 ;;
  esac
done 2>&1 | tee "$out/shapes.log"
