"""How far FlashAttention-2's dq arithmetic sits above the f16 rounding floor, for one case of its criterion
(docs/testing.md, docs/notes-nvidia.md v21). NumPy only; no device.

The tensor-core backward (and FA2's) computes dS = P (dP - D) in float, rounds dS to f16 and takes dq = scale
dS K on tensor cores with float accumulation, with D = rowsum(dO * O) from the f16 O the forward returned. This
emulates that arithmetic for the inputs python/tests/test_torch.py draws for each seed (its `inputs` order: q, k,
v, then dO) and prints, over the seeds, the max dq error of:
  floor     the exact float64 dq rounded to f16 (the best an f16 result can do)
  fa2       dS rounded to f16 as above, dq rounded to f16
  dS float  the same with dS kept in float (what a second f16 part of dS would buy)
as ratios to the floor. The criterion compares flashcl with torch's f16 gradients; when torch's error is at
the floor, the fa2 ratio is what the test sees.

usage: python3 bench/backward_dq_rounding.py [--case B,SQ,SK,HEADS,D[,KV_HEADS]] [--causal] [--seeds FIRST:LAST]
  default case 2,113,203,4,32 (the grid's b2-113x203-mha-d32-full-float16), seeds 0:200; the grid's gqa cases
  have KV_HEADS 2 and its mqa cases 1 (of 4 heads)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "tests"))
import reference as ref  # noqa: E402  (the tests' float64 reference, NumPy only)


def errors(seed, b, sq, sk, heads, d, kv_heads, causal):
    rng = np.random.default_rng(seed)  # drawn as test_accuracy.inputs and test_torch draw them
    q = rng.standard_normal((b, sq, heads, d)).astype(np.float16)
    k, v = (rng.standard_normal((b, sk, kv_heads, d)).astype(np.float16) for _ in range(2))
    do = rng.standard_normal(q.shape).astype(np.float16)
    q, k, v, do = (np.swapaxes(x, 1, 2).astype(np.float64) for x in (q, k, v, do))
    sc = 1.0 / np.sqrt(d)
    o, lse = ref.attention(q, k, v, causal=causal)
    lse = lse[..., None]
    dq = ref.attention_grads(q, k, v, do, causal=causal)[0]
    k, v = (np.repeat(x, heads // kv_heads, axis=1) for x in (k, v))  # each query head's K and V

    def err(x):
        return np.abs(x.astype(np.float16).astype(np.float64) - dq).max()

    f32 = np.float32
    o16 = o.astype(np.float16).astype(np.float64)
    d32 = (do * o16).sum(-1, keepdims=True).astype(f32)
    s32 = (q.astype(f32) @ np.swapaxes(k, -1, -2).astype(f32)) * f32(sc)
    if causal:
        s32 = np.where(ref.visible(sq, sk, True, (-1, -1)), s32, -np.inf)
    p32 = np.exp(s32 - lse.astype(f32))
    dp32 = do.astype(f32) @ np.swapaxes(v, -1, -2).astype(f32)
    ds = p32 * (dp32 - d32)
    k32 = k.astype(f32)
    fa2 = (ds.astype(np.float16).astype(f32) @ k32) * f32(sc)
    dsf = (ds @ k32) * f32(sc)
    return err(dq), err(fa2), err(dsf)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="2,113,203,4,32")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seeds", default="0:200")
    a = ap.parse_args()
    b, sq, sk, heads, d, *kv = (int(x) for x in a.case.split(","))
    kv_heads = kv[0] if kv else heads
    first, last = (int(x) for x in a.seeds.split(":"))
    r = np.array([errors(s, b, sq, sk, heads, d, kv_heads, a.causal) for s in range(first, last)])
    floor, fa2, dsf = r[:, 0], r[:, 1] / r[:, 0], r[:, 2] / r[:, 0]
    n = len(r)
    print(f"case b={b} sq={sq} sk={sk} heads={heads} kv_heads={kv_heads} d={d}{' causal' if a.causal else ''},"
          f" seeds {first}..{last - 1} ({n})")
    print(f"floor: max dq error {floor.min():.3g} to {floor.max():.3g}")
    print(f"fa2 / floor: median {np.median(fa2):.2f}, max {fa2.max():.2f}, above 2 in {(fa2 > 2).sum()} of {n};"
          f" its max error {r[:, 1].min():.3g} to {r[:, 1].max():.3g}")
    print(f"dS float / floor: median {np.median(dsf):.2f}, max {dsf.max():.2f}")


if __name__ == "__main__":
    main()
