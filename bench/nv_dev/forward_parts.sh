#!/bin/bash
# What the tensor-core forward's key loop spends on its K/V copies and the waits of its ring (docs/notes-nvidia.md,
# v23, v24): timing-only copies of the kernels (their results are wrong by construction), each timed against the
# tree through bench/nv_dev/ab.sh's kernel-folder mode. The ring on mbarriers (compute capability 9.0, v24):
#   nowait     no wait for a tile's copies to land (the "full" mbarriers; the copies are still issued);
#   norelease  no wait for every warp's release of a buffer before copying into it (a race);
#   noload     only the ring's first tiles loaded, then read for every key tile (no waits after them);
#   noout      O's global write skipped (behind a test the compiler cannot decide; v26: 1.4 us of 1024 x 1024
#              at head_dim 128, ROWS=bench/nv_dev/ab_rows_fixed.txt).
#   notiles    no key tile at all: a work-group loads Q, writes O and ends (what each work-group pays once, with
#              the launch; behind a test the compiler cannot decide, so registers and local memory, and with them
#              the work-groups a unit holds, stay the kernel's; v29, for ROWS=bench/nv_dev/ab_rows_fixed.txt);
#   onetile    the first key tile only: against notiles, one tile with its ring's start.
# And for the tensor-core backward (its rows from bench/nv_dev/ab_rows_backward.txt unless ROWS is set):
#   bwdnobar   the one work-group barrier a step of the dK/dV and dQ kernels' loops dropped (a race): what a
#              ring on mbarriers could gain there at most.
# usage (GPU machine, repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/forward_parts.sh [VARIANT...]
#   ROWS (default bench/nv_dev/ab_rows_forward.txt, for bwdnobar ab_rows_backward.txt) and BUDGET (s a variant,
#   default 150) pass to ab.sh. v23's variants of the ring on work-group barriers (before 9.0, and paged keys) are
#   in this file's history (e7e3630).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
for v in ${@:-nowait norelease noload}; do
  dir=/tmp/fwd-parts/$v
  rm -rf "$dir" && mkdir -p "$dir" && cp -r cl/. "$dir"
  k=nvidia/flash_fwd_mma.cl rows=bench/nv_dev/ab_rows_forward.txt
  case $v in
    nowait) sed -i 's|^#define RING_WAIT_TILE(n) MBAR_WAIT.*|#define RING_WAIT_TILE(n) /* (nowait) */|' "$dir/$k" ;;
    norelease) sed -i 's|^      if (n_ >= STAGES) MBAR_WAIT(RING_BAR(1, n_).*|      /* (norelease) */ \\|' "$dir/$k" ;;
    noload) sed -i -e 's|^    if (n_ < 2 \* ntiles) {  *\\$|    if (n_ < 2 * ntiles \&\& n_ < STAGES) { \\|' \
                   -e 's|^#define RING_WAIT_TILE(n) MBAR_WAIT(\(.*\))$|#define RING_WAIT_TILE(n) if ((n) < STAGES) MBAR_WAIT(\1)|' "$dir/$k" ;;
    noout) sed -i 's|^    if (c < BR \* CH \&\& row < nrows \&\& cc \* EPC < D)$|    if (c < BR * CH \&\& row < nrows \&\& cc * EPC < D \&\& nk_max < 0) /* (noout) */|' \
             "$dir/$k" ;;
    notiles|onetile) cap=0; [ $v = onetile ] && cap=1
      sed -i "s|^  const int ntiles = kv_end > kv_begin ? (kv_end - kv_begin + BC - 1) / BC : 0;\$|  const int ntiles = kv_end > kv_begin ? min((kv_end - kv_begin + BC - 1) / BC, nk_max < 0 ? 1 << 30 : $cap) : 0; /* ($v) */|" \
        "$dir/$k" ;;
    bwdnobar) k=nvidia/flash_bwd_mma.cl rows=bench/nv_dev/ab_rows_backward.txt
      sed -i 's#^    barrier(CLK_LOCAL_MEM_FENCE); /\* \.\.\. and for all#    /* (nobar) ... and for all#' "$dir/$k" ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  if cmp -s "cl/$k" "$dir/$k"; then echo "$v: the kernel did not change (its source moved on?)"; exit 1; fi
  echo "== $v: $(diff "cl/$k" "$dir/$k" | grep -c '^>') lines changed"
  ROWS=${ROWS:-$rows} BUDGET=${BUDGET:-150} bash bench/nv_dev/ab.sh "$dir" bench 2>&1 |
    grep -E '^(--|[A-Z_]+=|built|bench:)'
done
