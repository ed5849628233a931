"""Timing on the GPU: the FA-2 kernel's versions against PyTorch SDPA's FLASH, cuDNN and EFFICIENT
backends in the same process, on the same inputs, with the same timer (CUDA events around each call,
median of repeats after a warm-up).

Per configuration: TFLOP/s (FLOPs = 4 B H N^2 d, halved when causal) of each kernel version at each
tile shape and its share of the GPU's peak from simflash.config.GPUS, the ratio of the first version
to SDPA flash, the naive three-kernel path, achieved bandwidth (logical bytes / time, and DRAM bytes /
time where a profile measured them) against HBM peak, and the largest absolute difference of each
output from SDPA's math backend.
"""

from __future__ import annotations

import functools
import statistics

import attrs
import numpy as np

import simflash as sf
from simflash.backends.flash2 import builds, kernel_version, launch, poisoned_output
from simflash.backends.kernels import import_cupy
from simflash.backends.naive import NaivePath
from simflash.schedule import TileSchedule

BENCH_N = (1024, 4096, 16384)
BENCH_D = (64, 128)
BENCH_HEADS = 32
DTYPE = "float16"
MIN_TOTAL_MS = 200.0  # repeat until the timed calls add up to about this
REPS = (5, 50)  # fewest and most timed calls


@attrs.frozen
class BenchConfig:
    n: int
    d: int
    heads: int = BENCH_HEADS
    causal: bool = False

    @property
    def flops(self) -> int:
        full = 4 * self.heads * self.n * self.n * self.d
        return full // 2 if self.causal else full


HOLD_NS = 200_000  # the GPU waits this long ahead of each timed call: longer than a call takes to enqueue
HOLD_SOURCE = r"""
extern "C" __global__ void hold(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); while (now - start < ns);
}
"""


@functools.cache
def _hold_kernel():
    return import_cupy().RawKernel(HOLD_SOURCE, "hold")


def hold_device(ns: int = HOLD_NS) -> None:
    """Queue a one-thread kernel that keeps the device busy for `ns` nanoseconds."""
    _hold_kernel()((1,), (1,), (np.uint64(ns),))


def time_once(fn) -> float:
    """Device milliseconds of one call of `fn`: CUDA events around it, queued behind hold_device."""
    cupy = import_cupy()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    hold_device()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop)


