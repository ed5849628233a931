"""The program Nsight Compute profiles for the whole-chip calibration sweep (simflash.backends.calibrate).

    python -m simflash.backends.calibrate_target SPEC.json RESULT.json

SPEC holds the cache mode and the configurations. For each configuration the kernels run once
unprofiled (compiling them, warming the libraries); then, in cache mode "warm", a read-only flush (a
reduction over a buffer several times the L2) leaves the L2 holding only clean lines of no tensor of
ours; then, inside the profiler range, a marker kernel (so the report can be cut into groups) and the
group: the naive path's three kernels, our FA-2 kernel, or PyTorch SDPA's flash forward. In mode
"cold" ncu flushes before every kernel itself (--cache-control all). With `time` set in SPEC, nothing
is profiled: each group is timed with CUDA events instead (median of repeats), warm from the flush.
Nothing is printed: ncu's CSV report owns standard output.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.kernels import Flash2Kernel, import_cupy
from simflash.backends.naive import NaivePath
from simflash.schedule import TileSchedule

FLUSH_BYTES = 512 * 1024**2  # several times any L2 we model
MARKER = "simflash_group_marker"


def _group(config: dict, seed: int):
    """A callable that launches the configuration's kernels once, inputs drawn on the device."""
    cupy = import_cupy()
    heads, n, d = config["heads"], config["n"], config["d"]
    rng = cupy.random.default_rng(seed)
    scale = 1.0 / float(np.sqrt(d))
    if config["algorithm"] == "sdpa_flash":
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))

        def run_sdpa() -> None:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=config["causal"])
        return run_sdpa
    Q, K, V = (rng.standard_normal((heads, n, d), dtype=cupy.float32).astype(cupy.float16).view(cupy.uint16)
               for _ in range(3))
    sched = TileSchedule(n, n, config["block_q"], config["block_kv"], causal=config["causal"])
    if config["algorithm"] == "naive":
        path = NaivePath(Q, K, V, TileSchedule(n, n, n, n, causal=config["causal"]), scale)
        return path.run
    kernel = Flash2Kernel("float16", config["block_q"], config["block_kv"], d, instrumented=False)
    O = poisoned_output(Q.shape, "float16")
    kernel.function()  # compile and set the shared-memory limit before any timed or profiled launch
    return lambda: launch(kernel, Q, K, V, O, sched, scale)


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    cupy = import_cupy()
    flush_buffer = cupy.ones(FLUSH_BYTES // 4, dtype=cupy.float32)
    marker_buffer = cupy.zeros(32, dtype=cupy.float32)
    marker = cupy.ElementwiseKernel("", "float32 x", "x += 1.0f", MARKER)
    results = []
    for index, config in enumerate(spec["configs"]):
        run = _group(config, spec["seed"] + index)
        run()  # warm-up: compile, pick cuBLAS algorithms, load libraries
        cupy.cuda.Device().synchronize()
        if spec.get("time"):
            results.append({"config": config, **_time(run, flush_buffer)})
        else:
            if spec["cache"] == "warm":
                float(flush_buffer.sum())  # read-only: dirty lines are written back, the L2 ends clean
            profile_marked(run, marker, marker_buffer)
            results.append({"config": config})
        release_memory()
    Path(argv[1]).write_text(json.dumps(results))


def profile_marked(run, marker, marker_buffer) -> None:
    """One profiled group: the marker kernel (where the profile is cut into groups), then `run`."""
    cupy = import_cupy()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    marker(marker_buffer)
    run()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()


def release_memory() -> None:
    """Give the last configuration's buffers back, CuPy's pool and PyTorch's cache alike."""
    import_cupy().get_default_memory_pool().free_all_blocks()
    try:
        import torch
        torch.cuda.empty_cache()
    except ImportError:
        pass


def _time(run, flush_buffer, repeats: int = 5) -> dict:
    """Median device time of one group launch, each preceded by the read-only flush."""
    cupy = import_cupy()
    times = []
    for _ in range(repeats):
        float(flush_buffer.sum())
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
    return {"time_s": statistics.median(times), "min_time_s": min(times), "repeats": repeats}


if __name__ == "__main__":
    main(sys.argv[1:])
