"""Decode-step bandwidth on the GPU: how fast each way of attending one new query token streams the KV cache.

One query token of 32 query heads over 8 K/V heads (grouped-query), d = 128, fp16; batch x K/V heads from
8 to 256 (and one K/V head of 4 query heads: 1), cache lengths 1k to 128k. In one process, on the same
inputs, with the same timer (bench.time_ms: CUDA events, a warm-up, the median of repeats; the L2 is
flushed before every call, so the cache streams from HBM as a decode step's does):

- our FA-2 kernel at T_r = 1: a group's query heads packed into one tile per K/V head, and unpacked (a
  CTA per query head, each reading its group's K/V);
- our Flash-Decoding: FA-2's heuristic split count on this GPU, and where the grid is small a sweep of
  split counts and FA-2's own KV tile (twice ours: one CTA an SM, see kernels.DECODE_BLOCK_KV);
- PyTorch SDPA with one query token (enable_gqa=True), whichever backend it picks (`sdpa_kernels`
  records the kernels it ran).

K/V bandwidth: the bytes of the K and V cache over the time of the whole step (both Flash-Decoding
kernels), in GB/s and as a share of the HBM peak of the machine file. `profile` runs the split and
combine kernels of a few configurations under Nsight Compute (decode_ncu_target.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import attrs
import numpy as np

import simflash as sf
from simflash.backends.bench import time_ms
from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.decoding import DecodePath, split_schedule
from simflash.backends.kernels import DECODE_BLOCK_KV, Flash2Kernel, import_cupy
from simflash.backends.profile import find_ncu, run_ncu
from simflash.backends.validate import ledger_rows
from simflash.schedule import TileSchedule

if TYPE_CHECKING:
    from simflash.backends.kernels import DeviceArray

BATCH_HEADS = ((1, 4, 1), (1, 32, 8), (4, 32, 8), (16, 32, 8), (32, 32, 8))  # (batch, H_q, H_kv)
LENGTHS = (1024, 4096, 16384, 32768, 65536, 131072)
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)  # the sweep, up to the KV tiles
SWEEP_MAX_BATCH_HEADS = 8  # sweep the split count where the grid is small without splits
D, DTYPE = 128, "float16"
FA2_TILES = (128, 64)  # our FA-2 kernel's defaults


class Timing(TypedDict):
    """time_ms's settings for these short kernels."""

    min_total_ms: float
    reps: tuple[int, int]


TIMING = Timing(min_total_ms=30.0, reps=(5, 30))
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum")


@attrs.frozen
class DecodeBenchConfig:
    batch: int
    heads: int  # query heads per batch element
    kv_heads: int  # K/V heads per batch element
    n_kv: int
    d: int = D

    @property
    def kv_bytes(self) -> int:
        """The K and V cache: what a decode step must stream."""
        return 2 * self.batch * self.kv_heads * self.n_kv * self.d * 2


def bench_configs(quick: bool = False) -> list[DecodeBenchConfig]:
    """batch x K/V heads 1..256 x cache lengths 1k..128k; quick: batch 1 x 8 K/V heads at 32k and 128k."""
    grid = [DecodeBenchConfig(b, h, kv, n) for b, h, kv in BATCH_HEADS for n in LENGTHS]
    return [c for c in grid if c.batch * c.kv_heads == 8 and c.n_kv in (32768, 131072)] if quick else grid


def random_fp16(rng, shape) -> object:
    """A device array of random float16 values as 16-bit patterns, drawn a slice at a time (no float32
    copy of the whole)."""
    cupy = import_cupy()
    out = cupy.empty(shape, dtype=cupy.uint16)
    flat = out.reshape(-1)
    step = 1 << 27
    for start in range(0, flat.size, step):
        piece = flat[start:start + step]
        piece[...] = rng.standard_normal(piece.size, dtype=cupy.float32).astype(cupy.float16).view(cupy.uint16)
    return out


