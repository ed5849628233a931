"""The naive path's rows without the mask, one cache mode, from the committed validation reports of the eight
regime sweeps: per configuration (MiB of S, N, heads, d) each kernel's DRAM MiB read and written, measured /
predicted, `*` where the prediction is not within 10% / 1 MiB. With a git revision, the reports as they were
committed there.

    python benchmarks/gpu/naive_warm/rows.py warm [REV] > benchmarks/gpu/naive_warm/rows_warm.txt
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unseen_counts import report

from simflash.config import MiB
from simflash.model.calibration import REGIME_REPORTS, within

KERNELS = ("gemm_qk", "softmax", "gemm_pv")
KEYS = ("dram_read_bytes", "dram_write_bytes")


def main(cache: str, rev: str | None) -> None:
    rows: dict[tuple, dict] = {}
    for name in REGIME_REPORTS.values():
        for row in report(name, rev)["rows"]:
            c = row["config"]
            if row["implementation"] == "naive" and row["cache"] == cache and not c["causal"]:
                rows.setdefault((c["heads"] * c["n"] ** 2 * 2 / MiB, c["n"], c["heads"], c["d"]), {})[row["kernel"]] = row
    print(f"reports at {rev or 'the working tree'}, {cache}: DRAM MiB measured / predicted, * outside 10% / 1 MiB")
    print("  S MiB     N heads   d | " + " | ".join(f"{k:^27s}" for k in KERNELS))
    print("                        | " + " | ".join(f"{'read':^13s} {'write':^13s}" for _ in KERNELS))
    for (s, n, heads, d), kernels in sorted(rows.items()):
        cells = []
        for kernel in KERNELS:
            measured, predicted = kernels[kernel]["measured"], kernels[kernel]["predicted"]
            cells.append(" ".join(f"{measured[key] / MiB:5.1f}/{predicted[key] / MiB:5.1f}"
                                  f"{' ' if within(predicted[key], measured[key]) else '*'}" for key in KEYS))
        print(f"{s:7.1f} {n:5d} {heads:5d} {d:3d} | " + " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
