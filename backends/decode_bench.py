"""Decode-step bandwidth on the GPU: how fast each way of attending one new query token streams the KV cache.

One query token of 32 query heads over 8 K/V heads (grouped-query), d = 128, fp16; batch x K/V heads from
8 to 256 (and one K/V head of 4 query heads: 1), cache lengths 1k to 128k. In one process, on the same
inputs, every method timed the same two ways:

- the headline, as serving stacks run a decode step: a CUDA graph of back-to-back steps, captured once
  and replayed, CUDA events around each replay (the median of replays, over the steps in the graph).
  The steps rotate through copies of the inputs spanning ROTATE_L2 L2s, so every step streams its K/V
  cache from HBM; the graph takes the host's launch time out of the measure for every method alike;
- `cold`: one call after a read of four L2s' worth of memory, CUDA events around it (bench.time_ms):
  the L2 holds none of the cache, and the GPU front end's start of the first kernel is inside the span.

The methods:

- our FA-2 kernel at T_r = 1: a group's query heads packed into one tile per K/V head, and unpacked (a
  CTA per query head, each reading its group's K/V);
- our Flash-Decoding: FA-2's heuristic split count on this GPU (and, where the grid is small, its split
  kernel alone, to show the combine's share), and where the grid is small a sweep of split counts and
  FA-2's own KV tile (twice ours: one CTA an SM, see kernels.DECODE_BLOCK_KV);
- PyTorch SDPA with one query token (enable_gqa=True), whichever backend it picks (`sdpa_kernels`
  records the kernels it ran), captured into a graph by PyTorch's CUDAGraph in the same capture mode.

K/V bandwidth: the bytes of the K and V cache over the time of the whole step (both Flash-Decoding
kernels), in GB/s and as a share of the HBM peak of the machine file. `profile` runs the split and
combine kernels of a few configurations under Nsight Compute (decode_ncu_target.py).
"""

from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import attrs
import numpy as np
from simflash.backends.bench import time_ms
from simflash.backends.decoding import DecodePath, split_schedule
from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.kernels import DECODE_BLOCK_KV, Flash2Kernel, import_cupy
from simflash.backends.profile import available_metrics, find_ncu, run_ncu
from simflash.backends.validate import ledger_rows

import simflash as sf
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
    """time_ms's settings for the cold measure of these short kernels."""

    min_total_ms: float
    reps: tuple[int, int]


class GraphTiming(TypedDict):
    """The graph replays: a replay lasts about replay_ms and holds at least min_steps steps."""

    replay_ms: float
    min_steps: int
    min_total_ms: float
    reps: tuple[int, int]


