# PyTorch SDPA (flash and cuDNN backends) on the same rows as nvbench: B=4, H=16, median of 10 after 3 warm-ups, CUDA events.
import torch, sys
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
print("torch", torch.__version__, torch.cuda.get_device_name(0))
print("%-5s %4s %6s %6s %9s %9s %9s %9s" % ("dtype", "d", "N", "causal", "flash_ms", "flash_TF", "cudnn_ms", "cudnn_TF"))
def bench(fn, iters=10):
    for _ in range(3): fn()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]
for dt in (torch.float16, torch.bfloat16):
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (0, 1):
                q, k, v = (torch.rand(4, 16, n, d, device="cuda", dtype=dt) * 2 - 1 for _ in range(3))
                fl = 4.0 * 4 * 16 * n * n * d / (2 if causal else 1)
                res = []
                for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    try:
                        with sdpa_kernel([be]):
                            ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
                        res += [ms, fl / ms * 1e-9]
                    except Exception as e:
                        res += [float("nan"), float("nan")]
                print("%-5s %4d %6d %6d %9.3f %9.1f %9.3f %9.1f" % ("f16" if dt == torch.float16 else "bf16", d, n, causal, *res), flush=True)
                del q, k, v
