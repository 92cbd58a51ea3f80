#!/usr/bin/env python3
"""flashcl against PyTorch on the same GPU, in one command and one table.

For every (dtype, head_dim, causal, N) it runs
  * flashcl: tools/flashcl-bench --json (OpenCL profiling events, median of --iters runs), and
  * PyTorch: torch.nn.functional.scaled_dot_product_attention restricted to each backend in turn
    (flash, efficient, cudnn, math) and a naive materialized version (softmax(Q K^T * scale) V with
    explicit matmuls, softmax in float32), each timed with triton.testing.do_bench(return_mode="median"),
on tensors of shape [B, H, N, d] (contiguous, as flashcl's default layout), and prints one side-by-side
table with the time ratio flashcl / PyTorch-flash per row (above 1: flashcl is slower) and the ratio to
the fastest PyTorch variant. Before each timed run do_bench clears the L2 cache by writing 256 MB, which
also keeps the GPU busy up to the launch; flashcl-bench does the same with --flush 256 (the default of
--flush here; --flush 0 times flashcl without it). That write leaves the cache full of dirty lines, which
the timed call then pays to write back to memory as it reads; --flush-read clears it by reading instead, on
both sides (flashcl-bench --flush-read; PyTorch with do_bench's repetition rule and events, each call behind
a sleep kernel, which keeps the device busy while the host queues the rest, and a sum over --flush MiB in
place of do_bench's zero fill), which matters only to calls that are bound by memory, such as decode.
flashcl-bench times a call of one kernel by that kernel's own start and end, and PyTorch's time between CUDA
events around the call includes its launch (about 2-4 µs on the H200, which weighs on calls of under 0.2 ms);
--kernel-time times PyTorch by the summed device time of the kernels each call launches (torch.profiler;
the median of 30 calls, each behind a sleep and a --flush MiB zero fill, or sum with --flush-read), which is
like for like with flashcl's one-kernel calls.
(flashcl's calls of several kernels, split-KV decode and the backward, are timed from the end of a gate
command to the end of their last kernel, which includes their launches and the gaps between them.)
A backend that does not take a shape or dtype (e.g. flash with float32) shows "n/a"; one that runs out of
memory shows "oom".

--backward times the backward pass instead: flashcl-bench --impl backward against
out.backward(dO) of each PyTorch variant (forward done once outside the timed region).

--decode times decode-shaped forwards instead (few query rows against a long KV cache; issue 12): by
default the six rows (batch, heads, kv heads, seqlen_q, seqlen_k) = (1,32,8,1,4096), (1,32,8,1,32768),
(8,32,8,1,8192), (32,32,8,1,4096), (1,32,32,1,131072), (4,32,8,4,16384), f16, d=128, not causal, every
tensor laid out [batch, seq, heads, d] (--decode-rows "B,H,HKV,Q,N;..." for others; --decode-layout bhnd lays
every tensor out [batch, heads, seq, d] instead, on both sides). flashcl runs through
flashcl-bench --layout bnhd --flush 256 (a 256 MiB fill before each run, outside its time, so K and V are
not read from the L2 cache a previous run left them in, as do_bench does for PyTorch) --from-gate (every
row timed from the gate, its launch included, whether or not the call splits; before 2026-12-04 16:22 UTC
an unsplit call was timed by its kernel alone); PyTorch runs SDPA
with each of the flash, efficient and cuDNN backends (enable_gqa=True; a backend that refuses GQA gets K
and V expanded to every query head before timing, marked "*"). The table gives flashcl's µs, PyTorch's
best µs and backend, their ratio, and flashcl's K+V read bandwidth (the K and V bytes over its time).

Usage (on the GPU machine, from the repository root after building into build/):
  python3 bench/compare_torch.py --flashcl-bench build/tools/flashcl-bench \\
      --seqlen 1024,2048,4096,8192,16384 --head-dim 64,128 --causal both --dtype f16,bf16
  python3 bench/compare_torch.py --flashcl-bench build/tools/flashcl-bench --decode
  python3 bench/compare_torch.py --self-test     # argument parsing and table code; needs no torch
  python3 bench/compare_torch.py --dry-run ...   # prints what would run; needs no torch
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

TORCH_VARIANTS = ["flash", "efficient", "cudnn", "math", "naive"]
DECODE_VARIANTS = ["flash", "efficient", "cudnn"]
DECODE_ROWS = [(1, 32, 8, 1, 4096), (1, 32, 8, 1, 32768), (8, 32, 8, 1, 8192), (32, 32, 8, 1, 4096),
               (1, 32, 32, 1, 131072), (4, 32, 8, 4, 16384)]
DTYPES = ["f32", "f16", "bf16"]


class KernelTimingError(Exception):
    """--kernel-time could not tell a call's kernels apart (not a RuntimeError, so it is not taken for "n/a")."""


