#!/bin/bash
# What each score modifier costs: the forward and the backward with none, each alone, and all together, at one
# shape, as a table of median ms and the ratio to the first row (no modifier, unless MODS says otherwise;
# flashcl-bench --json, kernel or event time), with the forward's variant.
# usage: bash bench/modifiers.sh [FLASHCL_BENCH]   (default build/tools/flashcl-bench)
#   DEVICE (flashcl-bench --device; default its own choice), SHAPE (flashcl-bench arguments; default
#   --batch 4 --heads 16 --dtype f16 --head-dim 128 --seqlen 4096 --layout bnhd), IMPL (default flash,backward),
#   ITERS (default 10), MODS ("name=arguments;..." for other rows than the defaults below).
set -uo pipefail
bench=${1:-build/tools/flashcl-bench}
shape=${SHAPE:---batch 4 --heads 16 --dtype f16 --head-dim 128 --seqlen 4096 --layout bnhd}
impl=${IMPL:-flash,backward}
mods=${MODS:-"none=;causal=--causal;window 256=--window 256,0;softcap 30=--softcap 30;alibi=--alibi;sinks=--sinks;\
mask f16=--mask f16;mask f32=--mask f32;all=--window 256,0 --softcap 30 --alibi --sinks --mask f16"}
device=(); [ -n "${DEVICE:-}" ] && device=(--device "$DEVICE")
IFS=';' read -ra rows <<<"$mods"
echo "# flashcl-bench $shape --impl $impl --iters ${ITERS:-10} --warmup 2, $(date -u +%FT%TZ)"
# Each row's JSON lines, tagged with its name, then one table.
for row in "${rows[@]}"; do
  name=${row%%=*} args=${row#*=}
  # shellcheck disable=SC2086 # the arguments are word lists
  "$bench" --json "${device[@]}" $shape $args --impl "$impl" --iters "${ITERS:-10}" --warmup 2 2>/dev/null |
    sed -n "s/^{/{\"row\":\"$name\",/p"
done | python3 -c '
import json, sys
rows, base = {}, {}
for line in sys.stdin:
    r = json.loads(line)
    rows.setdefault(r["row"], []).append(r)
print("| modifiers | " + " | ".join(sys.argv[1].split(",")) + " |")
print("|---|" + "---|" * len(sys.argv[1].split(",")))
for name, results in rows.items():
    cells = []
    for r in results:
        if r.get("status") != "ok":
            cells.append(r.get("status", "failed"))
            continue
        ms = r["median_ms"]
        base.setdefault(r["impl"], ms)
        kernel = " " + r["kernel"] if "kernel" in r else ""
        cells.append("%.3f ms (%.2fx)%s" % (ms, ms / base[r["impl"]], kernel))
    print("| %s | %s |" % (name, " | ".join(cells)))' "$impl"
