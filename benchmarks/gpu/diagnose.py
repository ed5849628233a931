"""Where a wrong FA-2 kernel goes wrong, on tiny inputs: the probabilities P alone (V = identity, so
O = P), then the full output, printed as the worst rows and columns.

    python3 benchmarks/gpu/diagnose.py [VERSION]    (the kernel version, default v1)
"""

from __future__ import annotations

import sys

import numpy as np

from simflash.backends import flash2
from simflash.numerics import reference_attention


def show(label: str, out: np.ndarray, ref: np.ndarray) -> None:
    diff = np.abs(out.astype(np.float64) - ref)
    print(f"{label}: max abs error {diff.max():.3g} (max |ref| {np.abs(ref).max():.3g})")
    if diff.max() > 1e-2:
        rows = np.argsort(diff.max(axis=1))[::-1][:6]
        cols = np.argsort(diff.max(axis=0))[::-1][:6]
        print(f"  worst rows {rows.tolist()}  worst cols {cols.tolist()}")
        r = rows[0]
        print(f"  row {r} out {np.round(out[r, :12].astype(np.float64), 3).tolist()}")
        print(f"  row {r} ref {np.round(ref[r, :12], 3).tolist()}")


def main(version: str = "v1") -> None:
    rng = np.random.default_rng(1)
    for d, n, causal in ((64, 64, False), (64, 64, True), (128, 128, False), (64, 40, False)):
        q = rng.standard_normal((1, n, d), dtype=np.float32)
        k = rng.standard_normal((1, n, d), dtype=np.float32)
        eye = np.zeros((1, n, d), dtype=np.float32)
        eye[0, np.arange(min(n, d)), np.arange(min(n, d))] = 1.0
        for label, v in (("P (V = I)", eye), ("O", rng.standard_normal((1, n, d), dtype=np.float32))):
            run = flash2.flash_attention(q, k, v, causal=causal, block_q=64, block_kv=32, version=version)
            ref = reference_attention(q, k, v, causal)
            show(f"d={d} n={n} causal={causal} {label}", run.out[0], ref[0])
            print(f"  bytes {run.traffic.to_dict()['by_tensor']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