# ---------------------------------------------------------------------------------------------------
# Arguments


def int_list(text):
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        v = int(part)
        if v < 1:
            raise argparse.ArgumentTypeError("%r: values must be at least 1" % text)
        values.append(v)
    if not values:
        raise argparse.ArgumentTypeError("%r: no values" % text)
    return values


def dtype_list(text):
    values = [p.strip() for p in text.split(",") if p.strip()]
    for v in values:
        if v not in DTYPES:
            raise argparse.ArgumentTypeError("%r: dtypes are %s" % (v, ", ".join(DTYPES)))
    if not values:
        raise argparse.ArgumentTypeError("no dtype given")
    return values


def causal_list(text):
    table = {"both": [False, True], "yes": [True], "no": [False], "1": [True], "0": [False]}
    if text not in table:
        raise argparse.ArgumentTypeError("--causal takes both, yes or no")
    return table[text]


def decode_rows(text):
    rows = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        vals = [int(x) for x in part.split(",")]
        if len(vals) != 5 or min(vals) < 1 or vals[1] % vals[2]:
            raise argparse.ArgumentTypeError("%r: expected B,H,HKV,Q,N with HKV dividing H" % part)
        rows.append(tuple(vals))
    if not rows:
        raise argparse.ArgumentTypeError("no decode rows")
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flashcl-bench", default="build/tools/flashcl-bench", help="path of the flashcl-bench binary")
    p.add_argument("--device", default=None, help="flashcl-bench --device (index or name substring)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=0, help="0: = heads")
    p.add_argument("--seqlen", type=int_list, default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dim", type=int_list, default=None, help="default 64,128 (--decode: 128)")
    p.add_argument("--causal", type=causal_list, default=[False, True], metavar="both|yes|no")
    p.add_argument("--dtype", type=dtype_list, default=None, help="default f16,bf16 (--decode: f16)")
    p.add_argument("--iters", type=int, default=20, help="flashcl-bench timed runs (at least 10)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backward", action="store_true", help="time the backward pass")
    p.add_argument("--decode", action="store_true", help="time the decode rows (see above)")
    p.add_argument("--decode-rows", type=decode_rows, default=DECODE_ROWS, metavar="B,H,HKV,Q,N;...")
    p.add_argument("--decode-layout", choices=["bnhd", "bhnd"], default="bnhd",
                   help="--decode: every tensor [batch, seq, heads, d] (bnhd) or [batch, heads, seq, d] (bhnd)")
    p.add_argument("--flush", type=int, default=256,
                   help="flashcl-bench --flush MiB (0: none): a fill before each flashcl run, as do_bench clears "
                        "the L2 cache before each PyTorch run (with --flush-read or --kernel-time, also the size "
                        "of PyTorch's own flush)")
    p.add_argument("--flush-read", action="store_true",
                   help="clear the cache by reading, not writing, on both sides (see above)")
    p.add_argument("--kernel-time", action="store_true",
                   help="time PyTorch by its kernels' device time, not by events around the call (see above)")
    p.add_argument("--with-reference", action="store_true", help="also time flashcl's CLBlast reference path")
    p.add_argument("--skip", type=lambda t: [x for x in t.split(",") if x], default=[],
                   help="PyTorch variants not to time (comma separated, from %s); shown as 'skipped'"
                   % ",".join(TORCH_VARIANTS))
    p.add_argument("--json", default=None, help="also write every row as JSON lines to this file")
    p.add_argument("--dry-run", action="store_true", help="print the flashcl-bench commands and shapes; no torch")
    p.add_argument("--self-test", action="store_true", help="test argument parsing and the table; no torch")
    a = p.parse_args(argv)
    if a.head_dim is None:
        a.head_dim = [128] if a.decode else [64, 128]
    if a.dtype is None:
        a.dtype = ["f16"] if a.decode else ["f16", "bf16"]
    if a.decode and a.backward:
        p.error("--decode times the forward; leave out --backward")
    if a.iters < 10:
        p.error("--iters must be at least 10")
    if a.flush < 0:
        p.error("--flush must be 0 (none) or a positive MiB count")
    if a.flush_read and not a.flush:
        p.error("--flush-read needs a --flush size")
    if a.kernel_time and not a.flush:
        p.error("--kernel-time needs a --flush size")
    if a.kv_heads and a.heads % a.kv_heads:
        p.error("--kv-heads must divide --heads")
    for v in a.skip:
        if v not in TORCH_VARIANTS:
            p.error("--skip: unknown variant %r" % v)
    return a


def flush_args(a):
    """flashcl-bench's flush options as a's say."""
    return ["--flush", str(a.flush)] + (["--flush-read"] if a.flush_read else []) if a.flush else []


def flashcl_command(a, dtype, head_dim, causal):
    impl = "backward" if a.backward else "flash"
    if a.with_reference and not a.backward:
        impl += ",reference"
    cmd = [a.flashcl_bench, "--json", "--dtype", dtype, "--batch", str(a.batch), "--heads", str(a.heads),
           "--head-dim", str(head_dim), "--seqlen", ",".join(str(n) for n in a.seqlen), "--impl", impl,
           "--iters", str(a.iters), "--warmup", str(a.warmup)]
    if a.kv_heads:
        cmd += ["--kv-heads", str(a.kv_heads)]
    cmd += flush_args(a)
    if causal:
        cmd.append("--causal")
    if a.device is not None:
        cmd += ["--device", str(a.device)]
    return cmd


def decode_command(a, dtype, head_dim, row):
    b, h, hkv, nq, n = row
    cmd = [a.flashcl_bench, "--json", "--dtype", dtype, "--batch", str(b), "--heads", str(h), "--kv-heads", str(hkv),
           "--head-dim", str(head_dim), "--seqlen-q", str(nq), "--seqlen", str(n), "--impl", "flash", "--layout",
           a.decode_layout, "--iters", str(a.iters), "--warmup", str(a.warmup), "--from-gate"]
    cmd += flush_args(a)
    if a.device is not None:
        cmd += ["--device", str(a.device)]
    return cmd


def render_decode_table(rows):
    """rows: dicts with dtype, d, row (B, H, HKV, Q, N), flashcl_us (float | str), kv_gbps, and per
    DECODE_VARIANTS entry µs (float | str; a string ending in '*' marks K and V expanded for that backend)."""
    head = ["dtype", "d", "B,H,HKV,Q,N", "flashcl_us"] + [v + "_us" for v in DECODE_VARIANTS] + \
        ["torch_best_us", "best", "flashcl/best", "flashcl_KV_GB/s"]
    lines = []
    for r in rows:
        def num(x):
            return x if isinstance(x, (int, float)) else None
        timed = [(num(r.get(v)), v) for v in DECODE_VARIANTS if num(r.get(v)) is not None]
        best = min(timed) if timed else (None, "-")
        cells = [r["dtype"], str(r["d"]), ",".join(str(x) for x in r["row"]), fmt_us(r["flashcl_us"])]
        cells += [fmt_us(r.get(v)) + ("*" if r.get(v + "_expanded") else "") for v in DECODE_VARIANTS]
        cells += [fmt_us(best[0]), best[1]]
        rb = ratio(r["flashcl_us"], best[0])
        cells.append("%.2f" % rb if rb is not None else "n/a")
        cells.append("%.0f" % r["kv_gbps"] if isinstance(r.get("kv_gbps"), (int, float)) else "-")
        lines.append(cells)
    widths = [max(len(head[i]), *(len(l[i]) for l in lines)) if lines else len(head[i]) for i in range(len(head))]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


def fmt_us(v):
    if isinstance(v, str):
        return v
    if v is None:
        return "-"
    return "%.1f" % v


def parse_flashcl_lines(text):
    """{(impl, seqlen): record} from flashcl-bench --json output (other lines are ignored)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        out[(rec["impl"], int(rec["seqlen"]))] = rec
    return out


# ---------------------------------------------------------------------------------------------------
# FLOPs and the table


def flashcl_forward_ms(bench, device, b, h, nq, nk, d, env=None):
    """Median ms of one f16 flashcl-bench forward row (B x H heads, nq query rows, nk keys, head_dim d, behind a
    256 MB write; env: extra environment), NaN where it did not run."""
    cmd = [bench, "--json", "--device", device, "--dtype", "f16", "--batch", str(b), "--heads", str(h),
           "--head-dim", str(d), "--seqlen-q", str(nq), "--seqlen", str(nk), "--impl", "flash", "--iters", "30",
           "--warmup", "5", "--flush", "256"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True,
                         env=dict(os.environ, **(env or {}))).stdout
    rec = parse_flashcl_lines(out).get(("flash", nk))
    return rec["median_ms"] if rec and rec["status"] == "ok" else float("nan")


def flops(batch, heads, n, d, causal, backward):
    f = (10.0 if backward else 4.0) * batch * heads * n * n * d
    return f / 2 if causal else f


def fmt_ms(v):
    if isinstance(v, str):
        return v
    if v is None:
        return "-"
    return "%.3f" % v if v < 100 else "%.1f" % v


def ratio(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return a / b
    return None


def render_table(rows, backward):
    """rows: dicts with dtype, d, causal, n, flashcl (ms | str), reference (ms | str | None), and one
    entry per TORCH_VARIANTS (ms or a string such as "n/a"/"oom"), plus batch, heads."""
    with_ref = any(r.get("reference") is not None for r in rows)
    head = ["dtype", "d", "causal", "N", "flashcl_ms"]
    if with_ref:
        head.append("fcl_ref_ms")
    head += [v + "_ms" for v in TORCH_VARIANTS]
    head += ["flashcl/flash", "flashcl/best", "flashcl_TFLOP/s"]
    lines = []
    for r in rows:
        cells = [r["dtype"], str(r["d"]), "yes" if r["causal"] else "no", str(r["n"]), fmt_ms(r["flashcl"])]
        if with_ref:
            cells.append(fmt_ms(r.get("reference")))
        cells += [fmt_ms(r.get(v)) for v in TORCH_VARIANTS]
        rf = ratio(r["flashcl"], r.get("flash"))
        numeric = [r.get(v) for v in TORCH_VARIANTS if isinstance(r.get(v), (int, float))]
        rb = ratio(r["flashcl"], min(numeric)) if numeric else None
        cells.append("%.2f" % rf if rf is not None else "n/a")
        cells.append("%.2f" % rb if rb is not None else "n/a")
        if isinstance(r["flashcl"], (int, float)) and r["flashcl"] > 0:
            tf = flops(r["batch"], r["heads"], r["n"], r["d"], r["causal"], backward) / (r["flashcl"] * 1e-3) / 1e12
            cells.append("%.1f" % tf)
        else:
            cells.append("-")
        lines.append(cells)
    widths = [max(len(head[i]), *(len(l[i]) for l in lines)) if lines else len(head[i]) for i in range(len(head))]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------
# PyTorch side (imported only when measuring)


def torch_timer(a):
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                    "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None), "math": SDPBackend.MATH}
    except ImportError:  # older PyTorch
        sdpa_kernel, backends = None, {}

    tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

    cache = []  # the flush buffer, made at first use

    def flush():
        """Clears the cache before a timed call as the options say: a.flush MiB read (--flush-read) or written."""
        if not cache:
            cache.append(torch.ones(a.flush << 18, dtype=torch.float32, device="cuda"))  # float: no converted copy
        if a.flush_read:
            cache[0].sum()
        else:
            cache[0].zero_()

    def sleep():
        torch.cuda._sleep(1 << 20)  # the device busy while the host queues what follows (a read flush is too short)

    def event_bench(fn, grad_to_none=None, warmup=25, rep=100):
        """do_bench's median (its warm-up and repetition rule, CUDA events around each call) behind a sleep and
        flush() (--flush-read, where do_bench would write the cache)."""
        flush()  # the buffer made before anything is timed
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            flush()
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = start.elapsed_time(end) / 5
        n_warmup, n_repeat = max(1, int(warmup / estimate)), max(1, int(rep / estimate))
        for _ in range(n_warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        for i in range(n_repeat):
            for x in grad_to_none or []:
                x.grad = None
            sleep()
            flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s_.elapsed_time(e_) for s_, e_ in zip(starts, ends))

    def profile_calls(fn, grad_to_none=None, reps=30):
        """The kernels of reps calls of fn, each behind a sleep and flush(): one list of (name, device µs) a call
        (torch.profiler). The sleep's kernel separates the calls and the flush's kernels, the first after it,
        are left out; both are told by profiling a sleep and flush() alone first."""
        from torch.profiler import profile, ProfilerActivity

        def kernels(prof):
            ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
            return sorted(ev, key=lambda e: e.time_range.start)

        flush()  # the buffer made outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sleep()
            flush()
            torch.cuda.synchronize()
        ks = kernels(prof)
        if len(ks) < 2 or "spin_kernel" not in ks[0].name:  # torch.cuda._sleep's kernel, then the flush's
            raise KernelTimingError("kernel timing: the profile of a sleep and a flush shows %s"
                                    % ([e.name for e in ks] or "no kernels"))
        sleep_name, n_flush = ks[0].name, len(ks) - 1
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                for x in grad_to_none or []:
                    x.grad = None
                sleep()
                flush()
                fn()
            torch.cuda.synchronize()
        calls = []
        for e in kernels(prof):
            if e.name == sleep_name:
                calls.append([])
            elif calls:
                calls[-1].append((e.name, e.time_range.elapsed_us()))
        calls = [c[n_flush:] for c in calls if len(c) > n_flush]
        if len(calls) != reps:
            raise KernelTimingError("kernel timing: %d calls seen in the profile, %d made" % (len(calls), reps))
        return calls

    def kernel_bench(fn, grad_to_none=None, reps=30):
        """--kernel-time: the median over reps calls of the summed device time of the kernels fn launches."""
        return statistics.median(sum(t for _, t in c) for c in profile_calls(fn, grad_to_none, reps)) / 1e3

    def bench(fn, grad_to_none=None):
        """Median ms of fn as the options say (see the module's doc)."""
        if a.kernel_time:
            return kernel_bench(fn, grad_to_none)
        if a.flush_read:
            return event_bench(fn, grad_to_none)
        return do_bench(fn, grad_to_none=grad_to_none, return_mode="median")

    def naive(q, k, v, causal, scale):
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, k.transpose(-2, -1)).float() * scale
        if causal:
            nq, nk = s.shape[-2], s.shape[-1]
            mask = torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(nk - nq + 1)
            s = s.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), v)

    def sdpa(q, k, v, causal, scale):
        if k.shape[1] != q.shape[1]:
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
            except TypeError:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    def measure(variant, dtype, n, d, causal):
        """Median ms, or "n/a" / "oom"."""
        hkv = a.kv_heads or a.heads
        scale = 1.0 / math.sqrt(d)
        try:
            torch.manual_seed(0)
            grad = a.backward
            q = torch.randn(a.batch, a.heads, n, d, device="cuda", dtype=tdtype[dtype], requires_grad=grad)
            k = torch.randn(a.batch, hkv, n, d, device="cuda", dtype=tdtype[dtype], requires_grad=grad)
            v = torch.randn(a.batch, hkv, n, d, device="cuda", dtype=tdtype[dtype], requires_grad=grad)
            if variant == "naive":
                run = lambda: naive(q, k, v, causal, scale)
            else:
                backend = backends.get(variant)
                if sdpa_kernel is None or backend is None:
                    return "n/a"

                def run():
                    with sdpa_kernel(backend):
                        return sdpa(q, k, v, causal, scale)

            if not a.backward:
                run()  # raises here when the backend does not take this shape or dtype
                torch.cuda.synchronize()
                return bench(run)
            o = run()
            do = torch.randn_like(o)
            torch.cuda.synchronize()
            return bench(lambda: o.backward(do, retain_graph=True), grad_to_none=[q, k, v])
        except torch.cuda.OutOfMemoryError:
            return "oom"
        except RuntimeError as e:
            if "out of memory" in str(e).lower():
                return "oom"
            return "n/a"
        finally:
            torch.cuda.empty_cache()

    def measure_decode(variant, dtype, d, row):
        """(median µs, expanded) or ("n/a" / "oom", False): SDPA on [B, seq, heads, d] tensors ([B, heads, seq, d]
        with --decode-layout bhnd)."""
        b, h, hkv, nq, n = row
        backend = backends.get(variant)
        if sdpa_kernel is None or backend is None:
            return "n/a", False
        try:
            torch.manual_seed(0)
            def tensor(heads, rows):
                if a.decode_layout == "bhnd":
                    return torch.randn(b, heads, rows, d, device="cuda", dtype=tdtype[dtype])
                return torch.randn(b, rows, heads, d, device="cuda", dtype=tdtype[dtype]).transpose(1, 2)
            q, k, v = tensor(h, nq), tensor(hkv, n), tensor(hkv, n)
            scale = 1.0 / math.sqrt(d)
            expanded = False

            def run():
                with sdpa_kernel(backend):
                    if expanded or hkv == h:
                        return F.scaled_dot_product_attention(q, k, v, scale=scale)
                    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
            try:
                run()
            except (RuntimeError, TypeError):
                if hkv == h:
                    raise
                # The backend refuses GQA here: K and V expanded to every query head, outside the timed region.
                g = h // hkv
                k = k.unsqueeze(2).expand(b, hkv, g, n, d).reshape(b, h, n, d)
                v = v.unsqueeze(2).expand(b, hkv, g, n, d).reshape(b, h, n, d)
                expanded = True
                run()
            torch.cuda.synchronize()
            return bench(run) * 1e3, expanded
        except torch.cuda.OutOfMemoryError:
            return "oom", False
        except RuntimeError as e:
            return ("oom" if "out of memory" in str(e).lower() else "n/a"), False
        finally:
            torch.cuda.empty_cache()

    measure.decode = measure_decode
    measure.bench = bench  # (fn, grad_to_none=None) -> ms, as the options say; bench/nv_dev/fixed_cost.py uses it
    measure.profile_calls = profile_calls  # bench/nv_dev/torch_kernels.py lists the kernels with it
    return measure


