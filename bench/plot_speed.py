#!/usr/bin/env python3
"""Speed plots from bench/compare_torch.py's --json rows: TFLOP/s against sequence length, one line per
implementation (flashcl and each PyTorch SDPA backend), one panel per (dtype, head_dim, causal), as
FlashAttention's README shows them.

Usage:
  python3 bench/compare_torch.py ... --json fwd.jsonl            # on the GPU machine
  python3 bench/plot_speed.py fwd.jsonl --title "H200, forward" --out docs/speed-forward.png
  python3 bench/plot_speed.py --self-test                         # the series code; needs no matplotlib

The FLOP count is compare_torch.py's (forward 4·B·H·N²·d, backward 10·B·H·N²·d, halved when causal), so the
lines compare by time. A row whose entry is not a time (n/a, oom, skipped) leaves a gap. Drawing needs
matplotlib (present on the GPU machine); reading and the self-test do not.
"""
import argparse
import json
import sys

from compare_torch import TORCH_VARIANTS, flops

LINES = ["flashcl"] + TORCH_VARIANTS


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip().startswith("{")]
    return rows


def series(rows):
    """{(dtype, d, causal): {line: [(n, TFLOP/s), ...] sorted by n}}; entries that are not times are left out."""
    panels = {}
    for r in rows:
        key = (r["dtype"], r["d"], bool(r["causal"]))
        panel = panels.setdefault(key, {})
        for name in LINES:
            ms = r.get(name)
            if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
                f = flops(r["batch"], r["heads"], r["n"], r["d"], r["causal"], r.get("backward", False))
                panel.setdefault(name, []).append((r["n"], f / (ms * 1e-3) / 1e12))
    for panel in panels.values():
        for name in panel:
            panel[name].sort()
    return panels


def draw(panels, title, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(panels)
    cols = min(4, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        dtype, d, causal = key
        for name in LINES:
            pts = panels[key].get(name)
            if pts:
                ax.plot([n for n, _ in pts], [t for _, t in pts], marker="o", label=name,
                        linewidth=2.5 if name == "flashcl" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title("%s, head_dim %d, %s" % (dtype, d, "causal" if causal else "not causal"), fontsize=10)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def self_test():
    rows = [
        {"dtype": "f16", "d": 64, "causal": False, "n": 2048, "batch": 1, "heads": 1, "flashcl": 1.0, "flash": 2.0,
         "efficient": "n/a", "cudnn": "oom", "math": "skipped", "naive": 4.0},
        {"dtype": "f16", "d": 64, "causal": False, "n": 1024, "batch": 1, "heads": 1, "flashcl": 0.5, "flash": "n/a"},
        {"dtype": "f16", "d": 64, "causal": True, "n": 1024, "batch": 1, "heads": 1, "flashcl": 0.5, "backward": True},
    ]
    p = series(rows)
    fails = 0
    for ok, what in [
        (sorted(p) == [("f16", 64, False), ("f16", 64, True)], "one panel per (dtype, d, causal)"),
        ([n for n, _ in p[("f16", 64, False)]["flashcl"]] == [1024, 2048], "points sorted by N"),
        (abs(p[("f16", 64, False)]["flashcl"][1][1] - 4 * 2048 * 2048 * 64 / 1e-3 / 1e12) < 1e-9, "forward FLOPs"),
        (abs(p[("f16", 64, True)]["flashcl"][0][1] - 5 * 1024 * 1024 * 64 / 0.5e-3 / 1e12) < 1e-9,
         "backward causal FLOPs"),
        ("efficient" not in p[("f16", 64, False)] and "cudnn" not in p[("f16", 64, False)], "non-times left out"),
        ([n for n, _ in p[("f16", 64, False)]["flash"]] == [2048], "a gap where a backend did not run"),
    ]:
        print(("ok   " if ok else "FAIL ") + what)
        fails += not ok
    print("plot_speed self-test: %d failed" % fails)
    return 1 if fails else 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="*", help="compare_torch.py --json files")
    p.add_argument("--out", default="speed.png", help="the PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test()
    if not a.json:
        p.error("give at least one --json file of compare_torch.py")
    draw(series(read_rows(a.json)), a.title, a.out)
    print("wrote " + a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