@attrs.define
class Inputs:
    """One K/V cache buffer as large as the largest configuration; each configuration uses a prefix."""

    K_all: DeviceArray
    V_all: DeviceArray
    rng: object

    @classmethod
    def for_configs(cls, configs: list[DecodeBenchConfig], seed: int) -> Inputs:
        cupy = import_cupy()
        rng = cupy.random.default_rng(seed)
        size = max(c.batch * c.kv_heads * c.n_kv * c.d for c in configs)
        return cls(random_fp16(rng, size), random_fp16(rng, size), rng)

    def arrays(self, c: DecodeBenchConfig) -> tuple:
        """Q (batch x H_q, 1, d), fresh; K, V (batch x H_kv, n_kv, d), views of the cache buffers."""
        size = c.batch * c.kv_heads * c.n_kv * c.d
        shape = (c.batch * c.kv_heads, c.n_kv, c.d)
        return (random_fp16(self.rng, (c.batch * c.heads, 1, c.d)), self.K_all[:size].reshape(shape),
                self.V_all[:size].reshape(shape))


def _bandwidth(timing: dict, nbytes: int, peak: float) -> dict:
    per_s = nbytes / (timing["ms"] * 1e-3)
    return {**timing, "GBps": per_s / 1e9, "pct_hbm_peak": 100 * per_s / peak}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def sdpa_kernels(fn) -> list[str]:
    """The kernels one call of `fn` ran, by torch.profiler."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({event.key for event in prof.key_averages() if "CUDA" in str(getattr(event, "device_type", ""))
                   and getattr(event, "device_time_total", 0) > 0})


def bench_config(c: DecodeBenchConfig, inputs: Inputs, flush, gpu: str = "H200", sweep: bool = False) -> dict:
    """Time one configuration every way; outputs of ours against SDPA's, max abs. sweep: also the split
    sweep and FA-2's KV tile."""
    cupy = import_cupy()
    peak = sf.GPUS[gpu].hbm_bytes_per_s
    Q, K, V = inputs.arrays(c)
    scale = 1.0 / float(np.sqrt(c.d))
    group = c.heads // c.kv_heads
    row: dict = {"config": attrs.asdict(c), "kv_bytes": c.kv_bytes}
    outputs = {}

    # -- our FA-2 kernel, one query row: T_r = 1 packed or not
    kernel = Flash2Kernel(DTYPE, *FA2_TILES, c.d)
    for name, pack in (("fa2_packed", group), ("fa2_unpacked", 1)):
        sched = TileSchedule(1, c.n_kv, *FA2_TILES, pack=pack)
        O = poisoned_output(Q.shape, DTYPE)
        row[name] = _bandwidth(time_ms(functools.partial(launch, kernel, Q, K, V, O, sched, scale), flush, **TIMING),
                               c.kv_bytes, peak)
        row[name]["ctas"] = sched.n_q_tiles * c.batch * c.heads // pack
        outputs[name] = O

    # -- Flash-Decoding: FA-2's heuristic split count, then the sweep
    def decode(num_splits, block_kv=None):
        sched = split_schedule(c.batch, c.batch * c.heads, c.batch * c.kv_heads, 1, c.n_kv, c.d, num_splits, block_kv)
        path = DecodePath(Q, K, V, c.batch, sched, scale, DTYPE)
        timing = _bandwidth(time_ms(path.run, flush, **TIMING), c.kv_bytes, peak)
        return {"num_splits": sched.num_splits, "block_kv": sched.block_kv,
                "split_ctas": sched.n_q_tiles * sched.num_splits * c.batch * c.kv_heads, **timing}, path.O

    row["flash_decoding"], outputs["flash_decoding"] = decode(None)
    if sweep:
        tiles = -(-c.n_kv // DECODE_BLOCK_KV[c.d][0])
        row["flash_decoding_sweep"] = [decode(s)[0] for s in SPLITS if s <= tiles]
        row["flash_decoding_fa2_tile"] = decode(None, DECODE_BLOCK_KV[c.d][1])[0]

    # -- PyTorch SDPA on the same memory
    torch = _torch()
    if torch is None:
        row["sdpa"] = {"error": "torch is not installed"}
    else:
        q = torch.from_dlpack(Q.view(cupy.float16)).view(c.batch, c.heads, 1, c.d)
        k, v = (torch.from_dlpack(x.view(cupy.float16)).view(c.batch, c.kv_heads, c.n_kv, c.d) for x in (K, V))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        try:
            row["sdpa"] = _bandwidth(time_ms(lambda: sdpa(q, k, v, enable_gqa=True), flush, **TIMING), c.kv_bytes, peak)
            reference = cupy.from_dlpack(sdpa(q, k, v, enable_gqa=True)).reshape(Q.shape).astype(cupy.float32)
            row["max_abs_vs_sdpa"] = {name: float(cupy.abs(out.view(cupy.float16).astype(cupy.float32) - reference).max())
                                      for name, out in outputs.items()}
        except torch.OutOfMemoryError as error:
            row["sdpa"] = {"error": str(error).splitlines()[0][:200]}
        torch.cuda.empty_cache()
    return row


def bench(configs: list[DecodeBenchConfig], seed: int = 0, gpu: str = "H200", progress=None) -> dict:
    """Every configuration, in turn, on one cache buffer; the split sweep at batch x K/V heads up to
    SWEEP_MAX_BATCH_HEADS."""
    cupy = import_cupy()
    inputs = Inputs.for_configs(configs, seed)
    l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
    # Read before every timed call: the L2 then holds none of the cache, and the GPU is busy while the
    # host queues the call's kernels, so host launch time stays out of the measured span.
    scratch = cupy.zeros(4 * l2, dtype=cupy.uint8)

    def flush() -> None:
        scratch.max()

    rows = []
    for config in configs:
        rows.append(bench_config(config, inputs, flush, gpu,
                                 sweep=config.batch * config.kv_heads <= SWEEP_MAX_BATCH_HEADS))
        if progress is not None:
            progress(rows[-1])
    result = {"dtype": DTYPE, "hbm_peak_bytes_per_s": sf.GPUS[gpu].hbm_bytes_per_s, "gpu": gpu, "rows": rows}
    torch = _torch()
    first = next((c for c in configs if c.batch * c.kv_heads == 8), None)
    if torch is not None and first is not None:
        Q, K, V = inputs.arrays(first)
        q = torch.from_dlpack(Q.view(cupy.float16)).view(first.batch, first.heads, 1, first.d)
        k, v = (torch.from_dlpack(x.view(cupy.float16)).view(first.batch, first.kv_heads, first.n_kv, first.d) for x in (K, V))
        result["sdpa_kernels"] = {"config": attrs.asdict(first), "kernels": sdpa_kernels(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))}
    return result


