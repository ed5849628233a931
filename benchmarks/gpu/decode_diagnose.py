"""Where a batch-1 decode step's time goes (32 query / 8 K/V heads, d = 128, fp16, FA-2's heuristic
split count): the split kernel alone and the whole step (split + combine), each as a graph of
back-to-back steps and as one cold call (decode_bench's two timers), with the split kernel's
shared-memory carve-out left to the driver and set to the largest (what the backend sets).

    python3 benchmarks/gpu/decode_diagnose.py OUT.json
"""

from __future__ import annotations

import json
import sys

import cupy
import numpy as np
from simflash.backends import decode_bench as bench
from simflash.backends.bench import time_ms
from simflash.backends.decoding import DecodePath, split_schedule

import simflash as sf

LENGTHS = (32768, 65536, 131072)
PEAK = sf.GPUS["H200"].hbm_bytes_per_s
CARVEOUTS = {"driver's choice": -1, "largest": 100}  # cudaFuncAttributePreferredSharedMemoryCarveout


def main(out: str) -> None:
    configs = [bench.DecodeBenchConfig(1, 32, 8, n) for n in LENGTHS]
    inputs = bench.Inputs.for_configs(configs, seed=1)
    scratch = cupy.zeros(4 * inputs.l2_bytes, dtype=cupy.uint8)
    rows = []
    for c in configs:
        sets = [inputs.arrays(c, copy) for copy in range(inputs.copies(c))]
        sched = split_schedule(c.batch, c.heads, c.kv_heads, 1, c.n_kv, c.d)
        paths = [DecodePath(Q, K, V, c.batch, sched, 1.0 / float(np.sqrt(c.d)), bench.DTYPE) for Q, K, V in sets]
        split = paths[0].split_kernel.function()
        for label, carveout in CARVEOUTS.items():
            split.preferred_shared_memory_carveout = carveout
            for kernels, fns in (("split", [p.launch_split for p in paths]), ("split + combine", [p.run for p in paths])):
                cold = time_ms(fns[0], scratch.max, **bench.TIMING)
                graph = bench.time_cupy_steps(fns, cold["ms"])
                rows.append({"n_kv": c.n_kv, "num_splits": sched.num_splits, "carveout": label, "kernels": kernels,
                             "graph_us": 1e3 * graph["ms"], "cold_us": 1e3 * cold["ms"],
                             "graph_pct_hbm_peak": 100 * c.kv_bytes / (graph["ms"] * 1e-3) / PEAK,
                             "cold_pct_hbm_peak": 100 * c.kv_bytes / (cold["ms"] * 1e-3) / PEAK})
                r = rows[-1]
                print(f"{c.n_kv // 1024:>4}k {label:>15} {kernels:>16}: graph {r['graph_us']:7.1f} us "
                      f"({r['graph_pct_hbm_peak']:.1f}%), cold {r['cold_us']:7.1f} us ({r['cold_pct_hbm_peak']:.1f}%)")
        split.preferred_shared_memory_carveout = CARVEOUTS["largest"]
    with open(out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
