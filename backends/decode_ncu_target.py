"""The program Nsight Compute profiles for the Flash-Decoding kernels (see simflash.backends.decode_bench).

    python -m simflash.backends.decode_ncu_target SPEC.json RESULT.json

For each configuration in SPEC (a DecodeBenchConfig as a dict): inputs are drawn, the instrumented
build runs once for its byte counts and the timed build once to compile it; then, inside one profiler
range, the timed build's split kernel and (several splits) its combine. RESULT gets, per configuration,
the split count, the kernels launched and the instrumented counts. Nothing is printed: ncu's CSV
report owns standard output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from simflash.backends.decode_bench import DTYPE, DecodeBenchConfig, Inputs, counted_entry
from simflash.backends.decoding import DecodePath, split_schedule
from simflash.backends.kernels import import_cupy


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    cupy = import_cupy()
    results = []
    for index, entry in enumerate(spec["configs"]):
        c = DecodeBenchConfig(**entry)
        Q, K, V = Inputs.for_configs([c], spec["seed"] + index).arrays(c)
        sched = split_schedule(c.batch, c.batch * c.heads, c.batch * c.kv_heads, 1, c.n_kv, c.d)
        scale = 1.0 / float(np.sqrt(c.d))
        counting = DecodePath(Q, K, V, c.batch, sched, scale, DTYPE, instrumented=True)
        counting.run()
        results.append(counted_entry(entry, counting))
        timed = DecodePath(Q, K, V, c.batch, sched, scale, DTYPE)
        timed.run()
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.profilerStart()
        timed.run()
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.profilerStop()
        del Q, K, V, counting, timed
        cupy.get_default_memory_pool().free_all_blocks()
    Path(argv[1]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