def profile_configs() -> list[dict]:
    """What Nsight Compute measures: batch 1 x 8 K/V heads at 32k and 128k, and batch 16 at 4k, FA-2's
    heuristic split count."""
    return [attrs.asdict(DecodeBenchConfig(b, 32, 8, n)) for b, n in ((1, 32768), (1, 131072), (16, 4096))]


def profile(configs: list[dict], seed: int = 0, raw_csv: Path | None = None) -> dict:
    """The split and combine kernels of each configuration under ncu (clocks left alone, caches flushed
    before each kernel): DRAM bytes read and written, L2 bytes, duration; beside the bytes the
    instrumented build counted."""
    command, kernels, counted = run_ncu(find_ncu(), list(NCU_METRICS), "simflash.backends.decode_ncu_target",
                                        {"seed": seed, "configs": configs}, raw_csv)
    out, at = [], 0
    for entry in counted:
        mine = kernels[at:at + entry["kernels"]]
        at += entry["kernels"]
        out.append({**entry, "ncu": [{"kernel": k["name"][:120], **k["metrics"]} for k in mine]})
    if at != len(kernels):
        raise RuntimeError(f"ncu profiled {len(kernels)} kernels, the configurations launched {at}")
    return {"ncu_command": command, "configs": out}


def counted_entry(config: dict, path: DecodePath) -> dict:
    """What the profiled run records of one configuration: its split count, kernels launched and the
    bytes the instrumented build counted."""
    return {"config": config, "num_splits": path.sched.num_splits, "kernels": 1 + (path.sched.num_splits > 1),
            "instrumented": ledger_rows(path.traffic())}
