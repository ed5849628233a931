"""The naive Q K GEMM's time, predicted against measured, by the cuBLAS kernel that ran it: over every naive row of
the ten sweeps' reports but splitkv's (fit rows included; cold, where the time is fitted), per nvjet tile and
family (the name's last letters, _TNT or _TNN) the rows, the median error of the predicted time and the rows
within 15%; then, for the kernels whose median is off by more than 15%, the configurations that ran them.

    python benchmarks/gpu/naive_warm/qk_time_kernels.py > benchmarks/gpu/naive_warm/qk_time_kernels.txt
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from naive_warm.pv_kernels import kernel_names

from simflash.model.calibration import REPORTS

SWEEPS = Path(__file__).resolve().parents[1]
NAME = re.compile(r"nvjet_sm90_\w+?_(\d+x\d+)_.*(_T[NT][NT])$")


def tile_and_family(name: str) -> str:
    """An nvjet kernel's tile and family (`256x128 _TNT`); another kernel's whole name."""
    match = NAME.match(name)
    return " ".join(match.groups()) if match else name


def main() -> None:
    sweeps = [sweep for sweep in REPORTS if sweep != "splitkv"]
    ran = kernel_names("cold", "gemm_qk", sweeps)
    errors: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for sweep in sweeps:
        for row in json.loads((SWEEPS / REPORTS[sweep]).read_text())["rows"]:
            if row["kernel"] == "gemm_qk" and row["cache"] == "cold":
                c = row["config"]
                error = 100 * (row["predicted"]["time_s"] / row["measured"]["time_s"] - 1)
                kernel = tile_and_family(ran[sweep, c["heads"], c["n"], c["d"], c["causal"]][0])
                errors[kernel].append((error, f"{sweep} N={c['n']} heads={c['heads']} d={c['d']}"))
    medians = {kernel: statistics.median(e for e, _ in rows) for kernel, rows in errors.items()}
    print("Q K GEMM, cold, every naive row: predicted time against measured, by the cuBLAS kernel that ran")
    print("kernel (tile, family)  | rows | median error | within 15%")
    by_median = sorted(errors, key=medians.get)
    for kernel in by_median:
        rows = errors[kernel]
        print(f"{kernel:22s} | {len(rows):4d} | {medians[kernel]:+11.1f}% | {sum(abs(e) <= 15 for e, _ in rows):4d}")
    for kernel in by_median:
        if abs(medians[kernel]) > 15:
            print(f"{kernel}: " + "; ".join(f"{where} {e:+.0f}%" for e, where in sorted(errors[kernel])))


if __name__ == "__main__":
    main()
