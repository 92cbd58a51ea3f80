# Where a short forward's time goes (docs/notes-nvidia.md v26, v27): flashcl and PyTorch's flash backend at 1024
# query rows against more and more keys, at several grid sizes. Time grows with the key tiles a work-group walks;
# where it grows by the same amount for each further 1024 keys, the line through the points, taken back to no
# keys, is what a call costs besides its tiles (each work-group's Q load and O write, the last wave's tail);
# where the increments differ (compare the times), the line is no such measure. Grids: B x H heads of 1024 rows
# are B*H*8 blocks of 128 rows (both sides' block at head_dim 64 and 128); the H200 holds 264 such work-groups at
# once (two a unit), so 4 x 16 runs in two waves, 2 x 16 in one and 1 x 16 in half of one.
# Both sides are timed by their kernels' device time (flashcl-bench's one kernel by its own events, PyTorch by
# compare_torch.py --kernel-time), each call behind a 256 MB write; --events times PyTorch by do_bench instead.
# usage (GPU machine, repository root): python3 bench/nv_dev/fixed_cost.py build-nv/tools/flashcl-bench [H200]
#   [--events] [--keys 256,512,1024,2048,4096] [--grids 4x16,2x16,1x16] [--head-dim 128]
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare_torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("bench")
p.add_argument("device", nargs="?", default="H200")
p.add_argument("--events", action="store_true", help="PyTorch by do_bench's events around the call")
p.add_argument("--keys", type=compare_torch.int_list, default=[256, 512, 1024, 2048, 4096])
p.add_argument("--grids", default="4x16,2x16,1x16", help="BxH,...")
p.add_argument("--head-dim", type=compare_torch.int_list, default=[128])
a = p.parse_args()
grids = [tuple(int(x) for x in g.split("x")) for g in a.grids.split(",")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

timer = compare_torch.torch_timer(compare_torch.parse_args([] if a.events else ["--kernel-time"]))


def flashcl_ms(b, h, nq, nk, d):
    return compare_torch.flashcl_forward_ms(a.bench, a.device, b, h, nq, nk, d)


def torch_ms(b, h, nq, nk, d):
    q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, nk, d, device="cuda", dtype=torch.float16) for _ in range(2))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        run = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        run()
        torch.cuda.synchronize()
        return timer.bench(run)


def fit(xs, ys):
    """Least-squares line: (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


print("PyTorch timed by %s; both sides behind a 256 MB write" % ("events (do_bench)" if a.events else "kernel time"))
print("| d | B x H (blocks) | what | " + " | ".join("Nk=%d" % n for n in a.keys) + " | at no keys ms | per 1024 keys ms |")
print("|---|---|---|" + "---|" * (len(a.keys) + 2))
for d in a.head_dim:
    for b, h in grids:
        times = {}
        for name, fn in (("flashcl ms", flashcl_ms), ("FA2 ms", torch_ms)):
            ts = times[name] = [fn(b, h, 1024, nk, d) for nk in a.keys]
            c0, c1 = fit(a.keys, ts)
            print("| %d | %d x %d (%d) | %s | %s | %.4f | %.4f |" % (d, b, h, b * h * 8, name,
                  " | ".join("%.4f" % t for t in ts), c0, c1 * 1024), flush=True)
        print("| %d | %d x %d (%d) | flashcl / FA2 | %s | | |" % (d, b, h, b * h * 8, " | ".join(
            "%.3f" % (x / y) for x, y in zip(times["flashcl ms"], times["FA2 ms"]))), flush=True)
