"""How much more than Q and K the naive path's Q K^T GEMM reads from DRAM, by N and by the cuBLAS kernel that
ran, from the committed sweeps (every row of the eight regime sweeps, fit set included, without the mask):
the DRAM bytes read beyond Q + K, per head, as a share of one head's K (n x d x 2 bytes), cold and warm,
median and range over the heads; and what the model predicts beyond Q + K (the median over the same rows; it
reads Q's tiles again once a group of 2,048 keys, simflash.algorithms.naive).

    python benchmarks/gpu/naive_warm/qk_rereads.py > benchmarks/gpu/naive_warm/qk_rereads.txt
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unseen_counts import report

from simflash.model.calibration import REGIME_REPORTS

SWEEPS = Path(__file__).resolve().parents[1]
TILE = re.compile(r"nvjet_sm90_hsh_(\d+x\d+)_64x\d+_(\dx\d)_(\w)_")


def kernel_names() -> dict[tuple, str]:
    """{(sweep, heads, n, d): the tile, cluster and raster of the nvjet kernel that ran the Q K GEMM}, warm."""
    names = {}
    for sweep in REGIME_REPORTS:
        for entry in json.loads((SWEEPS / f"{sweep}_warm.json").read_text())["configs"]:
            c = entry["config"]
            if c["algorithm"] == "naive" and not c["causal"]:
                (qk,) = (k for k in entry["kernels"] if k["kernel"] == "gemm_qk")
                tile = TILE.search(qk["ncu_kernels"][0])
                names[sweep, c["heads"], c["n"], c["d"]] = " ".join(tile.groups()) if tile else qk["ncu_kernels"][0][:24]
    return names


def main() -> None:
    names = kernel_names()
    shares: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for sweep, name in REGIME_REPORTS.items():
        for row in report(name, None)["rows"]:
            c = row["config"]
            if row["implementation"] != "naive" or row["kernel"] != "gemm_qk" or c["causal"] or c["n"] < 2048:
                continue
            operand = c["n"] * c["d"] * 2  # one head's K (and Q)
            beyond = [(row[side]["dram_read_bytes"] - 2 * operand * c["heads"]) / c["heads"] / operand
                      for side in ("measured", "predicted")]
            shares[c["n"], c["d"], row["cache"], names[sweep, c["heads"], c["n"], c["d"]]].append(tuple(beyond))
    print("Q K^T GEMM, no mask: DRAM reads beyond Q + K per head, as a share of a head's K; median (range) over the")
    print("configurations' heads, measured and predicted; by N, d, cache mode and the nvjet tile, cluster, raster")
    print("    N    d  cache  kernel             rows  measured                 predicted")
    for (n, d, cache, kernel), pairs in sorted(shares.items()):
        measured, predicted = zip(*pairs)
        print(f"{n:5d}  {d:3d}  {cache:5s}  {kernel:17s}  {len(pairs):4d}  {statistics.median(measured):6.0%} "
              f"({min(measured):5.0%} to {max(measured):5.0%})  {statistics.median(predicted):6.0%}")


if __name__ == "__main__":
    main()