def run_decode(a):
    measure = None if a.dry_run else torch_timer(a)
    rows = []
    for dtype in a.dtype:
        for d in a.head_dim:
            for row in a.decode_rows:
                cmd = decode_command(a, dtype, d, row)
                print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
                if a.dry_run:
                    continue
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True)
                rec = parse_flashcl_lines(proc.stdout).get(("flash", row[4]))
                ok = rec and rec["status"] == "ok"
                r = {"dtype": dtype, "d": d, "row": row, "flush_mib": a.flush, "flush_read": a.flush_read,
                     "torch_timing": "kernels" if a.kernel_time else "events",
                     "flashcl_us": rec["median_ms"] * 1e3 if ok else (rec["status"] if rec else "-"),
                     "kv_gbps": rec.get("kv_gbps") if ok else None,
                     "split": bool(ok and rec.get("extra_bytes"))}
                for variant in DECODE_VARIANTS:
                    if variant in a.skip:
                        r[variant] = "skipped"
                        continue
                    print("  torch %s %s d=%d %s" % (variant, dtype, d, row), file=sys.stderr, flush=True)
                    r[variant], r[variant + "_expanded"] = measure.decode(variant, dtype, d, row)
                rows.append(r)
    if a.dry_run:
        return 0
    print("# flashcl vs PyTorch SDPA, decode (forward, [batch, seq, heads, d], not causal); median µs; flashcl/best "
          "is a time ratio (above 1: flashcl slower); * = K and V expanded to every query head for that backend")
    print(render_decode_table(rows))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------------


