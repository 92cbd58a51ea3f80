# Where a short forward's time goes (docs/notes-nvidia.md v26): flashcl and PyTorch's flash backend at the same
# query rows against more and more keys. Time grows with the key tiles a work-group walks; where it grows by
# the same amount for each further 1024 keys, the line through the points, taken back to no keys, is what a
# call costs besides its tiles (the launch, the timing method, each work-group's Q load and O write); where
# the increments differ (compare the times), the line is no such measure. Also a one-tile call (B=1, H=1,
# N=128), the floor of each method.
# usage (GPU machine, repository root): python3 bench/nv_dev/fixed_cost.py build-nv/tools/flashcl-bench [H200]
import os, subprocess, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from compare_torch import parse_flashcl_lines
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

bench = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "H200"


def flashcl_ms(b, h, nq, nk, d, flush):
    cmd = [bench, "--json", "--device", device, "--dtype", "f16", "--batch", str(b), "--heads", str(h),
           "--head-dim", str(d), "--seqlen-q", str(nq), "--seqlen", str(nk), "--impl", "flash", "--iters", "30",
           "--warmup", "5"] + (["--flush", str(flush)] if flush else [])
    rec = parse_flashcl_lines(subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True).stdout).get(
        ("flash", nk))
    return rec["median_ms"] if rec and rec["status"] == "ok" else float("nan")


def torch_ms(b, h, nq, nk, d):
    q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, nk, d, device="cuda", dtype=torch.float16) for _ in range(2))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        run = lambda: F.scaled_dot_product_attention(q, k, v)
        run()
        torch.cuda.synchronize()
        return do_bench(run, return_mode="median")


def fit(xs, ys):
    """Least-squares line: (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


keys = (1024, 2048, 4096)
print("| d | what | " + " | ".join("Nk=%d ms" % n for n in keys) + " | at no keys ms | per 1024 keys ms |")
print("|---|---|" + "---|" * (len(keys) + 2))
for d in (64, 128):
    for name, fn in (("flashcl", lambda nk: flashcl_ms(4, 16, 1024, nk, d, 0)),
                     ("flashcl, --flush 256", lambda nk: flashcl_ms(4, 16, 1024, nk, d, 256)),
                     ("PyTorch flash", lambda nk: torch_ms(4, 16, 1024, nk, d))):
        ts = [fn(n) for n in keys]
        c0, c1 = fit(keys, ts)
        print("| %d | %s | %s | %.4f | %.4f |" % (d, name, " | ".join("%.4f" % t for t in ts), c0, c1 * 1024),
              flush=True)
print("\none tile (B=1, H=1, N=128, d=128): flashcl %.4f ms, with --flush 256 %.4f ms, PyTorch flash %.4f ms"
      % (flashcl_ms(1, 1, 128, 128, 128, 0), flashcl_ms(1, 1, 128, 128, 128, 256), torch_ms(1, 1, 128, 128, 128)))
