"""Where a wrong FA-2 kernel goes wrong, on tiny inputs: the probabilities P alone (V = identity, so
O = P), P with its columns moved (V a permutation: a transposed V shows here), then the full output,
printed as the worst rows and columns; with $OUT set, every output and reference is saved there too.

    python3 benchmarks/gpu/diagnose.py [VERSION]    (the kernel version, default v1)
"""

from __future__ import annotations

import os
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
    block_q, block_kv = next(tile for tile in ((64, 32), (128, 64)) if flash2.builds(version, *tile, 64))
    saved = {}
    for d, n, causal in ((64, 64, False), (64, 64, True), (128, 128, False), (64, 40, False)):
        q = rng.standard_normal((1, n, d), dtype=np.float32)
        k = rng.standard_normal((1, n, d), dtype=np.float32)
        eye = np.zeros((1, n, d), dtype=np.float32)
        eye[0, np.arange(min(n, d)), np.arange(min(n, d))] = 1.0
        moved = np.roll(eye, 1, axis=2)
        for which, (label, v) in enumerate((("P (V = I)", eye), ("P, columns moved by 1", moved),
                                             ("O", rng.standard_normal((1, n, d), dtype=np.float32)))):
            run = flash2.flash_attention(q, k, v, causal=causal, block_q=block_q, block_kv=block_kv, version=version)
            ref = reference_attention(q, k, v, causal)
            show(f"d={d} n={n} causal={causal} {label}", run.out[0], ref[0])
            print(f"  bytes {run.traffic.to_dict()['by_tensor']}")
            key = f"d{d}_n{n}_causal{int(causal)}_{which}"
            saved |= {f"{key}_out": run.out[0].astype(np.float32), f"{key}_ref": ref[0], f"{key}_q": q[0],
                      f"{key}_k": k[0], f"{key}_v": v[0]}
    if os.environ.get("OUT"):
        np.savez_compressed(os.path.join(os.environ["OUT"], f"diagnose_{version}.npz"), **saved)


if __name__ == "__main__":
    main(*sys.argv[1:])
