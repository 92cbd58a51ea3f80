"""A model, in numpy, of fused-dq.patch's fixed-point dQ (FLASHCL_BACKWARD_FUSED_DQ=2; docs/notes-nvidia.md v38):
each 64-key block's dQ partial (f16-rounded dS and K, float sums) times the row's power of two from the bound
(|dO_i| max_j |V_j| + |D_i|) max|K| * 4, rounded to a 64-bit integer and summed; the sum times the inverse scale
against float64 sums of the same rounded products. Checks the bound holds (no overflow of the 2^62 range) and
prints the error, for inputs at several magnitudes. Not part of the library; needs numpy.
Usage: python3 bench/nv_dev/fixed_point_model.py"""
import numpy as np


def main():
    rng = np.random.default_rng(1)
    n, d = 1024, 128
    for q_mul, k_mul, v_mul, o_mul in [(1, 1, 1, 1), (30, 1, 1, 1), (1, 50, 1, 1), (1, 1, 1, 1e-3), (1, 1, 100, 1)]:
        q = rng.uniform(-1, 1, (n, d)) * q_mul
        k = rng.uniform(-1, 1, (n, d)) * k_mul
        v = rng.uniform(-1, 1, (n, d)) * v_mul
        d_o = rng.uniform(-1, 1, (n, d)) * o_mul
        s = q @ k.T / np.sqrt(d)
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dvec = (d_o * (p @ v)).sum(1)
        ds = p * (d_o @ v.T - dvec[:, None])
        bound = (np.linalg.norm(d_o, axis=1) * np.linalg.norm(v, axis=1).max() + np.abs(dvec)) * np.abs(k).max() * 4
        assert (np.abs(ds @ k).max(1) < bound / 4 * 1.0001).all(), "the bound does not hold"
        sc = np.ldexp(1.0, np.clip(62 - np.frexp(bound.astype(np.float32))[1], -126, 126)).astype(np.float32)
        acc = np.zeros((n, d), dtype=np.int64)
        ref = np.zeros((n, d))
        for j in range(0, n, 64):
            a, b = ds[:, j:j + 64].astype(np.float16), k[j:j + 64].astype(np.float16)
            acc += np.rint(((a.astype(np.float32) @ b.astype(np.float32)) * sc[:, None])).astype(np.int64)
            ref += a.astype(np.float64) @ b.astype(np.float64)
        got = acc.astype(np.float32) * (1 / sc[:, None])
        print("inputs x(%g, %g, %g, %g): largest sum 2^%.1f of 2^62, max error / max |dQ| %.2e" %
              (q_mul, k_mul, v_mul, o_mul, np.log2(np.abs(acc).max()), np.abs(got - ref).max() / np.abs(ref).max()))


if __name__ == "__main__":
    main()
