# Which CUDA kernels PyTorch SDPA's backends launch for a row, each one's device time (torch.profiler), their sum,
# and the same call's time between CUDA events around it (as do_bench takes it); the cache cleared before each call
# by a read of 256 MB behind a sleep (as compare_torch.py --flush-read), or with `fill` by a 256 MB zero fill.
# usage: python3 bench/nv_dev/torch_kernels.py "B,H,HKV,Q,N[,c];..." [flash,cudnn] [f16|bf16] [D] [bhnd|bnhd] [fill]
#   c: causal. bnhd (default): tensors [batch, seq, heads, d] as in the decode table; bhnd: [batch, heads, seq, d]
#   as in the forward table.
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity

arg = lambda i, default: sys.argv[i] if len(sys.argv) > i else default
rows = [r.split(",") for r in arg(1, "1,32,8,1,32768").split(";")]
names = arg(2, "flash,cudnn").split(",")
dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[arg(3, "f16")]
d = int(arg(4, "128"))
bnhd = arg(5, "bnhd") == "bnhd"
fill = arg(6, "") == "fill"
backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
cache = torch.ones(256 << 18, dtype=torch.float32, device="cuda")  # float: summed without a converted copy


def flush():
    torch.cuda._sleep(1 << 20)  # the device busy while the host queues the rest
    if fill:
        cache.zero_()
    else:
        cache.sum()


def tensor(b, n, h):
    if bnhd:
        return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
    return torch.randn(b, h, n, d, device="cuda", dtype=dtype)


for row in rows:
    b, h, hkv, nq, n = (int(x) for x in row[:5])
    causal = len(row) > 5 and row[5] == "c"
    q, k, v = tensor(b, nq, h), tensor(b, n, hkv), tensor(b, n, hkv)
    for name in names:
        run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)
        with sdpa_kernel(backends[name]):
            try:
                run()
            except RuntimeError as e:
                print("%s %s: %s" % (row, name, str(e).splitlines()[0]))
                continue
            torch.cuda.synchronize()
            reps = 30
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                flush()
                starts[i].record()
                run()
                ends[i].record()
            torch.cuda.synchronize()
            events = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))[reps // 2]
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    flush()
                    run()
                torch.cuda.synchronize()
        total, lines = 0.0, []
        for e in prof.key_averages():
            key = e.key.lower()
            if e.device_type.name != "CUDA" or "reduce" in key or "sleep" in key or "fill" in key or "elementwise" in key:
                continue
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
            total += t * e.count / reps
            lines.append("  %6d calls  %8.1f us each  %s" % (e.count, t, e.key[:100]))
        print("== %s %s: kernels %.1f us a call (mean), events %.1f us (median)" % (",".join(row), name, total, events))
        print("\n".join(lines))
