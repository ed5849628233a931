"""Which cuBLAS kernel ran the naive path's P V GEMM, and how well the model's one tiling predicts it, from the
committed sweeps (the ncu kernel names of each configuration's gemm_pv) and validation reports, warm, the
rows no figure was fitted on. Per head dimension and cuBLAS tile (nvjet_sm90_hsh_MxN: M of O's d columns and N
of its rows per CTA), cluster shape and raster: rows whose DRAM writes are within 10% / 1 MiB, predicted low,
predicted high, and whose reads are within; then the split-K rows one by one. Second table: the dirty MiB the
softmax leaves in the L2 at its end, cold (P written + the flush residue - DRAM writes; the model's
l2_flush_residue_bytes for both), measured and predicted, by N.

    python benchmarks/gpu/naive_warm/pv_kernels.py > benchmarks/gpu/naive_warm/pv_kernels.txt
"""

import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unseen_counts import report

from simflash.config import MiB, gpu_spec
from simflash.model.calibration import REGIME_REPORTS, within

SWEEPS = Path(__file__).resolve().parents[1]
TILE = re.compile(r"nvjet_sm90_hsh_(\d+)x(\d+)_64x\d+_(\dx\d)_(\w)_")


def kernel_names(cache: str, kernel: str = "gemm_pv", sweeps: Iterable[str] = REGIME_REPORTS) -> dict[tuple, list[str]]:
    """{(sweep, heads, n, d, causal): the ncu kernel names of the configuration's `kernel`}."""
    names = {}
    for sweep in sweeps:
        for entry in json.loads((SWEEPS / f"{sweep}_{cache}.json").read_text())["configs"]:
            c = entry["config"]
            if c["algorithm"] == "naive":
                (ran,) = (k for k in entry["kernels"] if k["kernel"] == kernel)
                names[sweep, c["heads"], c["n"], c["d"], c["causal"]] = ran["ncu_kernels"]
    return names


def unseen_naive_rows() -> list[tuple[str, dict]]:
    """(sweep, report row) of each naive row outside the calibration fit set, the reports read once."""
    return [(sweep, row) for sweep, name in REGIME_REPORTS.items() for row in report(name, None)["rows"]
            if row["implementation"] == "naive" and row["subset"] != "fit"]


def of(rows: list[tuple[str, dict]], kernel: str, cache: str) -> list[tuple[str, dict]]:
    """Those of `rows` of one kernel and cache mode."""
    return [(sweep, row) for sweep, row in rows if row["kernel"] == kernel and row["cache"] == cache]


def pv_table(rows: list[tuple[str, dict]]) -> None:
    names = kernel_names("warm")
    cells: dict[tuple, Counter] = defaultdict(Counter)
    split = []
    for sweep, row in of(rows, "gemm_pv", "warm"):
        c, p, m = row["config"], row["predicted"], row["measured"]
        ran = names[sweep, c["heads"], c["n"], c["d"], c["causal"]]
        tile = TILE.search(ran[0])
        key = (c["d"], int(tile[1]), tile[3], tile[4])
        written_ok = within(p["dram_write_bytes"], m["dram_write_bytes"])
        cell = cells[key]
        cell["rows"] += 1
        cell["writes within"] += written_ok
        cell["writes low"] += not written_ok and p["dram_write_bytes"] < m["dram_write_bytes"]
        cell["writes high"] += not written_ok and p["dram_write_bytes"] > m["dram_write_bytes"]
        cell["reads within"] += within(p["dram_read_bytes"], m["dram_read_bytes"])
        if any("splitK" in n for n in ran):
            split.append((c, p, m, ran))
    print("P V GEMM, warm, unseen rows, by the cuBLAS kernel that ran (d, tile M = d columns of O per CTA, cluster,"
          " raster):")
    print("   d   M cluster raster | rows | writes within  low  high | reads within")
    for (d, m, cluster, raster), cell in sorted(cells.items()):
        print(f"{d:4d} {m:3d} {cluster:>7s} {raster:>6s} | {cell['rows']:4d} | {cell['writes within']:13d} "
              f"{cell['writes low']:4d} {cell['writes high']:5d} | {cell['reads within']:12d}")
    total = sum(cells.values(), Counter())
    print(f"{'all':>22s} | {total['rows']:4d} | {total['writes within']:13d} {total['writes low']:4d} "
          f"{total['writes high']:5d} | {total['reads within']:12d}")
    print("split-K (a second kernel reduces the partial sums): DRAM MiB measured / predicted")
    for c, p, m, ran in split:
        print(f"  heads {c['heads']} N {c['n']} d {c['d']}: reads {m['dram_read_bytes'] / MiB:.1f} / "
              f"{p['dram_read_bytes'] / MiB:.1f}, writes {m['dram_write_bytes'] / MiB:.1f} / "
              f"{p['dram_write_bytes'] / MiB:.1f}  ({' + '.join(n.split('(')[0][:60] for n in ran)})")


def softmax_table(rows: list[tuple[str, dict]]) -> None:
    residue = gpu_spec("H200").calibration["l2_flush_residue_bytes"] / MiB
    bands: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for _, row in of(rows, "softmax", "cold"):
        c = row["config"]
        written = c["heads"] * c["n"] ** 2 * 2 / MiB  # P, no mask
        if c["causal"] or written < 40:  # the L2 full of P by the end
            continue
        band = 1024 if c["n"] < 2048 else 2048 * (c["n"] // 2048)
        bands[band].append(tuple(written + residue - row[side]["dram_write_bytes"] / MiB
                                 for side in ("measured", "predicted")))
    print("\nSoftmax, cold, unseen rows without the mask, P of 40 MiB or more: MiB of P still dirty in the L2 at its"
          " end, median (range), by N")
    print("          N | rows | measured            | predicted")
    for band, pairs in sorted(bands.items()):
        label = "< 2048" if band == 1024 else f"{band}-{band + 2047}"
        measured, predicted = zip(*pairs)
        print(f"{label:>11s} | {len(pairs):4d} | {statistics.median(measured):5.1f} ({min(measured):4.1f}-"
              f"{max(measured):4.1f}) | {statistics.median(predicted):5.1f} ({min(predicted):4.1f}-"
              f"{max(predicted):4.1f})")


if __name__ == "__main__":
    naive_rows = unseen_naive_rows()
    pv_table(naive_rows)
    softmax_table(naive_rows)
