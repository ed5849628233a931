"""The public entry points: run naive or tiled attention on the simulated GPU and get a `Run` back."""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable
from typing import Any

import attrs
import ml_dtypes
import numpy as np

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.algorithms.naive import naive_forward
from simflash.config import (
    DEFAULT_GPU,
    STATE_DTYPE,
    STORAGE_DTYPES,
    check_causal_variant,
    check_positive_int,
    gpu_spec,
    storage_dtype,
)
from simflash.memory import MemoryEvent, OnChipStats, SimulatedGPU, Traffic
from simflash.schedule import TileSchedule
from simflash.trace import DEFAULT_TRACE_BUDGET_BYTES, TileStep, Trace, TraceRequest, trace_request


@attrs.frozen
class RunConfig:
    """How a run was configured (tile sizes, GPU and SRAM only for tiled runs)."""

    algorithm: str
    heads: int
    n_q: int
    n_kv: int
    d: int
    dtype: str
    scale: float
    causal: bool
    causal_variant: str
    block_q: int | None = None
    block_kv: int | None = None
    write_logsumexp: bool = False
    gpu: str | None = None
    sram_bytes: int | None = None


@attrs.frozen(eq=False)
class Run:
    """What a simulated run leaves: the output as stored in HBM, the ledger, FLOPs and the trace."""

    out: np.ndarray  # storage dtype, shape of q
    traffic: Traffic
    flops: int
    trace: Trace
    config: RunConfig
    on_chip: OnChipStats | None = None  # peak SRAM and register occupancy (tiled algorithms)
    logsumexp: np.ndarray | None = None  # float32, shape q.shape[:-1], when write_logsumexp=True
    events: tuple[MemoryEvent, ...] = ()  # every transfer, hold and matmul, when record_events=True


def _heads_layout(name: str, x: Any) -> np.ndarray:
    array = np.asarray(x)
    if array.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, d) with at least 2 dimensions, got shape {array.shape}")
    if array.dtype.kind not in "fiu" and array.dtype not in STORAGE_DTYPES.values():  # bfloat16 is kind "V"
        raise ValueError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if 0 in array.shape:
        raise ValueError(f"{name} must have positive sizes, got shape {array.shape}")
    return array


