"""How much of S the naive Q K GEMM leaves dirty in the L2 at its end, measured and predicted, from the
committed validation reports: warm (the run's first kernel, after a read-only flush: nothing else to write
back), every sweep's configurations without the mask whose S outgrows the L2 (40 MiB or more), S written
less the GEMM's DRAM writes. Grouped by the share of the GEMM's traffic that is reads of Q and K (2 d / N of
it per S written, so 50% at N = 256, d = 128): whether the operands it reads take room from the S it writes;
then by the cuBLAS kernel that ran (the ncu kernel name's tile and its last letter, T or N: cuBLAS's heuristics
pick one of two families of kernels for this GEMM); last, the unseen rows (all but the calibration fit set)
whose DRAM writes are within 10% / 1 MiB, by family, cold and warm. With a git revision, the reports as they
were committed there.

    python benchmarks/gpu/naive_warm/residues.py [REV] > benchmarks/gpu/naive_warm/residues.txt
"""

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from naive_warm.pv_kernels import kernel_names
from unseen_counts import report

from simflash.config import MiB
from simflash.model.calibration import REGIME_REPORTS, within

SHARES = ((0.25, "25 to 50%"), (0.10, "10 to 25%"), (0.03, "3 to 10%"), (0.0, "under 3%"))
TILE = re.compile(r"nvjet_sm90_hsh_(\d+x\d+)_.*_T N(\w)$".replace(" ", ""))


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} ({min(values):4.1f}-{max(values):4.1f})"


def main(rev: str | None) -> None:
    names = kernel_names("warm", "gemm_qk")
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_kernel: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for sweep, name in REGIME_REPORTS.items():
        for row in report(name, rev)["rows"]:
            c = row["config"]
            s_bytes = c["heads"] * c["n"] ** 2 * 2
            if (row["implementation"] != "naive" or row["cache"] != "warm" or row["kernel"] != "gemm_qk"
                    or c["causal"] or s_bytes < 40 * MiB):
                continue
            share = 2 * c["d"] / (2 * c["d"] + c["n"])  # Q and K read per S written, of the GEMM's traffic
            label = next(text for floor, text in SHARES if share >= floor)
            residues = tuple((s_bytes - row[side]["dram_write_bytes"]) / MiB for side in ("measured", "predicted"))
            groups[label].append(residues)
            (ran,) = names[sweep, c["heads"], c["n"], c["d"], c["causal"]]
            tile, last = TILE.search(ran).groups()
            by_kernel[last, tile].append(residues)
    print(f"reports at {rev or 'the working tree'}: naive Q K GEMM, warm, S of 40 MiB or more: MiB of S still dirty "
          "in the L2 at its end, median (range)")
    print("  reads of Q and K  | rows | measured           | predicted")
    for _, label in SHARES:
        measured, predicted = zip(*groups[label])
        print(f"  {label:17s} | {len(measured):4d} | {median_range(measured):18s} | {median_range(predicted)}")
    print("  by the kernel that ran (the name's last letter, its tile)")
    for last in ("T", "N"):
        for (_, tile), pairs in sorted((key, pairs) for key, pairs in by_kernel.items() if key[0] == last):
            measured, predicted = zip(*pairs)
            print(f"  TN{last} {tile:12s} | {len(pairs):4d} | {median_range(measured):18s} | {median_range(predicted)}")
        measured, predicted = zip(*(p for key, pairs in by_kernel.items() if key[0] == last for p in pairs))
        print(f"  TN{last} all          | {len(measured):4d} | {median_range(measured):18s} | {median_range(predicted)}")
    print("  unseen rows whose DRAM writes are within 10% / 1 MiB, by the kernel family that ran")
    for cache in ("cold", "warm"):
        ran = kernel_names(cache, "gemm_qk")
        cells: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for sweep, name in REGIME_REPORTS.items():
            for row in report(name, rev)["rows"]:
                c = row["config"]
                if row["kernel"] != "gemm_qk" or row["cache"] != cache or row["subset"] == "fit":
                    continue
                (kernel,) = ran[sweep, c["heads"], c["n"], c["d"], c["causal"]]
                cell = cells[TILE.search(kernel)[2]]
                cell[0] += within(row["predicted"]["dram_write_bytes"], row["measured"]["dram_write_bytes"])
                cell[1] += 1
        print(f"  {cache}: " + ", ".join(f"TN{last} {ok} of {n}" for last, (ok, n) in sorted(cells.items(), reverse=True)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
