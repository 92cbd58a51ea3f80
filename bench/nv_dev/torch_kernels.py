# Which CUDA kernels PyTorch SDPA's backends launch for a row, each one's device time and their sum a call
# (compare_torch.py's profile of 30 calls, each behind a sleep and a 256 MB flush, whose kernels are left out),
# and the call's time between CUDA events around it (compare_torch.py --flush-read's timer, or with `fill`
# do_bench's own).
# usage: python3 bench/nv_dev/torch_kernels.py "B,H,HKV,Q,N[,c];..." [flash,cudnn] [f16|bf16] [D] [bhnd|bnhd]
#   [fill|read] [bwd]
#   c: causal. bnhd (default): tensors [batch, seq, heads, d] as in the decode table; bhnd: [batch, heads, seq, d]
#   as in the forward table. fill: the flush writes (do_bench's) instead of reading. bwd: the backward pass
#   (out.backward(dO), the forward done once outside), as compare_torch.py --backward times it.
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare_torch  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import sdpa_kernel, SDPBackend  # noqa: E402

arg = lambda i, default: sys.argv[i] if len(sys.argv) > i else default  # noqa: E731
rows = [r.split(",") for r in arg(1, "1,32,8,1,32768").split(";")]
names = arg(2, "flash,cudnn").split(",")
dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[arg(3, "f16")]
d = int(arg(4, "128"))
bnhd = arg(5, "bnhd") == "bnhd"
fill = arg(6, "") == "fill"
backward = arg(7, "") == "bwd"
timer = compare_torch.torch_timer(compare_torch.parse_args([] if fill else ["--flush-read"]))
backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def tensor(b, n, h):
    if bnhd:
        t = torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
    else:
        t = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
    return t.requires_grad_(backward)


for row in rows:
    b, h, hkv, nq, n = (int(x) for x in row[:5])
    causal = len(row) > 5 and row[5] == "c"
    q, k, v = tensor(b, nq, h), tensor(b, n, hkv), tensor(b, n, hkv)
    for name in names:
        forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)  # noqa: E731
        with sdpa_kernel(backends[name]):
            try:
                o = forward()
            except RuntimeError as e:
                print("%s %s: %s" % (",".join(row), name, str(e).splitlines()[0]))
                continue
            run, grads = forward, None
            if backward:
                do = torch.randn_like(o)
                run, grads = (lambda: o.backward(do, retain_graph=True)), [q, k, v]  # noqa: E731
            calls = timer.profile_calls(run, grads)
            events_us = timer.bench(run, grads) * 1e3
        per_kernel = {}
        for c in calls:
            for kname, t in c:
                per_kernel.setdefault(kname, []).append(t)
        print("== %s %s: kernels %.1f us a call (median of %d), events %.1f us (median)"
              % (",".join(row), name, statistics.median(sum(t for _, t in c) for c in calls), len(calls), events_us))
        for kname, ts in per_kernel.items():
            print("  %5.2f a call  %8.1f us each (mean)  %s" % (len(ts) / len(calls), sum(ts) / len(ts), kname[:100]))
