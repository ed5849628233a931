"""SDPA's DRAM reads with its KV tiles walked from the last down, as the model plays them, or from the first.

FlashAttention-2's `flash_fwd_kernel` iterates its KV blocks in reverse (n_block from n_block_max - 1
down), and the whole-chip model plays SDPA's CTAs that way (`kv_descending` in simflash.chip); simflash's
own kernel walks them from the first. Without a mask the order does not matter in lock-step (every CTA
of a head is on the same tile); with one, each CTA starts at its own diagonal. This replays SDPA's rows
of every committed sweep both ways and counts the DRAM read rows within 10% / 1 MiB of ncu's, by head
dimension and mask, with the absolute log error of the causal rows:

    python benchmarks/gpu/sdpa_kv_order/kv_order.py > benchmarks/gpu/sdpa_kv_order/kv_order.txt
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.algorithms.flash2 import flash2_grid, flash2_program
from simflash.chip import kernel_profile, l2_cache, resident_ctas
from simflash.config import gpu_spec
from simflash.grid import run_programs
from simflash.model.calibration import REGIME_SWEEPS, within
from simflash.schedule import TileSchedule

ROOT = Path(__file__).resolve().parents[1]


def dram_reads(n: int, d: int, heads: int, causal: bool, cache: str, descending: bool) -> int:
    spec, profile = gpu_spec("H200"), kernel_profile("sdpa_flash")
    block_q, block_kv = profile.tiles(d)
    sched = TileSchedule(n, n, block_q, block_kv, causal=causal)
    ctas = flash2_grid(sched, heads, longest_first=profile.longest_first, kv_descending=descending)
    l2 = l2_cache(spec)
    l2.flush(residue=cache == "cold")
    l2.kernel = FLASH_ALGORITHMS["fa2"].kernel
    programs = (flash2_program(sched, c, d, 2, kv_descending=descending) for c in ctas)
    run_programs(programs, resident_ctas(spec, profile, block_q, block_kv, d, 2), l2)
    l2.end_kernel()
    return l2.traffic().by_kernel[FLASH_ALGORITHMS["fa2"].kernel].dram_read_bytes


def main() -> None:
    passed = {False: Counter(), True: Counter()}
    causal_log_errors: dict[bool, list[float]] = {False: [], True: []}
    rows = Counter()
    for sweep in REGIME_SWEEPS:
        for cache in ("cold", "warm"):
            for entry in json.loads((ROOT / f"{sweep}_{cache}.json").read_text())["configs"]:
                c = entry["config"]
                if c["algorithm"] != "sdpa_flash":
                    continue
                measured = entry["kernels"][0]["dram_read_bytes"]
                key = (c["d"], c["causal"])
                rows[key] += 1
                errors = []
                for descending in (False, True):
                    predicted = dram_reads(c["n"], c["d"], c["heads"], c["causal"], cache, descending)
                    passed[descending][key] += within(predicted, measured)
                    if c["causal"]:
                        causal_log_errors[descending].append(abs(math.log(predicted / measured)))
                    errors.append(f"{(predicted - measured) / measured:+.2f}")
                print(f"{sweep} {cache} N={c['n']} H={c['heads']} d={c['d']} causal={c['causal']}: "
                      f"read error ascending {errors[0]}, descending {errors[1]}", flush=True)
    for key in sorted(rows):
        print(f"d={key[0]} causal={key[1]}: within 10% / 1 MiB, ascending {passed[False][key]} / {rows[key]}, "
              f"descending {passed[True][key]} / {rows[key]}")
    print(f"all: ascending {sum(passed[False].values())} / {sum(rows.values())}, "
          f"descending {sum(passed[True].values())} / {sum(rows.values())}")
    for descending, name in ((False, "ascending"), (True, "descending")):
        errors = causal_log_errors[descending]
        print(f"causal rows, |log(predicted / measured)| {name}: median {statistics.median(errors):.2f}, "
              f"mean {statistics.mean(errors):.2f}, worst {max(errors):.2f}")


if __name__ == "__main__":
    main()
