"""Why the naive P V GEMM writes back more of O than the model, cold: cuBLAS's CTAs take its output tiles in rounds
of one tile an SM, and the O of the rounds before the last goes out under the P the later rounds stream in. The
tile (its rows of O, from the ncu kernel name nvjet_sm90_hsh_MxN: N rows) is cuBLAS's choice, 64 to 288 rows,
where the model's CTAs take 256 (simflash.algorithms.naive.GEMM_TILE_ROWS), so where cuBLAS picks smaller tiles
the GEMM runs in more rounds than the model's waves.

Every sweep's naive gemm_pv rows, cold, with O of 3 MiB or more: O written back during the kernel (DRAM writes
less the flush residue, l2_flush_residue_bytes), measured and predicted, beside O less the last round's share of
it (rounds of sm_count tiles): what a GEMM whose earlier rounds' O all went out would write. By rounds.

    python benchmarks/gpu/naive_warm/pv_rounds.py > benchmarks/gpu/naive_warm/pv_rounds.txt
"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pv_kernels import TILE, kernel_names
from unseen_counts import report

from simflash.config import MiB, gpu_spec
from simflash.model.calibration import REPORTS


def rows() -> list[dict]:
    """One entry per gemm_pv cold row with O of 3 MiB or more, by cuBLAS's tile rounds."""
    spec = gpu_spec("H200")
    residue = spec.calibration["l2_flush_residue_bytes"] / MiB
    sweeps = [sweep for sweep in REPORTS if sweep != "splitkv"]  # splitkv: SDPA's grids only
    names = kernel_names("cold", sweeps=sweeps)
    out = []
    for sweep in sweeps:
        for row in report(REPORTS[sweep], None)["rows"]:
            c = row["config"]
            if row["implementation"] != "naive" or row["kernel"] != "gemm_pv" or row["cache"] != "cold":
                continue
            o = c["heads"] * c["n"] * c["d"] * 2 / MiB
            ran = names[sweep, c["heads"], c["n"], c["d"], c["causal"]][0]
            tile = TILE.search(ran)
            if o < 3 or tile is None or "splitK" in ran:
                continue
            tiles = c["heads"] * -(-c["n"] // int(tile[2]))
            rounds = -(-tiles // spec.sm_count)
            last = (tiles - (rounds - 1) * spec.sm_count) / tiles
            out.append({"rounds": rounds, "o": o, "earlier_rounds": o * (1 - last),
                        "measured": row["measured"]["dram_write_bytes"] / MiB - residue,
                        "predicted": row["predicted"]["dram_write_bytes"] / MiB - residue})
    return out


def main() -> None:
    by_rounds = defaultdict(list)
    for r in rows():
        by_rounds[min(r["rounds"], 4)].append(r)
    print("Naive P V GEMM, cold, O of 3 MiB or more: MiB of O written back during the kernel, median (range), by the")
    print("rounds of one tile an SM cuBLAS's tiles make; 'earlier rounds' is O less the last round's share")
    print("rounds | rows | measured            | predicted           | earlier rounds")
    for rounds, group in sorted(by_rounds.items()):
        cells = []
        for key in ("measured", "predicted", "earlier_rounds"):
            values = [r[key] for r in group]
            cells.append(f"{statistics.median(values):5.1f} ({min(values):5.1f} to {max(values):5.1f})")
        label = f"{rounds}" if rounds < 4 else "4+"
        print(f"{label:>6s} | {len(group):4d} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
