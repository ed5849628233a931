"""What the naive path's P V GEMM writes to DRAM warm beyond what it writes cold, by the size of S: in the warm
run it follows the softmax, whose dirty P it finds in the L2. From ncu's bytes of every committed sweep:

    python benchmarks/gpu/naive_warm/pv_writes.py > benchmarks/gpu/naive_warm/pv_writes.txt
"""

import json
from pathlib import Path
from statistics import median

from simflash.config import MiB
from simflash.model.calibration import REGIME_SWEEPS

ROOT = Path(__file__).resolve().parents[1]
BANDS = ((20, 36), (36, 56), (56, 100), (100, 1024))  # MiB of S (heads x N^2 x 2 bytes)


def gemm_pv_writes(entry: dict) -> int:
    return next(k["dram_write_bytes"] for k in entry["kernels"] if k["kernel"] == "gemm_pv")


def main() -> None:
    extra = []  # (MiB of S, N, warm - cold MiB)
    for sweep in REGIME_SWEEPS:
        cold, warm = (json.loads((ROOT / f"{sweep}_{mode}.json").read_text())["configs"] for mode in ("cold", "warm"))
        for c, w in zip(cold, warm):
            config = c["config"]
            if config["algorithm"] == "naive":
                s_mib = config["heads"] * config["n"] ** 2 * 2 / MiB
                extra.append((s_mib, config["n"], (gemm_pv_writes(w) - gemm_pv_writes(c)) / MiB))
    print("S (MiB)      rows  N          warm - cold gemm_pv DRAM writes (MiB): min  median  max")
    for low, high in BANDS:
        band = [(n, e) for s, n, e in extra if low <= s < high]
        values = [e for _, e in band]
        print(f"{low:>4} to {high:<5} {len(band):>4}  {min(n for n, _ in band):>5}-{max(n for n, _ in band):<5}"
              f"  {min(values):>41.1f}  {median(values):6.1f}  {max(values):4.1f}")


if __name__ == "__main__":
    main()
