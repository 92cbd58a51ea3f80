#!/bin/bash
# What the tensor-core forward's key loop spends on its K/V copies, their waits and its barriers
# (docs/notes-nvidia.md, v23): timing-only copies of the kernels (their results are wrong by construction), each
# timed against the tree through bench/nv_dev/ab.sh's kernel-folder mode:
#   nobar   the two work-group barriers of each key tile dropped (a race);
#   noload  only the ring's first tiles loaded, then read for every key tile (the waits return at once);
#   nowait  the copies issued and the barriers kept, but no wait for the copies to land.
# usage (GPU machine, repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/forward_parts.sh [VARIANT...]
#   ROWS (default bench/nv_dev/ab_rows_forward.txt) and BUDGET (s a variant, default 150) pass to ab.sh.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
k=nvidia/flash_fwd_mma.cl
for v in ${@:-nobar noload nowait}; do
  dir=/tmp/fwd-parts/$v
  rm -rf "$dir" && mkdir -p "$dir" && cp -r cl/. "$dir"
  case $v in
    nobar) sed -i 's#^    barrier(CLK_LOCAL_MEM_FENCE); /\* \(\.\.\. and for all\|for every work-item\)#    /* (nobar) \1#' "$dir/$k" ;;
    noload) sed -i 's|^    if (n_ < 2 \* ntiles)  *\\$|    if (n_ < 2 * ntiles \&\& n_ < STAGES) \\|' "$dir/$k" ;;
    nowait) sed -i 's|^    RING_WAIT(); /\*|    /* (nowait) */ /*|' "$dir/$k" ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  if cmp -s "cl/$k" "$dir/$k"; then echo "$v: the kernel did not change (its source moved on?)"; exit 1; fi
  echo "== $v: $(diff "cl/$k" "$dir/$k" | grep -c '^>') lines changed"
  ROWS=${ROWS:-bench/nv_dev/ab_rows_forward.txt} BUDGET=${BUDGET:-150} bash bench/nv_dev/ab.sh "$dir" bench 2>&1 |
    grep -E '^(--|[A-Z_]+=|built|bench:)'
done