TIMING = Timing(min_total_ms=30.0, reps=(5, 30))
GRAPH = GraphTiming(replay_ms=2.0, min_steps=4, min_total_ms=40.0, reps=(5, 20))
ROTATE_L2 = 4  # the inputs a graph's steps rotate through span at least this many L2s
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum")
# where the counters have them: the shared memory the launch configured, the CTAs an SM it allows, the
# warps active (how many CTAs share an SM)
NCU_OCCUPANCY = ("launch__shared_mem_config_size", "launch__occupancy_limit_shared_mem",
                 "sm__warps_active.avg.pct_of_peak_sustained_active")


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
    """One K/V cache buffer as large as the largest configuration; each configuration uses a prefix, and
    its copies for a graph's rotation lie one after another in it."""

    K_all: DeviceArray
    V_all: DeviceArray
    rng: object
    l2_bytes: int

    @classmethod
    def for_configs(cls, configs: list[DecodeBenchConfig], seed: int) -> Inputs:
        cupy = import_cupy()
        rng = cupy.random.default_rng(seed)
        size = max(c.batch * c.kv_heads * c.n_kv * c.d for c in configs)
        l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
        return cls(random_fp16(rng, size), random_fp16(rng, size), rng, int(l2))

    def copies(self, c: DecodeBenchConfig) -> int:
        """How many copies of c's inputs a graph rotates through: ROTATE_L2 L2s' worth, as the buffer holds."""
        size = c.batch * c.kv_heads * c.n_kv * c.d
        return max(1, min(self.K_all.size // size, -(-ROTATE_L2 * self.l2_bytes // c.kv_bytes)))

    def arrays(self, c: DecodeBenchConfig, copy: int = 0) -> tuple:
        """Q (batch x H_q, 1, d), fresh; K, V (batch x H_kv, n_kv, d), views of copy `copy` in the cache buffers."""
        size = c.batch * c.kv_heads * c.n_kv * c.d
        shape = (c.batch * c.kv_heads, c.n_kv, c.d)
        at = slice(copy * size, (copy + 1) * size)
        return (random_fp16(self.rng, (c.batch * c.heads, 1, c.d)), self.K_all[at].reshape(shape),
                self.V_all[at].reshape(shape))


def replay_ms(launch, stream, steps: int, min_total_ms: float, reps: tuple[int, int]) -> dict:
    """Milliseconds a step: CUDA events on `stream` around each replay of a graph of `steps` steps
    (`launch` replays it there), after a warm-up replay; the median of replays."""
    cupy = import_cupy()
    launch()
    stream.synchronize()

    def once() -> float:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        launch()
        stop.record(stream)
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / steps

    first = once()
    count = int(min(reps[1], max(reps[0], min_total_ms // max(first * steps, 1e-3))))
    times = [once() for _ in range(count)]
    return {"ms": statistics.median(times), "reps": count, "steps": steps, "min_ms": min(times),
            "max_ms": max(times)}


def graph_steps(copies: int, cold_ms: float) -> int:
    """Steps in a graph: whole rounds of the copies, enough for GRAPH["replay_ms"] a replay."""
    wanted = max(GRAPH["min_steps"], math.ceil(GRAPH["replay_ms"] / max(cold_ms, 1e-3)))
    return copies * math.ceil(wanted / copies)


def time_cupy_steps(steps_fns: list, cold_ms: float) -> dict:
    """Graph timing of CuPy launches: `steps_fns[i]()` launches one step on copy i."""
    cupy = import_cupy()
    steps = graph_steps(len(steps_fns), cold_ms)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for fn in steps_fns:  # the first launch of each, outside the capture
            fn()
        stream.synchronize()
        stream.begin_capture()
        for k in range(steps):
            steps_fns[k % len(steps_fns)]()
        graph = stream.end_capture()
    return replay_ms(lambda: graph.launch(stream), stream, steps, GRAPH["min_total_ms"], GRAPH["reps"])


def time_torch_steps(steps_fns: list, cold_ms: float) -> dict:
    """Graph timing of PyTorch calls, the same way (PyTorch's CUDAGraph, relaxed capture as CuPy's)."""
    torch = _torch()
    cupy = import_cupy()
    steps = graph_steps(len(steps_fns), cold_ms)
    stream = cupy.cuda.Stream(non_blocking=True)
    on_stream = torch.cuda.ExternalStream(stream.ptr)
    with torch.cuda.stream(on_stream):
        for fn in steps_fns:
            fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=on_stream, capture_error_mode="relaxed"):
        for k in range(steps):
            steps_fns[k % len(steps_fns)]()

    def launch() -> None:
        with torch.cuda.stream(on_stream):
            graph.replay()

    return replay_ms(launch, stream, steps, GRAPH["min_total_ms"], GRAPH["reps"])


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
    """Time one configuration every way (a graph of steps over the input copies, and one cold call);
    outputs of ours against SDPA's on copy 0, max abs. sweep: also the split kernel alone, the split
    sweep and FA-2's KV tile."""
    cupy = import_cupy()
    peak = sf.GPUS[gpu].hbm_bytes_per_s
    sets = [inputs.arrays(c, copy) for copy in range(inputs.copies(c))]
    scale = 1.0 / float(np.sqrt(c.d))
    group = c.heads // c.kv_heads
    row: dict = {"config": attrs.asdict(c), "kv_bytes": c.kv_bytes, "copies": len(sets)}
    outputs = {}

    def timed(steps_fns: list, graph_timer=time_cupy_steps) -> dict:
        cold = time_ms(steps_fns[0], flush, **TIMING)
        graph = graph_timer(steps_fns, cold["ms"])
        return {**_bandwidth(graph, c.kv_bytes, peak), "cold": _bandwidth(cold, c.kv_bytes, peak)}

    # -- our FA-2 kernel, one query row: T_r = 1 packed or not
    kernel = Flash2Kernel(DTYPE, *FA2_TILES, c.d)
    for name, pack in (("fa2_packed", group), ("fa2_unpacked", 1)):
        sched = TileSchedule(1, c.n_kv, *FA2_TILES, pack=pack)
        Os = [poisoned_output(Q.shape, DTYPE) for Q, _, _ in sets]
        row[name] = timed([functools.partial(launch, kernel, Q, K, V, O, sched, scale)
                           for (Q, K, V), O in zip(sets, Os)])
        row[name]["ctas"] = sched.n_q_tiles * c.batch * c.heads // pack
        outputs[name] = Os[0]

    # -- Flash-Decoding: FA-2's heuristic split count (and its split kernel alone), then the sweep
    def decode(num_splits, block_kv=None, split_only=False):
        sched = split_schedule(c.batch, c.batch * c.heads, c.batch * c.kv_heads, 1, c.n_kv, c.d, num_splits, block_kv)
        paths = [DecodePath(Q, K, V, c.batch, sched, scale, DTYPE) for Q, K, V in sets]
        timing = timed([path.launch_split if split_only else path.run for path in paths])
        return {"num_splits": sched.num_splits, "block_kv": sched.block_kv,
                "split_ctas": sched.n_q_tiles * sched.num_splits * c.batch * c.kv_heads, **timing}, paths[0].O

    row["flash_decoding"], outputs["flash_decoding"] = decode(None)
    if sweep:
        if row["flash_decoding"]["num_splits"] > 1:
            row["flash_decoding_split_kernel"] = decode(None, split_only=True)[0]
        tiles = -(-c.n_kv // DECODE_BLOCK_KV[c.d][0])
        row["flash_decoding_sweep"] = [decode(s)[0] for s in SPLITS if s <= tiles]
        row["flash_decoding_fa2_tile"] = decode(None, DECODE_BLOCK_KV[c.d][1])[0]

    # -- PyTorch SDPA on the same memory, timed the same two ways
    torch = _torch()
    if torch is None:
        row["sdpa"] = {"error": "torch is not installed"}
    else:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def views(Q, K, V):
            q = torch.from_dlpack(Q.view(cupy.float16)).view(c.batch, c.heads, 1, c.d)
            k, v = (torch.from_dlpack(x.view(cupy.float16)).view(c.batch, c.kv_heads, c.n_kv, c.d) for x in (K, V))
            return q, k, v

        calls = [functools.partial(sdpa, *views(*arrays), enable_gqa=True) for arrays in sets]
        try:
            row["sdpa"] = timed(calls, time_torch_steps)
            reference = cupy.from_dlpack(calls[0]()).reshape(sets[0][0].shape).astype(cupy.float32)
            row["max_abs_vs_sdpa"] = {name: float(cupy.abs(out.view(cupy.float16).astype(cupy.float32) - reference).max())
                                      for name, out in outputs.items()}
        except RuntimeError as error:  # out of memory, or a capture PyTorch refuses: recorded, the run goes on
            row["sdpa"] = {"error": str(error).splitlines()[0][:200]}
        torch.cuda.empty_cache()
    return row


def bench(configs: list[DecodeBenchConfig], seed: int = 0, gpu: str = "H200", progress=None) -> dict:
    """Every configuration, in turn, on one cache buffer; the split sweep at batch x K/V heads up to
    SWEEP_MAX_BATCH_HEADS."""
    cupy = import_cupy()
    inputs = Inputs.for_configs(configs, seed)
    # Read before every cold call: the L2 then holds none of the cache, and the GPU is busy while the
    # host queues the call's kernels.
    scratch = cupy.zeros(4 * inputs.l2_bytes, dtype=cupy.uint8)

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
    ncu = find_ncu()
    have = available_metrics(ncu)
    metrics = [*NCU_METRICS, *(name for name in NCU_OCCUPANCY if name.split(".")[0] in have)]
    command, kernels, counted = run_ncu(ncu, metrics, "simflash.backends.decode_ncu_target",
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
