"""The naive path's Q K^T GEMM alone, laid out as the model lays it out (simflash.algorithms.naive: cuBLAS's
nvjet kernel's walk, groups of QK_GROUP_KEYS keys, query tile after query tile, every other group backwards),
through the model's L2, cold, for the shapes of benchmarks/gpu/naive_warm/qk_shapes.json and the square ones of
qk_large.json: the DRAM MiB read beyond Q + K, predicted / measured.

    python benchmarks/gpu/l2_probe/qk_tiles.py > benchmarks/gpu/l2_probe/qk_tiles.txt
"""

import json
from pathlib import Path

from simflash.algorithms.naive import naive_grid, naive_program
from simflash.chip import l2_cache
from simflash.config import MiB, gpu_spec
from simflash.grid import run_programs
from simflash.schedule import TileSchedule


def main() -> None:
    folder = Path(__file__).resolve().parents[1] / "naive_warm"
    shapes = json.loads((folder / "qk_shapes.json").read_text())["rows"]
    square = [{**row, "m": row["n"]} for row in json.loads((folder / "qk_large.json").read_text())["rows"]]
    print("Q K GEMM of one head, d = 128, fp16, cold: DRAM MiB read beyond Q + K, the model's walk through its L2")
    print("   N (Q)   M (K)  predicted  measured  kernel")
    for row in shapes + square:
        n, m, d = row["n"], row["m"], row["d"]
        sched = TileSchedule(n, m, n, m)
        l2 = l2_cache(gpu_spec("H200"))
        l2.flush(residue=True)
        l2.kernel = "gemm_qk"
        run_programs([naive_program("gemm_qk", sched, cta, d, 2, 0) for cta in naive_grid("gemm_qk", sched, 1, 2, 0)],
                     1, l2)
        l2.end_kernel()
        compulsory = (n + m) * d * 2
        predicted = l2.traffic().by_kernel["gemm_qk"].dram_read_bytes - compulsory
        print(f"{n:8d} {m:7d}  {predicted / MiB:9.2f}  {(row['dram__bytes_read.sum'] - compulsory) / MiB:8.2f}"
              f"  {row['kernel'][:48]}")


if __name__ == "__main__":
    main()
