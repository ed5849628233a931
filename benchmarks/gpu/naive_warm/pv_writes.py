"""What the naive path's P V GEMM writes to DRAM warm beyond what it writes cold, by the size of S: in the warm
run it follows the softmax, whose dirty P it finds in the L2. And the pace of its warm writes: its DRAM bytes
written over its duration. From ncu's bytes and durations of every committed sweep:

    python benchmarks/gpu/naive_warm/pv_writes.py > benchmarks/gpu/naive_warm/pv_writes.txt
"""

import json
from pathlib import Path
from statistics import median

from simflash.config import MiB
from simflash.model.calibration import REGIME_SWEEPS

ROOT = Path(__file__).resolve().parents[1]
BANDS = ((12, 20), (20, 36), (36, 56), (56, 100), (100, 1024))  # MiB of S (heads x N^2 x 2 bytes)


def gemm_pv(entry: dict) -> dict:
    return next(k for k in entry["kernels"] if k["kernel"] == "gemm_pv")


def main() -> None:
    extra = []  # (MiB of S, N, warm - cold MiB, warm GB/s)
    for sweep in REGIME_SWEEPS:
        cold, warm = (json.loads((ROOT / f"{sweep}_{mode}.json").read_text())["configs"] for mode in ("cold", "warm"))
        for c, w in zip(cold, warm):
            config = c["config"]
            if config["algorithm"] == "naive":
                s_mib = config["heads"] * config["n"] ** 2 * 2 / MiB
                pv_cold, pv_warm = gemm_pv(c), gemm_pv(w)
                extra.append((s_mib, config["n"], (pv_warm["dram_write_bytes"] - pv_cold["dram_write_bytes"]) / MiB,
                              pv_warm["dram_write_bytes"] / pv_warm["time_s"] / 1e9))
    print("S (MiB)      rows  N          warm - cold gemm_pv DRAM writes (MiB): min  median  max"
          "   warm writes' pace (GB/s): min  median  max")
    for low, high in BANDS:
        band = [(n, e, pace) for s, n, e, pace in extra if low <= s < high]
        values, paces = [e for _, e, _ in band], [pace for _, _, pace in band]
        print(f"{low:>4} to {high:<5} {len(band):>4}  {min(n for n, _, _ in band):>5}-{max(n for n, _, _ in band):<5}"
              f"  {min(values):>41.1f}  {median(values):6.1f}  {max(values):4.1f}"
              f"  {min(paces):>30.0f}  {median(paces):6.0f}  {max(paces):4.0f}")


if __name__ == "__main__":
    main()
