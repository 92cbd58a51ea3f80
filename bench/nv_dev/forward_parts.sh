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
#   bwdnodkdv  the dK/dV kernel returns at once: the whole backward less this is that kernel's time.
#   bwdnoexp   the dK/dV kernel's exponentials dropped (unmasked tiles: p = the exponent itself), and
#   bwdnoelem  its whole elementwise step (unmasked tiles: P^T = S^T, dS^T = dP^T as they come out of the
#              products): what overlapping a step's elementwise work with the next step's products could gain
#              there at most (notes v42).
#   bwdbonce   the B operand of every product helper (fcl_mma_abt_step, fcl_mma_ab: the dK/dV kernel's four
#              products and the dQ kernel's dS K) read by ldmatrix once per k step instead of once per 16 columns:
#              what fewer local-memory reads per mma could gain at most.
#   bwdmmaonly bwdnoelem and bwdbonce together: the dK/dV kernel's products alone.
#   bwdbonce_abt, bwdbonce_ab  bwdbonce in fcl_mma_abt_step alone (the dK/dV kernel's S^T and dP^T) or in
#              fcl_mma_ab alone (its dV and dK, and the dQ kernel's dS K);
#   bwdbonce_dq  the same in the dQ kernel's S and dP (K and V read once per k step); bwdnodq: the dQ kernel
#              returns at once.
#   bwdonebb   both kernels' loops without the branch to the mask layer (taken only where a tile reaches a hidden
#              entry: never in rows without a mask or window whose lengths are whole tiles, which stay exact), so
#              that a step's products and elementwise work are one block the compiler may interleave.
# usage (GPU machine, repository root, after `bash .gpu/setup.sh`): bash bench/nv_dev/forward_parts.sh [VARIANT...]
#   PREPARE=1 only writes the copies (/tmp/fwd-parts/VARIANT), for clang's build anywhere (ptx_check.sh).
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
    bwdnodkdv|bwdnodq|bwdnoexp|bwdnoelem|bwdbonce|bwdmmaonly|bwdonebb|bwdbonce_abt|bwdbonce_ab|bwdbonce_dq) k=nvidia/flash_bwd_mma.cl rows=bench/nv_dev/ab_rows_backward.txt
      python3 - "$dir/$k" "$v" <<'PY' || exit 1
import re, sys
path, v = sys.argv[1], sys.argv[2]
src = open(path).read()
def sub(old, new):
    global src
    assert src.count(old) == 1, (v, old)
    src = src.replace(old, new)
if v in ("bwdnodkdv", "bwdnodq"):
    m = re.search(r"void flash_bwd_" + ("dkdv" if v == "bwdnodkdv" else "dq") + r"_mma\(.*?\)\s*\{", src, re.S)
    src = src[:m.end()] + " return;" + src[m.end():]
if v == "bwdnoexp":
    sub("const float p = native_exp2(fma(s[i][e], sl2, -Ls[buf][c]));", "const float p = fma(s[i][e], sl2, -Ls[buf][c]);")
if v in ("bwdnoelem", "bwdmmaonly"):
    sub("          s[i][e] = p;\n          dp[i][e] = p * (dp[i][e] - Dl[buf][c]);\n",
        "          (void)p; /* (noelem) */\n")
if v in ("bwdbonce", "bwdmmaonly", "bwdbonce_abt"):
    sub("#pragma unroll\n  for (int np = 0; np < NT / 2; ++np) {\n    uint b0, b1, b2, b3;\n    LDSM_X4(",
        "  uint b0, b1, b2, b3;\n#pragma unroll\n  for (int np = 0; np < NT / 2; ++np) {\n    if (np == 0) LDSM_X4(")
if v in ("bwdbonce", "bwdmmaonly", "bwdbonce_ab"):
    sub("    for (int np = 0; np < OT / 2; ++np) {\n      uint b0, b1, b2, b3;\n      LDSM_X4_T(",
        "    for (int np = 0; np < OT / 2; ++np) {\n      if (np == 0) LDSM_X4_T(")
    sub("FCL_ALWAYS_INLINE void fcl_mma_ab(float acc[OT][4], uint a[PT][4], uint b_addr) {\n",
        "FCL_ALWAYS_INLINE void fcl_mma_ab(float acc[OT][4], uint a[PT][4], uint b_addr) {\n  uint b0, b1, b2, b3;\n")
if v == "bwdbonce_dq":
    sub("""#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint b0, b1, b2, b3;
        LDSM_X4(b0, b1, b2, b3, TILE_AT(v_n,""", """    uint b0, b1, b2, b3, c0, c1, c2, c3;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        if (np == 0) LDSM_X4(b0, b1, b2, b3, TILE_AT(v_n,""")
    sub("""        LDSM_X4(b0, b1, b2, b3, TILE_AT(k_n, boff + np * 16 * DS + kk * 16));
        MMA(s[2 * np], qa[kk], b0, b1);
        MMA(s[2 * np + 1], qa[kk], b2, b3);""", """        if (np == 0) LDSM_X4(c0, c1, c2, c3, TILE_AT(k_n, boff + np * 16 * DS + kk * 16));
        MMA(s[2 * np], qa[kk], c0, c1);
        MMA(s[2 * np + 1], qa[kk], c2, c3);""")
if v == "bwdonebb":
    sub("    if (SCORE_MODS || fcl_tile_masked(&mods, q0, min(q0 + BN, nq) - 1, k0, BM, nk)) {",
        "    if (SCORE_MODS) { /* (onebb) */")
    sub("    if (fcl_tile_masked(&mods, q0, q_last, kc, BN, nk)) {", "    if (0) { /* (onebb) */")
open(path, "w").write(src)
PY
      ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  if cmp -s "cl/$k" "$dir/$k"; then echo "$v: the kernel did not change (its source moved on?)"; exit 1; fi
  echo "== $v: $(diff "cl/$k" "$dir/$k" | grep -c '^>') lines changed"
  [ -n "${PREPARE:-}" ] && continue # the folders only (a check on this machine: ptx_check.sh DIR/KERNEL)
  ROWS=${ROWS:-$rows} BUDGET=${BUDGET:-150} bash bench/nv_dev/ab.sh "$dir" bench 2>&1 |
    grep -E '^(--|[A-Z_]+=|built|bench:)'
done
