# Which CUDA kernels PyTorch SDPA's backends launch for a decode row, and each one's device time (torch.profiler),
# the cache cleared before each call by a read of 256 MB (as compare_torch.py --flush-read).
# usage: python3 bench/nv_dev/torch_kernels.py "B,H,HKV,Q,N;..." [flash,cudnn]
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity

rows = [tuple(int(x) for x in r.split(",")) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,32,8,1,32768").split(";")]
names = (sys.argv[2] if len(sys.argv) > 2 else "flash,cudnn").split(",")
backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
cache = torch.ones(256 << 18, dtype=torch.float32, device="cuda")  # float: summed without a converted copy
for b, h, hkv, nq, n in rows:
    q = torch.randn(b, nq, h, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    k = torch.randn(b, n, hkv, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(b, n, hkv, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    for name in names:
        run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        with sdpa_kernel(backends[name]):
            try:
                run()
            except RuntimeError as e:
                print("%s %s: %s" % ((b, h, hkv, nq, n), name, str(e).splitlines()[0]))
                continue
            torch.cuda.synchronize()
            reps = 20
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    cache.sum()
                    run()
                torch.cuda.synchronize()
        print("== %s %s" % ((b, h, hkv, nq, n), name))
        for e in prof.key_averages():
            if e.device_type.name != "CUDA" or "reduce" in e.key.lower():
                continue
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
            print("  %6d calls  %8.1f us each  %s" % (e.count, t, e.key[:110]))
