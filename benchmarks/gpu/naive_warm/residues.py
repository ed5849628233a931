"""How much of S the naive Q K GEMM leaves dirty in the L2 at its end, measured and predicted, from the
committed validation reports: warm (the run's first kernel, after a read-only flush: nothing else to write
back), every sweep's configurations without the mask whose S outgrows the L2 (40 MiB or more), S written
less the GEMM's DRAM writes. Grouped by the share of the GEMM's traffic that is reads of Q and K (2 d / N of
it per S written, so 50% at N = 256, d = 128): whether the operands it reads take room from the S it writes.
With a git revision, the reports as they were committed there.

    python benchmarks/gpu/naive_warm/residues.py [REV] > benchmarks/gpu/naive_warm/residues.txt
"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unseen_counts import report

from simflash.config import MiB
from simflash.model.calibration import REPORTS

SHARES = ((0.25, "25 to 50%"), (0.10, "10 to 25%"), (0.03, "3 to 10%"), (0.0, "under 3%"))


def main(rev: str | None) -> None:
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name in REPORTS.values():
        for row in report(name, rev)["rows"]:
            c = row["config"]
            s_bytes = c["heads"] * c["n"] ** 2 * 2
            if (row["implementation"] != "naive" or row["cache"] != "warm" or row["kernel"] != "gemm_qk"
                    or c["causal"] or s_bytes < 40 * MiB):
                continue
            share = 2 * c["d"] / (2 * c["d"] + c["n"])  # Q and K read per S written, of the GEMM's traffic
            label = next(text for floor, text in SHARES if share >= floor)
            groups[label].append(tuple((s_bytes - row[side]["dram_write_bytes"]) / MiB
                                       for side in ("measured", "predicted")))
    print(f"reports at {rev or 'the working tree'}: naive Q K GEMM, warm, S of 40 MiB or more: MiB of S still dirty "
          "in the L2 at its end, median (range)")
    print("  reads of Q and K  | rows | measured           | predicted")
    for _, label in SHARES:
        pairs = groups[label]
        cells = []
        for side in (0, 1):
            values = [p[side] for p in pairs]
            cells.append(f"{statistics.median(values):5.1f} ({min(values):4.1f}-{max(values):4.1f})")
        print(f"  {label:17s} | {len(pairs):4d} | {cells[0]:18s} | {cells[1]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
