"""The time rows of every committed validation report, kernel by kernel: how many are within 15% of the
measured time, the median error and the worst (with its configuration). `simflash physical-validate`'s
tables give the share within 15% by implementation; this adds the worst cases and splits PyTorch's
split-KV pair (splitkv sweep) into its two kernels.

    python benchmarks/gpu/time_errors.py > benchmarks/gpu/time_errors.txt
"""

import json
from pathlib import Path
from statistics import median

from simflash.model.calibration import REPORTS

ROOT = Path(__file__).resolve().parent


def main() -> None:
    print("sweep         set         cache  implementation  kernel                  within 15%  median   worst  (N, heads, d, causal)")
    for sweep, name in REPORTS.items():
        cells: dict[tuple, list] = {}
        for row in json.loads((ROOT / name).read_text())["rows"]:
            if row["implementation"] == "naive":
                continue
            error = (row["predicted"]["time_s"] - row["measured"]["time_s"]) / row["measured"]["time_s"]
            c = row["config"]
            cells.setdefault((row["subset"], row["cache"], row["implementation"], row["kernel"]), []).append(
                (error, (c["n"], c["heads"], c["d"], c["causal"])))
        for (subset, cache, implementation, kernel), rows in cells.items():
            errors = [e for e, _ in rows]
            worst, config = max(rows, key=lambda r: abs(r[0]))
            print(f"{sweep:12s}  {subset:10s}  {cache:5s}  {implementation:14s}  {kernel:22s}  "
                  f"{sum(abs(e) <= 0.15 for e in errors):>4} / {len(errors):<4}  {median(errors):+6.1%}  {worst:+6.1%}  {config}")


if __name__ == "__main__":
    main()