def time_ms(fn, before=None, min_total_ms: float = MIN_TOTAL_MS, reps: tuple[int, int] = REPS) -> dict:
    """Median milliseconds of `fn` on the device, CUDA events around each call, after a warm-up.
    before: run ahead of every call, outside the timed region (flushing a cache, say). The device is held
    busy (hold_device) just before the start event, so that the call is already queued when the event
    fires: the time is the device's alone, without the host's time to launch the call (which differs
    between a CuPy kernel and a PyTorch operator)."""
    cupy = import_cupy()
    for _ in range(2):
        fn()
    cupy.cuda.Device().synchronize()

    def once() -> float:
        if before is not None:
            before()
        return time_once(fn)

    first = once()
    count = int(min(reps[1], max(reps[0], min_total_ms // max(first, 1e-3))))
    times = [once() for _ in range(count)]
    return {"ms": statistics.median(times), "reps": count, "min_ms": min(times), "max_ms": max(times)}


def _torch():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    return torch, SDPBackend, sdpa_kernel


def bench_config(config: BenchConfig, seed: int, tiles: tuple[tuple[int, int], ...] = ((128, 64),),
                 naive_max_n: int = 16384, math_max_n: int = 4096, gpu: str = "H200",
                 dram: dict | None = None, versions: tuple[str, ...] = ("v1",)) -> dict:
    """Time one configuration every way; `dram` maps kernel -> DRAM bytes a profile measured for it.
    The first version's first tile shape is the headline ("fa2"); "versions" holds every version's, at
    the tile shapes it is built for."""
    cupy = import_cupy()
    c = config
    spec = sf.GPUS[gpu]
    peak_flops, peak_bytes = spec.peak_flops[DTYPE], spec.hbm_bytes_per_s
    rng = cupy.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((c.heads, c.n, c.d), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    scale = 1.0 / float(np.sqrt(c.d))
    row: dict = {"config": attrs.asdict(c), "flops": c.flops}

    def rate(timing: dict) -> dict:
        tflops = c.flops / (timing["ms"] * 1e-3) / 1e12
        return {**timing, "tflops": tflops, "pct_peak": 100 * tflops * 1e12 / peak_flops}

    def bandwidth(nbytes: int, timing: dict) -> dict:
        per_s = nbytes / (timing["ms"] * 1e-3)
        return {"bytes": nbytes, "GBps": per_s / 1e9, "pct_hbm_peak": 100 * per_s / peak_bytes}

    # -- each FA-2 kernel version, timed build, each tile shape asked for
    O = poisoned_output(Q.shape, DTYPE)
    outputs = {}
    row["versions"] = {}
    for version in versions:
        timings = row["versions"][version] = {}
        built = [(kernel_version(version)(DTYPE, block_q, block_kv, c.d), TileSchedule(c.n, c.n, block_q, block_kv,
                                                                                        causal=c.causal))
                 for block_q, block_kv in tiles if builds(version, block_q, block_kv, c.d)]
        if not built:
            raise ValueError(f"kernel version {version} is built for none of the tile shapes {list(tiles)} at d={c.d}")
        for kernel, sched in built:
            timing = rate(time_ms(functools.partial(launch, kernel, Q, K, V, O, sched, scale)))
            logical = sf.model.flash_traffic(c.n, c.d, kernel.block_q, kernel.block_kv, DTYPE, c.causal,
                                             heads=c.heads).total_bytes
            timing["logical_bandwidth"] = bandwidth(logical, timing)
            timings[f"{kernel.block_q}x{kernel.block_kv}"] = timing
        kernel, sched = built[0]
        launch(kernel, Q, K, V, O, sched, scale)
        outputs[version] = O.view(cupy.float16).copy()
    row["fa2"] = row["versions"][versions[0]]
    headline = next(iter(row["fa2"].values()))
    outputs["fa2"] = outputs[versions[0]]
    if dram and "flash2_forward" in dram:
        headline["dram_bandwidth"] = bandwidth(dram["flash2_forward"], headline)

    # -- the naive three-kernel path
    if c.n <= naive_max_n:
        path = NaivePath(Q, K, V, TileSchedule(c.n, c.n, c.n, c.n, causal=c.causal), scale, instrumented=True)
        path.run()  # the instrumented build counts the softmax's S reads and P writes
        counted = path.traffic().total_bytes
        path.instrumented = False
        timing = rate(time_ms(path.run))
        timing["logical_bandwidth"] = bandwidth(counted, timing)
        if dram and "naive" in dram:
            timing["dram_bandwidth"] = bandwidth(dram["naive"], timing)
        row["naive"] = timing
        outputs["naive"] = path.O.view(cupy.float16)
        del path

    # -- PyTorch SDPA on the same memory
    found = _torch()
    if found is None:
        row["sdpa"] = "torch is not installed"
    else:
        torch, SDPBackend, sdpa_kernel = found
        q, k, v = (torch.from_dlpack(x).view(1, c.heads, c.n, c.d) for x in (Q, K, V))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            row["sdpa_flash"] = rate(time_ms(lambda: sdpa(q, k, v, is_causal=c.causal)))
            outputs["sdpa_flash"] = cupy.from_dlpack(sdpa(q, k, v, is_causal=c.causal)).reshape(Q.shape)
        row["ratio_vs_sdpa_flash"] = headline["tflops"] / row["sdpa_flash"]["tflops"]
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    row[name] = rate(time_ms(lambda: sdpa(q, k, v, is_causal=c.causal)))
            except RuntimeError as error:  # a backend this build or input cannot run
                row[name] = f"refused: {str(error).splitlines()[0][:200]}"
        if c.n <= math_max_n:
            with sdpa_kernel(SDPBackend.MATH):
                math_out = cupy.from_dlpack(sdpa(q, k, v, is_causal=c.causal)).reshape(Q.shape).astype(cupy.float32)
            row["max_abs_vs_sdpa_math"] = {name: float(cupy.abs(out.astype(cupy.float32) - math_out).max())
                                           for name, out in outputs.items()}
        torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def bench(configs: list[BenchConfig], seed: int = 0, progress=None, dram: dict[tuple, dict] | None = None,
          **options) -> list[dict]:
    """Every configuration in turn; `dram` as from dram_by_config (a saved profile), when there is one."""
    rows = []
    for index, config in enumerate(configs):
        measured = (dram or {}).get((config.n, config.d, config.heads, config.causal))
        rows.append(bench_config(config, seed + index, dram=measured, **options))
        if progress is not None:
            progress(rows[-1])
    return rows


def dram_by_config(profile_result: dict) -> dict[tuple, dict]:
    """From a profile result: (n, d, heads, causal) -> {"flash2_forward": bytes, "naive": bytes}."""
    out = {}
    for entry in profile_result["configs"]:
        cfg = entry["config"]
        if cfg["causal_variant"] != "upper_left" or (cfg["block_q"], cfg["block_kv"]) != (128, 64):
            continue
        kernels = {row["kernel"]: row["dram_bytes"] for row in entry["kernels"]}
        found = {"flash2_forward": kernels["flash2_forward"]}
        if "softmax" in kernels:
            found["naive"] = kernels["gemm_qk"] + kernels["softmax"] + kernels["gemm_pv"]
        out[(cfg["n"], cfg["d"], cfg["heads"], cfg["causal"])] = found
    return out
