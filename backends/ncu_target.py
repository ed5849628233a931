"""The program Nsight Compute profiles (see simflash.backends.profile).

    python -m simflash.backends.ncu_target SPEC.json RESULT.json

For each configuration in SPEC: inputs are drawn and every kernel runs once unprofiled (compiling
it, and running the instrumented builds for their byte counts); then, inside one profiler range, the
naive path's three kernels (when asked for) and the FA-2 kernel's timed build, in that order. RESULT
gets the instrumented counts. Nothing is printed: ncu's CSV report owns standard output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.kernels import Flash2Kernel, import_cupy
from simflash.backends.naive import NaivePath
from simflash.backends.validate import ledger_rows
from simflash.memory import Flow, Traffic
from simflash.schedule import TileSchedule

DTYPE = "float16"  # the naive path's GEMMs run float16 only


def run_config(config: dict, seed: int) -> dict:
    cupy = import_cupy()
    heads, n, d = config["heads"], config["n"], config["d"]
    rng = cupy.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((heads, n, d), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    sched = TileSchedule(n, n, config["block_q"], config["block_kv"], causal=config["causal"],
                         causal_variant=config["causal_variant"])
    scale = 1.0 / float(np.sqrt(d))
    timed = Flash2Kernel(DTYPE, config["block_q"], config["block_kv"], d, instrumented=False)
    counting = Flash2Kernel(DTYPE, config["block_q"], config["block_kv"], d, instrumented=True)
    O = poisoned_output(Q.shape, DTYPE)
    counters = cupy.zeros(4, dtype=cupy.uint64)
    launch(counting, Q, K, V, O, sched, scale, counters)
    read_Q, read_K, read_V, written_O = (int(c) for c in counters.get())
    flash = Traffic({("flash2_forward", "Q"): Flow(read_bytes=read_Q), ("flash2_forward", "K"): Flow(read_bytes=read_K),
                     ("flash2_forward", "V"): Flow(read_bytes=read_V), ("flash2_forward", "O"): Flow(write_bytes=written_O)})
    launch(timed, Q, K, V, O, sched, scale)
    result = {"config": config, "flash_instrumented": ledger_rows(flash)}

    path = None
    if config["naive"]:
        path = NaivePath(Q, K, V, sched, scale, instrumented=True)
        path.run()
        result["naive_ledger"] = ledger_rows(path.traffic())
        path.instrumented = False
        path.run()
    cupy.cuda.Device().synchronize()

    cupy.cuda.runtime.profilerStart()
    if path is not None:
        path.run()
    launch(timed, Q, K, V, O, sched, scale)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    return result


def main(argv: list[str], run=run_config) -> None:
    """SPEC's configurations through `run` (one per configuration), in order; RESULT gets what each returned."""
    spec = json.loads(Path(argv[0]).read_text())
    cupy = import_cupy()
    results = []
    for index, config in enumerate(spec["configs"]):
        results.append(run(config, spec["seed"] + index))
        cupy.get_default_memory_pool().free_all_blocks()
    Path(argv[1]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
