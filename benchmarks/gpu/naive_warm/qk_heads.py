"""The naive path's Q K^T GEMM (PyTorch's matmul, cuBLAS) with several heads at N = 6,144 to 16,384, d = 128,
fp16, cold (Nsight Compute flushes the caches before it): configurations no sweep holds, measured after the
model took in the GEMM's walk (groups of 2,048 keys, Q read again once a group) and its L2 rule for it; beside
each, the model's prediction of the GEMM's DRAM reads (`simflash physical --algorithm naive --cache cold`).

    python benchmarks/gpu/naive_warm/qk_heads.py OUT_DIR     # ncu over itself: qk_heads.json, qk_heads_ncu.csv
    python benchmarks/gpu/naive_warm/qk_heads.py --show benchmarks/gpu/naive_warm/qk_heads.json
"""

import json
from pathlib import Path

from qk_shapes import cli

SHAPES = [(n, n, heads) for heads in (2, 3, 6) for n in (6144, 8192, 10240, 12288, 16384)]


def show(path: Path) -> None:
    from simflash.model.calibration import within
    from simflash.model.physical import predict

    print("    N  heads  DRAM read MiB, measured  predicted  error  beyond Q + K a head, measured  predicted  kernel")
    for row in json.loads(path.read_text())["rows"]:
        n, heads, operands = row["n"], row["heads"], 2 * row["n"] * row["d"] * 2 * row["heads"]
        measured = row["dram__bytes_read.sum"]
        predicted = predict("naive", n, row["d"], heads=heads, cache="cold").kernel("gemm_qk").dram_read_bytes
        print(f"{n:5d}  {heads:5d}  {measured / 2**20:23.1f}  {predicted / 2**20:9.1f}  {predicted / measured - 1:+5.0%}"
              f"{'' if within(predicted, measured) else '*'}  {(measured - operands) / heads / 2**20:29.2f}"
              f"  {(predicted - operands) / heads / 2**20:9.2f}  {row['kernel'][:48]}")


if __name__ == "__main__":
    cli(__file__, "qk_heads", SHAPES, show)
