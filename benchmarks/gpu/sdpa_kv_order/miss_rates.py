"""How much of SDPA's K and V re-reading misses the L2, measured and predicted, by head dimension and mask.

Each CTA reads K and V tiles the L2 mostly holds already: with N query tiles per head, every K and V
tile is read by up to N CTAs and DRAM sees it once when nothing misses. The miss rate here is the share
of those re-reads that went to DRAM: (DRAM reads - compulsory Q + K + V) / (logical reads - compulsory),
from ncu's bytes (measured) and from the whole-chip model's (predicted), over every committed sweep's
SDPA rows (the reports `simflash physical-validate` saves), cold L2:

    python benchmarks/gpu/sdpa_kv_order/miss_rates.py > benchmarks/gpu/sdpa_kv_order/miss_rates.txt
"""

from __future__ import annotations

import json
from pathlib import Path

from simflash.chip import kernel_profile
from simflash.config import MiB
from simflash.model.calibration import REGIME_REPORTS
from simflash.model.traffic import flash_traffic

ROOT = Path(__file__).resolve().parents[1]
ITEMSIZE = 2  # the sweeps are float16


def logical_reads(n: int, d: int, heads: int, causal: bool) -> int:
    """The FA-2 ledger's reads at SDPA's own tiles: Q once per CTA, a K and a V tile per KV tile step."""
    block_q, block_kv = kernel_profile("sdpa_flash").tiles(d)
    return flash_traffic(n, d, block_q, block_kv, causal=causal, heads=heads).read_bytes


def main() -> None:
    rows = {}
    for name in REGIME_REPORTS.values():
        for row in json.loads((ROOT / name).read_text())["rows"]:
            c = row["config"]
            if row["implementation"] == "sdpa_flash" and row["cache"] == "cold":
                rows[c["d"], c["causal"], c["n"], c["heads"]] = row
    print("d    mask    N        heads  K+V/head MiB  re-reads MiB  missed: measured  predicted")
    for (d, causal, n, heads), row in sorted(rows.items()):
        compulsory = 3 * heads * n * d * ITEMSIZE
        rereads = logical_reads(n, d, heads, causal) - compulsory
        measured, predicted = ((row[k]["dram_read_bytes"] - compulsory) / rereads for k in ("measured", "predicted"))
        print(f"{d:<4} {'causal' if causal else 'none':<7} {n:<8} {heads:<6} {2 * n * d * ITEMSIZE / MiB:>12.1f}"
              f"  {rereads / MiB:>12.0f}  {measured:>16.2%}  {predicted:>9.2%}")


if __name__ == "__main__":
    main()
