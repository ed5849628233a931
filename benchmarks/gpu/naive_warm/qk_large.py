"""The naive path's Q K^T GEMM (PyTorch's matmul, cuBLAS) for one head at N beyond the sweeps' 8,192, d = 128,
fp16, cold (Nsight Compute flushes the caches before it): the DRAM bytes it reads beyond Q + K, as a share
of K, and the nvjet kernel that ran, to see whether the re-reads of qk_rereads.txt keep growing with N.

    python benchmarks/gpu/naive_warm/qk_large.py OUT_DIR     # ncu over itself: qk_large.json, qk_large_ncu.csv
    python benchmarks/gpu/naive_warm/qk_large.py --show benchmarks/gpu/naive_warm/qk_large.json
"""

import json
from pathlib import Path

from qk_shapes import cli

SEQUENCES = (4096, 6144, 8192, 10240, 12288, 16384)
SHAPES = [(n, n) for n in SEQUENCES]


def show(path: Path) -> None:
    print("    N  DRAM read MiB  beyond Q + K, of K  time us  kernel")
    for row in json.loads(path.read_text())["rows"]:
        operand = row["n"] * row["d"] * 2
        beyond = row["dram__bytes_read.sum"] - 2 * operand
        print(f"{row['n']:5d}  {row['dram__bytes_read.sum'] / 2**20:13.1f}  {beyond / operand:18.0%}"
              f"  {row['gpu__time_duration.sum'] / 1e3:7.0f}  {row['kernel'][:70]}")


if __name__ == "__main__":
    cli(__file__, "qk_large", SHAPES, show)
