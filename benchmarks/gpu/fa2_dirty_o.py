"""How much of O simflash's FA-2 kernel leaves dirty in the L2 at its end, measured and predicted, from the
committed validation reports of the eight regime sweeps (every row, fit set included): O written less the
kernel's DRAM writes (the flush residue in cold rows: the model's figure, as measured), rows whose O is 12 MiB
or more. By cache mode, head dimension, mask, and whether one head's K + V outgrows 20 MiB; with the rows whose
DRAM writes are within 10% / 1 MiB.

    python benchmarks/gpu/fa2_dirty_o.py > benchmarks/gpu/fa2_dirty_o.txt
"""

import json
import statistics
from collections import defaultdict
from pathlib import Path

from simflash.config import MiB, gpu_spec
from simflash.model.calibration import REGIME_REPORTS, within

ROOT = Path(__file__).resolve().parent


def main() -> None:
    residue = gpu_spec("H200").calibration["l2_flush_residue_bytes"]
    groups: dict[tuple, list[tuple[float, float, bool]]] = defaultdict(list)
    for name in REGIME_REPORTS.values():
        for row in json.loads((ROOT / name).read_text())["rows"]:
            c = row["config"]
            o_bytes = c["n"] * c["heads"] * c["d"] * 2
            if row["implementation"] != "fa2" or o_bytes < 12 * MiB:
                continue
            written = o_bytes + (residue if row["cache"] == "cold" else 0)
            measured, predicted = (row[side]["dram_write_bytes"] for side in ("measured", "predicted"))
            kv = "over 20" if 2 * c["n"] * c["d"] * 2 > 20 * MiB else "20 or less"
            groups[row["cache"], c["d"], c["causal"], kv].append(
                ((written - measured) / MiB, (written - predicted) / MiB, within(predicted, measured)))
    print("simflash's FA-2 kernel, O of 12 MiB or more: MiB of O still dirty in the L2 at its end, median (range)")
    print("cache   d  mask  K+V a head (MiB) | rows | measured          | predicted         | writes within")
    for (cache, d, causal, kv), rows in sorted(groups.items()):
        measured, predicted, ok = zip(*rows)
        cells = [f"{statistics.median(v):5.1f} ({min(v):4.1f}-{max(v):4.1f})" for v in (measured, predicted)]
        print(f"{cache:5s} {d:3d}  {'yes' if causal else 'no ':4s} {kv:>16s} | {len(rows):4d} | {cells[0]:17s} | "
              f"{cells[1]:17s} | {sum(ok):4d}")


if __name__ == "__main__":
    main()