def run(a):
    measure = None if a.dry_run else torch_timer(a)
    rows = []
    for dtype in a.dtype:
        for d in a.head_dim:
            for causal in a.causal:
                cmd = flashcl_command(a, dtype, d, causal)
                print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
                if a.dry_run:
                    continue
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True)
                fcl = parse_flashcl_lines(proc.stdout)
                impl = "backward" if a.backward else "flash"
                for n in a.seqlen:
                    rec = fcl.get((impl, n))
                    row = {"dtype": dtype, "d": d, "causal": causal, "n": n, "batch": a.batch, "heads": a.heads,
                           "backward": a.backward, "flush_mib": a.flush, "flush_read": a.flush_read,
                           "torch_timing": "kernels" if a.kernel_time else "events",
                           "flashcl": rec["median_ms"] if rec and rec["status"] == "ok" else (rec["status"] if rec else "-"),
                           "reference": None}
                    if a.with_reference and not a.backward:
                        ref = fcl.get(("reference", n))
                        row["reference"] = ref["median_ms"] if ref and ref["status"] == "ok" else (ref["status"] if ref else "-")
                    for variant in TORCH_VARIANTS:
                        if variant in a.skip:
                            row[variant] = "skipped"
                            continue
                        print("  torch %s %s d=%d causal=%d N=%d" % (variant, dtype, d, causal, n), file=sys.stderr, flush=True)
                        row[variant] = measure(variant, dtype, n, d, causal)
                    rows.append(row)
    if a.dry_run:
        return 0
    print("# flashcl vs PyTorch SDPA (%s), B=%d H=%d Hkv=%d; median ms; ratios are time ratios (above 1: flashcl slower)"
          % ("backward" if a.backward else "forward", a.batch, a.heads, a.kv_heads or a.heads))
    print(render_table(rows, a.backward))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