def prepare_inputs(q, k, v, dtype: str, scale: float | None, causal_variant: str):
    """Check the inputs; return (Q, K, V) as (heads, n, d) in the storage dtype, and the scale."""
    store = storage_dtype(dtype)
    check_causal_variant(causal_variant)
    q, k, v = (_heads_layout(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (..., n_kv, d), got {k.shape} and {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim d, got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must have equal leading (batch, head) dims, got {q.shape[:-2]} and {k.shape[:-2]}")
    stored = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not np.isfinite(x).all():
            raise ValueError(f"{name} must be finite (no NaN or inf)")
        with np.errstate(over="ignore"):  # an overflow is reported just below, naming the input
            rounded = x.reshape(-1, *x.shape[-2:]).astype(store)
        if not np.isfinite(rounded.astype(STATE_DTYPE)).all():
            raise ValueError(f"{name} has values beyond the range of {dtype} (max {float(ml_dtypes.finfo(store).max):g})")
        stored.append(rounded)
    d = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not (isinstance(scale, (int, float, np.floating)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    return (*stored, float(scale))


def _simulated_gpu(gpu: str, sram_bytes: int | None, record_events: bool) -> tuple[SimulatedGPU, int]:
    capacity = gpu_spec(gpu).smem_carveout_bytes if sram_bytes is None else check_positive_int("sram_bytes", sram_bytes)
    return SimulatedGPU.build(capacity, record_events), capacity


@attrs.define
class _FlashSetup:
    """A validated tiled run, ready to execute: the machine with Q, K, V placed in HBM."""

    machine: SimulatedGPU
    sched: TileSchedule
    request: TraceRequest
    config: RunConfig
    q_shape: tuple[int, ...]


def _flash_setup(
    q, k, v, *, block_q, block_kv, causal, causal_variant, scale, dtype, variant,
    trace, trace_heads, trace_tiles, trace_budget, write_logsumexp, gpu, sram_bytes, record_events,
) -> _FlashSetup:
    if variant not in FLASH_ALGORITHMS:
        raise ValueError(f"variant must be one of {sorted(FLASH_ALGORITHMS)}, got {variant!r}")
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    heads, n_q, d = Q.shape
    sched = TileSchedule(n_q, K.shape[1], block_q, block_kv, causal=bool(causal), causal_variant=causal_variant)
    request = trace_request(trace, trace_heads, trace_tiles, sched, heads, d, trace_budget)
    machine, capacity = _simulated_gpu(gpu, sram_bytes, record_events)
    config = RunConfig(variant, heads, n_q, sched.n_kv, d, dtype, scale, bool(causal), causal_variant,
                       block_q, block_kv, bool(write_logsumexp), gpu, capacity)
    machine.hbm.place("Q", Q, Q.dtype)
    machine.hbm.place("K", K, K.dtype)
    machine.hbm.place("V", V, V.dtype)
    machine.hbm.allocate("O", Q.shape, Q.dtype)
    if write_logsumexp:
        machine.hbm.allocate("L", (heads, n_q), STATE_DTYPE)
    return _FlashSetup(machine, sched, request, config, np.shape(q))


def _flash_steps(setup: _FlashSetup) -> Generator[TileStep, None, Run]:
    machine, config = setup.machine, setup.config
    algorithm = FLASH_ALGORITHMS[config.algorithm]
    yield from algorithm(machine, setup.sched, config.scale, setup.request, write_logsumexp=config.write_logsumexp)
    return Run(
        out=machine.hbm.inspect("O").reshape(setup.q_shape),
        traffic=machine.hbm.traffic(),
        flops=machine.compute.flops,
        trace=Trace(setup.request.level, (), attrs.asdict(config)),
        config=config,
        on_chip=machine.sram.statistics(),
        logsumexp=machine.hbm.inspect("L").reshape(setup.q_shape[:-1]) if config.write_logsumexp else None,
        events=tuple(machine.log.events) if machine.log is not None else (),
    )


def flash_attention(
    q, k, v, block_q: int = 128, block_kv: int = 64, causal: bool = False,
    causal_variant: str = "upper_left", scale: float | None = None, dtype: str = "float16",
    variant: str = "fa2", trace: str = "stats", *, trace_heads: Iterable[int] | None = None,
    trace_tiles: Iterable[int] | None = None, write_logsumexp: bool = False,
    gpu: str = DEFAULT_GPU, sram_bytes: int | None = None, record_events: bool = False,
) -> Run:
    """Tiled attention on the simulated GPU. q: (..., n_q, d); k, v: (..., n_kv, d).

    trace: "none", "stats" (m, alpha, l per tile) or "full" (plus the accumulator a). By default
    every head and query tile is recorded; a trace that would outgrow 64 MiB is refused rather than
    cut short: name the query tiles (`trace_tiles`) and heads (`trace_heads`) to keep.
    sram_bytes defaults to the shared-memory carve-out of `gpu`. record_events keeps every
    transfer, buffer hold and matmul as `run.events` (grows with the number of tiles: small runs).
    """
    setup = _flash_setup(
        q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, causal_variant=causal_variant,
        scale=scale, dtype=dtype, variant=variant, trace=trace, trace_heads=trace_heads,
        trace_tiles=trace_tiles, trace_budget=DEFAULT_TRACE_BUDGET_BYTES,
        write_logsumexp=write_logsumexp, gpu=gpu, sram_bytes=sram_bytes, record_events=record_events,
    )
    steps, run = _exhaust(_flash_steps(setup))
    return attrs.evolve(run, trace=attrs.evolve(run.trace, steps=tuple(steps)))


def flash_attention_steps(
    q, k, v, block_q: int = 128, block_kv: int = 64, causal: bool = False,
    causal_variant: str = "upper_left", scale: float | None = None, dtype: str = "float16",
    variant: str = "fa2", *, trace_heads: Iterable[int] | None = None,
    trace_tiles: Iterable[int] | None = None, gpu: str = DEFAULT_GPU, sram_bytes: int | None = None,
) -> Generator[TileStep, None, Run]:
    """Yield one full TileStep (m, alpha, l, a) per visited tile, live, as the algorithm runs.

    Inputs are checked before the first step. Nothing is kept between steps, so any size can be
    stepped through. The generator's return value (`run = yield from ...`, or StopIteration.value)
    is the finished Run, with an empty trace.
    """
    setup = _flash_setup(
        q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, causal_variant=causal_variant,
        scale=scale, dtype=dtype, variant=variant, trace="full", trace_heads=trace_heads,
        trace_tiles=trace_tiles, trace_budget=math.inf, write_logsumexp=False, gpu=gpu, sram_bytes=sram_bytes,
        record_events=False,
    )
    return _flash_steps(setup)


def _exhaust(generator: Generator[TileStep, None, Run]) -> tuple[list[TileStep], Run]:
    steps: list[TileStep] = []
    while True:
        try:
            steps.append(next(generator))
        except StopIteration as stop:
            return steps, stop.value


def naive_attention(
    q, k, v, causal: bool = False, causal_variant: str = "upper_left",
    scale: float | None = None, dtype: str = "float16", *, record_events: bool = False,
) -> Run:
    """The explicit three-kernel baseline on the simulated GPU: S and P materialised in HBM."""
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    heads, n_q, d = Q.shape
    n_kv = K.shape[1]
    sched = TileSchedule(n_q, n_kv, n_q, n_kv, causal=bool(causal), causal_variant=causal_variant)
    machine = SimulatedGPU.build(sram_bytes=0, record_events=record_events)  # naive holds no tiles we model
    hbm = machine.hbm
    hbm.place("Q", Q, Q.dtype)
    hbm.place("K", K, K.dtype)
    hbm.place("V", V, V.dtype)
    for name in ("S", "P"):  # read back only where stored (read_where), so no poison needed
        hbm.allocate(name, (heads, n_q, n_kv), Q.dtype, poison=False)
    hbm.allocate("O", Q.shape, Q.dtype)
    naive_forward(machine, sched, scale)
    config = RunConfig("naive", heads, n_q, n_kv, d, dtype, scale, bool(causal), causal_variant)
    return Run(
        out=hbm.inspect("O").reshape(np.shape(q)),
        traffic=hbm.traffic(),
        flops=machine.compute.flops,
        trace=Trace("none", (), attrs.asdict(config)),
        config=config,
        events=tuple(machine.log.events) if machine.log is not None else (),
    )
