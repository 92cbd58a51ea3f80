# What each side's timer gives a kernel that does (nearly) nothing (docs/notes-nvidia.md v28): flashcl-bench times
# its one kernel by that kernel's OpenCL events, compare_torch.py --kernel-time PyTorch's kernels by their device
# time in torch.profiler (CUPTI). A short forward's fixed part differs by 3-4 us between the two (v28); this
# tells how much of that the timers themselves account for.
#   flashcl: flash_fwd_mma returning at its first line (a copy of cl/ read through FLASHCL_KERNEL_DIR), at grids of
#            1, 128 and 512 work-groups (head_dim 128, f16, 128-row blocks), median of flashcl-bench's runs;
#   PyTorch: an in-place add on 1, 65536 and 262144 halves (one block, and grids of the order of flashcl's), the
#            median device time of 30 calls behind the usual sleep and flush.
# usage (GPU machine, repository root): python3 bench/nv_dev/empty_kernels.py build-nv/tools/flashcl-bench [H200]
import os
import re
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare_torch  # noqa: E402
import torch  # noqa: E402

bench = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "H200"
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

kdir = tempfile.mkdtemp(prefix="fcl-empty-")
shutil.copytree(os.path.join(root, "cl"), os.path.join(kdir, "cl"))
path = os.path.join(kdir, "cl", "nvidia", "flash_fwd_mma.cl")
src = open(path).read()
src, n = re.subn(r"(\n  __local uint4 smem\[SMEM / EPC\];[^\n]*\n)", r"\1  if (get_local_id(0) < 100000) return;\n", src)
if n != 1:
    sys.exit("empty_kernels.py: flash_fwd_mma.cl's first line (the smem declaration) was not found")
open(path, "w").write(src)

print("| side | grid | what | median us |")
print("|---|---|---|---|")
for b, h, nq in ((1, 1, 128), (1, 16, 1024), (4, 16, 1024)):
    blocks = b * h * nq // 128
    for label, env in (("empty kernel", {"FLASHCL_KERNEL_DIR": os.path.join(kdir, "cl")}), ("the forward", {})):
        us = compare_torch.flashcl_forward_ms(bench, device, b, h, nq, nq, 128, env) * 1e3
        print("| flashcl, OpenCL events | %d work-groups | %s, %d x %d x %d rows | %.2f |" % (blocks, label, b, h, nq, us))
shutil.rmtree(kdir)

timer = compare_torch.torch_timer(compare_torch.parse_args(["--kernel-time"]))
for n in (1, 65536, 262144):
    x = torch.zeros(n, device="cuda", dtype=torch.float16)
    calls = timer.profile_calls(lambda: x.add_(1))
    us = statistics.median(sum(t for _, t in c) for c in calls)
    print("| PyTorch, CUPTI | one kernel | add_ on %d halves | %.2f |" % (n, us))
