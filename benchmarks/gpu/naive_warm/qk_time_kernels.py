"""The naive Q K GEMM's time, predicted against measured, by the cuBLAS kernel that ran it: over every naive row of
the ten sweeps' reports but splitkv's (fit rows included; cold, where the time is fitted), per nvjet tile and
family (the name's last letters, _TNT or _TNN) the rows, the median error of the predicted time and the rows
within 15%; then, for the kernels whose median is off by more than 15%, the configurations that ran them.

    python benchmarks/gpu/naive_warm/qk_time_kernels.py > benchmarks/gpu/naive_warm/qk_time_kernels.txt
"""

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from simflash.model.calibration import REPORTS

SWEEPS = Path(__file__).resolve().parents[1]
NAME = re.compile(r"nvjet_sm90_\w+?_(\d+x\d+)_.*(_T[NT][NT])$")


def kernel_of(sweep: str) -> dict[tuple, str]:
    """{(n, heads, d): the tile and family of the cuBLAS kernel that ran the configuration's Q K GEMM, cold}."""
    kernels = {}
    for entry in json.loads((SWEEPS / f"{sweep}_cold.json").read_text())["configs"]:
        c = entry["config"]
        if c["algorithm"] == "naive":
            (gemm,) = (k for k in entry["kernels"] if k["kernel"] == "gemm_qk")
            match = NAME.match(gemm["ncu_kernels"][0])
            kernels[c["n"], c["heads"], c["d"]] = " ".join(match.groups()) if match else gemm["ncu_kernels"][0]
    return kernels


def main() -> None:
    errors: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for sweep, name in REPORTS.items():
        if sweep == "splitkv":
            continue
        kernels = kernel_of(sweep)
        for row in json.loads((SWEEPS / name).read_text())["rows"]:
            if row["kernel"] == "gemm_qk" and row["cache"] == "cold":
                c = row["config"]
                error = 100 * (row["predicted"]["time_s"] / row["measured"]["time_s"] - 1)
                errors[kernels[c["n"], c["heads"], c["d"]]].append((error, f"{sweep} N={c['n']} heads={c['heads']} d={c['d']}"))
    print("Q K GEMM, cold, every naive row: predicted time against measured, by the cuBLAS kernel that ran")
    print("kernel (tile, family)  | rows | median error | within 15%")
    by_median = sorted(errors.items(), key=lambda item: statistics.median(e for e, _ in item[1]))
    for kernel, rows in by_median:
        median = statistics.median(e for e, _ in rows)
        print(f"{kernel:22s} | {len(rows):4d} | {median:+11.1f}% | {sum(abs(e) <= 15 for e, _ in rows):4d}")
    for kernel, rows in by_median:
        if abs(statistics.median(e for e, _ in rows)) > 15:
            print(f"{kernel}: " + "; ".join(f"{where} {e:+.0f}%" for e, where in sorted(rows)))


if __name__ == "__main__":
    main()