def self_test():
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    a = parse_args([])
    check(a.batch == 4 and a.heads == 16 and a.head_dim == [64, 128] and a.causal == [False, True],
          "defaults: B=4 H=16 d=64,128 causal both")
    a = parse_args(["--seqlen", "512,1024", "--dtype", "f32,bf16", "--causal", "yes", "--head-dim", "128",
                    "--backward", "--device", "NVIDIA"])
    check(a.seqlen == [512, 1024] and a.dtype == ["f32", "bf16"] and a.causal == [True] and a.backward,
          "lists, causal yes, backward")
    cmd = flashcl_command(a, "bf16", 128, True)
    check(cmd[1:3] == ["--json", "--dtype"] and "--causal" in cmd and cmd[cmd.index("--impl") + 1] == "backward"
          and cmd[cmd.index("--seqlen") + 1] == "512,1024" and cmd[cmd.index("--device") + 1] == "NVIDIA"
          and cmd[cmd.index("--flush") + 1] == "256", "flashcl-bench command line")
    check("--flush" not in flashcl_command(parse_args(["--flush", "0"]), "f16", 64, False), "--flush 0: no fill")
    cmd = decode_command(parse_args(["--decode", "--flush-read"]), "f16", 128, (1, 32, 8, 1, 4096))
    check(cmd[cmd.index("--flush") + 1] == "256" and "--flush-read" in cmd, "--flush-read passed on")
    check("--flush-read" not in flashcl_command(parse_args([]), "f16", 64, False), "no --flush-read by default")
    a2 = parse_args(["--with-reference"])
    check(flashcl_command(a2, "f16", 64, False)[flashcl_command(a2, "f16", 64, False).index("--impl") + 1]
          == "flash,reference" and "--causal" not in flashcl_command(a2, "f16", 64, False), "forward with reference")
    for bad in (["--dtype", "f8"], ["--seqlen", "0"], ["--causal", "maybe"], ["--iters", "3"],
                ["--heads", "16", "--kv-heads", "3"], ["--flush", "0", "--flush-read"], ["--flush", "0", "--kernel-time"]):
        try:
            with open("/dev/null", "w") as devnull:
                old, sys.stderr = sys.stderr, devnull
                try:
                    parse_args(bad)
                finally:
                    sys.stderr = old
            check(False, "rejects %s" % " ".join(bad))
        except SystemExit as e:
            check(e.code == 2, "rejects %s" % " ".join(bad))

    sample = "\n".join([
        "flashcl-bench: progress on stderr is not here",
        json.dumps({"impl": "flash", "seqlen": 1024, "status": "ok", "median_ms": 2.0}),
        json.dumps({"impl": "reference", "seqlen": 1024, "status": "ok", "median_ms": 8.0}),
        json.dumps({"impl": "reference", "seqlen": 2048, "status": "out of memory", "message": "x"}),
    ])
    parsed = parse_flashcl_lines(sample)
    check(parsed[("flash", 1024)]["median_ms"] == 2.0 and parsed[("reference", 2048)]["status"] == "out of memory"
          and len(parsed) == 3, "parses flashcl-bench JSON lines")

    rows = [
        {"dtype": "f16", "d": 64, "causal": False, "n": 1024, "batch": 4, "heads": 16, "flashcl": 2.0,
         "reference": 8.0, "flash": 1.0, "efficient": 1.5, "cudnn": 0.8, "math": 6.0, "naive": 5.0},
        {"dtype": "f32", "d": 128, "causal": True, "n": 16384, "batch": 4, "heads": 16, "flashcl": 30.0,
         "reference": "out of memory", "flash": "n/a", "efficient": 20.0, "cudnn": "n/a", "math": "oom",
         "naive": "oom"},
        {"dtype": "bf16", "d": 64, "causal": True, "n": 2048, "batch": 4, "heads": 16, "flashcl": "unsupported",
         "reference": None, "flash": "n/a", "efficient": "n/a", "cudnn": "n/a", "math": "n/a", "naive": "n/a"},
    ]
    table = render_table(rows, backward=False)
    lines = table.splitlines()
    print(table)
    check(len(lines) == 4 and "flashcl/flash" in lines[0] and "fcl_ref_ms" in lines[0], "table header and rows")
    cells = lines[1].split()
    check(cells[-3] == "2.00" and cells[-2] == "2.50", "ratios flashcl/flash 2.00 and flashcl/best 2.50 (cudnn)")
    tf = flops(4, 16, 1024, 64, False, False) / 2e-3 / 1e12
    check(cells[-1] == "%.1f" % tf, "flashcl TFLOP/s from the median")
    cells = lines[2].split()
    check(cells[-3] == "n/a" and cells[-2] == "1.50" and "oom" in cells and "out" in lines[2],
          "n/a when PyTorch flash does not take f32; best of the rest")
    check(lines[3].split()[-3:] == ["n/a", "n/a", "-"], "a row where nothing ran")
    check(flops(1, 1, 10, 2, True, True) == 10 * 100 * 2 / 2, "backward FLOPs halved for causal")
    a = parse_args(["--decode", "--device", "H200"])
    check(a.decode and a.dtype == ["f16"] and a.head_dim == [128] and a.decode_rows == DECODE_ROWS,
          "--decode defaults: f16, d=128, the six rows of issue 12")
    cmd = decode_command(a, "f16", 128, (4, 32, 8, 4, 16384))
    check(cmd[cmd.index("--seqlen-q") + 1] == "4" and cmd[cmd.index("--seqlen") + 1] == "16384"
          and cmd[cmd.index("--kv-heads") + 1] == "8" and cmd[cmd.index("--layout") + 1] == "bnhd"
          and cmd[cmd.index("--flush") + 1] == "256" and cmd[cmd.index("--device") + 1] == "H200"
          and "--from-gate" in cmd, "decode flashcl-bench command line")
    a = parse_args(["--decode", "--decode-layout", "bhnd"])
    cmd = decode_command(a, "f16", 128, (1, 32, 32, 1, 131072))
    check(cmd[cmd.index("--layout") + 1] == "bhnd", "--decode-layout bhnd reaches flashcl-bench")
    a = parse_args(["--decode", "--decode-rows", "2,16,4,3,999;1,8,8,1,100", "--dtype", "bf16"])
    check(a.decode_rows == [(2, 16, 4, 3, 999), (1, 8, 8, 1, 100)] and a.dtype == ["bf16"], "--decode-rows")
    dec = render_decode_table([
        {"dtype": "f16", "d": 128, "row": (1, 32, 8, 1, 4096), "flashcl_us": 30.0, "kv_gbps": 559.2,
         "flash": 40.0, "efficient": 36.0, "efficient_expanded": True, "cudnn": "n/a"},
        {"dtype": "f16", "d": 128, "row": (1, 32, 8, 1, 32768), "flashcl_us": "error", "kv_gbps": None,
         "flash": "n/a", "efficient": "n/a", "cudnn": "n/a"}])
    print(dec)
    cells = dec.splitlines()[1].split()
    check(cells[4] == "40.0" and cells[5] == "36.0*" and cells[-4] == "36.0" and cells[-3] == "efficient"
          and cells[-2] == "0.83" and cells[-1] == "559", "decode table: best backend, ratio, GB/s, expanded mark")
    check(dec.splitlines()[2].split()[-2:] == ["n/a", "-"], "decode row where nothing ran")
    print("compare_torch self-test: %d failed" % len(failures))
    return 1 if failures else 0


def main(argv):
    a = parse_args(argv)
    if a.self_test:
        return self_test()
    return run_decode(a) if a.decode else run(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
