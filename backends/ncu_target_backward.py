"""The program Nsight Compute profiles for the backward (see simflash.backends.profile_backward).

    python -m simflash.backends.ncu_target_backward SPEC.json RESULT.json

For each configuration in SPEC: inputs are drawn, our forward kernel writes O and L, and every backward
kernel runs once unprofiled (compiling it; the instrumented builds for their byte counts), SDPA's flash
forward too; then, inside one profiler range, our three timed kernels and SDPA's flash backward, in that
order. RESULT gets the instrumented counts. Nothing is printed: ncu's CSV report owns standard output.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from simflash.backends import ncu_target
from simflash.backends.bench_backward import sdpa_backward
from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.flash2_backward import COUNTERS, FORWARD_TILES, BackwardBuffers, counted_traffic, launch_backward
from simflash.backends.kernels import Flash2BackwardKernels, Flash2Kernel, import_cupy
from simflash.backends.validate import ledger_rows
from simflash.schedule import TileSchedule

DTYPE = "float16"


def run_config(config: dict, seed: int) -> dict:
    import torch

    cupy = import_cupy()
    heads, n, d, causal = config["heads"], config["n"], config["d"], config["causal"]
    rng = cupy.random.default_rng(seed)
    Q, K, V, dO = (rng.standard_normal((heads, n, d), dtype=cupy.float32).astype(cupy.float16) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    O = poisoned_output(Q.shape, DTYPE)
    L = cupy.full((heads, n), np.nan, dtype=cupy.float32)
    launch(Flash2Kernel(DTYPE, *FORWARD_TILES, d), Q, K, V, O, TileSchedule(n, n, *FORWARD_TILES, causal=causal), scale, L=L)

    sched = TileSchedule(n, n, config["block_q"], config["block_kv"], causal=causal)
    b = BackwardBuffers.allocate(Q, K, V, O, dO, L, DTYPE)
    counters = cupy.zeros(COUNTERS, dtype=cupy.uint64)
    launch_backward(Flash2BackwardKernels(DTYPE, config["block_q"], config["block_kv"], d, instrumented=True), b, sched,
                    scale, counters)
    timed = Flash2BackwardKernels(DTYPE, config["block_q"], config["block_kv"], d)
    launch_backward(timed, b, sched, scale)
    q, k, v, g = (torch.from_dlpack(x).view(1, heads, n, d) for x in (Q, K, V, dO))
    call, how = sdpa_backward(q, k, v, g, causal, scale)  # runs SDPA's forward and one backward
    cupy.cuda.Device().synchronize()

    cupy.cuda.runtime.profilerStart()
    launch_backward(timed, b, sched, scale)
    call()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    return {"config": config, "instrumented": ledger_rows(counted_traffic(counters.get())), "sdpa_call": how}


if __name__ == "__main__":
    ncu_target.main(sys.argv[1:], run_config)
