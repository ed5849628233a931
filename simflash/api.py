"""The public entry points: run naive or tiled attention on the simulated GPU and get a `Run` back."""

from __future__ import annotations

import functools
import math
from collections.abc import Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs
import ml_dtypes
import numpy as np

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.algorithms.naive import KERNELS as NAIVE_KERNELS
from simflash.algorithms.naive import NAIVE_CTAS, concurrent_heads, naive_grid
from simflash.chip import KERNEL_PROFILES, gemm_pv_wave_rows, l2_cache, resident_ctas, softmax_resident_rows
from simflash.config import (
    DEFAULT_GPU,
    STATE_DTYPE,
    STORAGE_DTYPES,
    CausalVariant,
    StorageDtypeName,
    check_bool,
    check_causal_variant,
    check_positive_int,
    check_window,
    gpu_spec,
    storage_dtype,
)
from simflash.grid import CTA, Schedule, check_schedule, run_bodies
from simflash.l2 import PhysicalTraffic
from simflash.memory import HBM, MemoryEvent, OnChipStats, SimulatedGPU, TiledHBM, Traffic
from simflash.onchip import (
    DEFAULT_KV_STAGES,
    DEFAULT_P_REGISTERS,
    check_fits,
    check_kv_stages,
    check_p_registers,
    cta_resources,
    register_capacity_bytes,
)
from simflash.schedule import TileSchedule
from simflash.trace import DEFAULT_TRACE_BUDGET_BYTES, TileStep, Trace, TraceLevel, TraceRequest, trace_request

if TYPE_CHECKING:
    from simflash.model.decode import DecodeLaunch


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
    schedule: str = "sequential"
    cache: str | None = None
    o_accum_dtype: str = "storage"  # FA-1: the running O in HBM in the storage dtype or in float32
    kv_stages: int = DEFAULT_KV_STAGES  # K_j, V_j buffers in shared memory (FA-2)
    window: tuple[int, int] = attrs.field(default=(-1, -1), converter=check_window)  # (left, right) keys visible
    kv_heads: int | None = None  # K/V heads, all batch elements (None: as many as query heads)
    pack_gqa: bool = False  # a group's query heads packed into the rows of one tile
    num_splits: int | None = None  # split-KV runs (Flash-Decoding): runs of KV tiles per query tile
    cache_seqlens: tuple[int, ...] | None = attrs.field(  # split-KV runs: each batch element's valid K/V rows
        default=None, converter=lambda v: None if v is None else tuple(int(n) for n in v))

    @property
    def cta_heads(self) -> int:
        """The heads a tiled run's CTAs and trace steps are indexed by: query heads, or packed groups."""
        return self.kv_heads if self.pack_gqa and self.kv_heads is not None else self.heads

    def tile_schedule(self) -> TileSchedule:
        """The run's tiling (naive: one tile over the whole score matrix)."""
        kv_heads = self.heads if self.kv_heads is None else self.kv_heads
        return TileSchedule(self.n_q, self.n_kv, self.n_q if self.block_q is None else self.block_q,
                            self.n_kv if self.block_kv is None else self.block_kv, causal=self.causal,
                            causal_variant=self.causal_variant, window=self.window,
                            pack=self.heads // kv_heads if self.pack_gqa else 1)


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
    flops_by_kind: dict[str, int] = attrs.field(factory=dict)  # tensor (= flops), exp, fp32, div
    physical: PhysicalTraffic | None = None  # what the L2 let through to DRAM, when cache is set
    decode: DecodeLaunch | None = None  # split-KV runs: the splits chosen, CTAs and waves
    # Entries of S that overflowed the storage dtype (naive only: S is stored in HBM in `dtype`, as an
    # fp16 eager path stores it). They are stored as +-inf, and every row holding one comes out NaN.
    overflow: int = 0

    @property
    def overflow_note(self) -> str:
        """Why the output holds NaN, when S overflowed; "" when it did not."""
        if not self.overflow:
            return ""
        rows = int(np.isnan(self.out.astype(STATE_DTYPE)).any(axis=-1).sum())
        return (f"{self.overflow:,} entries of S = QK^T x scale overflowed {self.config.dtype} (beyond "
                f"+-{float(ml_dtypes.finfo(STORAGE_DTYPES[self.config.dtype]).max):g}) and were stored as +-inf; "
                f"the softmax of a row holding +inf is NaN (exp(inf - inf)): {rows:,} output row(s) are NaN")

    def _repr_html_(self) -> str | None:
        """Jupyter: the trace viewer (`simflash view`'s page) in an iframe; None for a run too large to step through."""
        from simflash.viewer import repr_html

        return repr_html(self)


def heads_layout(name: str, x: Any) -> np.ndarray:
    array = np.asarray(x)
    if array.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, d) with at least 2 dimensions, got shape {array.shape}")
    if array.dtype.kind not in "fiu" and array.dtype not in STORAGE_DTYPES.values():  # bfloat16 is kind "V"
        raise ValueError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if 0 in array.shape:
        raise ValueError(f"{name} must have positive sizes, got shape {array.shape}")
    return array


def prepare_inputs(q, k, v, dtype: str, scale: float | None, causal_variant: str):
    """Check the inputs; return (Q, K, V) as (heads, n, d) in the storage dtype, and the scale.

    Grouped-query heads: q (..., H_q, n_q, d) with k, v (..., H_kv, n_kv, d), H_q a multiple of H_kv;
    flattened, query head h reads K/V head h // (H_q / H_kv).
    """
    storage_dtype(dtype)
    check_causal_variant(causal_variant)
    q, k, v = (heads_layout(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (..., n_kv, d), got {k.shape} and {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim d, got {q.shape[-1]} and {k.shape[-1]}")
    if q.ndim != k.ndim or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"q and k must have equal leading (batch) dims before the head dim, got shapes "
                         f"{q.shape} and {k.shape}")
    if q.ndim > 2 and q.shape[-3] % k.shape[-3]:
        raise ValueError(f"q's heads (H_q = {q.shape[-3]}) must be a multiple of k's and v's heads "
                         f"(H_kv = {k.shape[-3]}): each K/V head serves a group of H_q / H_kv query heads")
    stored = [stored_heads(name, x, dtype) for name, x in (("q", q), ("k", k), ("v", v))]
    d = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if (isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating))
            or not (math.isfinite(scale) and scale > 0)):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    return (*stored, float(scale))


def stored_heads(name: str, x: np.ndarray, dtype: str) -> np.ndarray:
    """A finite input x (..., n, d) as HBM stores it: (heads, n, d), rounded to the storage dtype."""
    store = storage_dtype(dtype)
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    with np.errstate(over="ignore"):  # an overflow is reported just below, naming the input
        rounded = x.reshape(-1, *x.shape[-2:]).astype(store)
    if not np.isfinite(rounded.astype(STATE_DTYPE)).all():
        raise ValueError(f"{name} has values beyond the range of {dtype} (max {float(ml_dtypes.finfo(store).max):g})")
    return rounded


CacheMode = Literal["cold", "warm"]
Variant = Literal["fa2", "fa1"]  # the tiled algorithms (simflash.algorithms.FLASH_ALGORITHMS)
OAccumDtype = Literal["storage", "float32"]
CACHE_MODES: tuple[CacheMode, ...] = ("cold", "warm")
VARIANTS: tuple[Variant, ...] = ("fa2", "fa1")
O_ACCUM_DTYPES: tuple[OAccumDtype, ...] = ("storage", "float32")


def check_cache(cache: object) -> str | None:
    if cache is not None and cache not in CACHE_MODES:
        raise ValueError(f"cache must be None or one of {CACHE_MODES}, got {cache!r}")
    return cache


def _simulated_gpu(gpu: str, sram_bytes: int | None, record_events: bool, cache: str | None,
                   block_q: int | None = None) -> tuple[SimulatedGPU, int]:
    """The machine; with block_q, each CTA's registers are checked against its share of the register file."""
    spec = gpu_spec(gpu)
    capacity = spec.smem_carveout_bytes if sram_bytes is None else check_positive_int("sram_bytes", sram_bytes)
    registers = None if block_q is None else register_capacity_bytes(spec, block_q)
    l2 = None if check_cache(cache) is None else l2_cache(spec)
    return SimulatedGPU.build(capacity, record_events, registers, l2), capacity


@attrs.define
class _FlashSetup:
    """A validated tiled run, ready to execute: the machine with Q, K, V placed in HBM."""

    machine: SimulatedGPU
    sched: TileSchedule
    request: TraceRequest
    config: RunConfig
    q_shape: tuple[int, ...]
    # FA-2: P_ij over S_ij's registers, or its own (simflash.onchip); not in the config, which the trace
    # records: it changes the register report only, no tile state
    p_registers: str = DEFAULT_P_REGISTERS


def pack_heads(x: np.ndarray, group: int) -> np.ndarray:
    """(heads, n, ...) -> (heads / group, n x group, ...): packed row r x group + h holds position r of the
    group's query head h (FA-3's PackGQA: position-major, head-minor)."""
    heads, n = x.shape[:2]
    return x.reshape(heads // group, group, n, *x.shape[2:]).swapaxes(1, 2).reshape(heads // group, n * group,
                                                                                      *x.shape[2:])


def unpack_heads(x: np.ndarray, group: int) -> np.ndarray:
    """The inverse of `pack_heads`."""
    groups, rows = x.shape[:2]
    return x.reshape(groups, rows // group, group, *x.shape[2:]).swapaxes(1, 2).reshape(groups * group,
                                                                                        rows // group, *x.shape[2:])


def _flash_setup(
    q, k, v, *, block_q, block_kv, causal, causal_variant, scale, dtype, variant,
    trace, trace_heads, trace_tiles, trace_budget, write_logsumexp, gpu, sram_bytes, record_events,
    schedule="sequential", cache=None, o_accum_dtype="storage", kv_stages=DEFAULT_KV_STAGES,
    window=(-1, -1), pack_gqa=False, p_registers=DEFAULT_P_REGISTERS,
) -> _FlashSetup:
    if variant not in FLASH_ALGORITHMS:
        raise ValueError(f"variant must be one of {sorted(FLASH_ALGORITHMS)}, got {variant!r}")
    check_o_accum_dtype(variant, o_accum_dtype)
    causal = check_bool("causal", causal)
    write_logsumexp = check_bool("write_logsumexp", write_logsumexp)
    record_events = check_bool("record_events", record_events)
    pack_gqa = check_bool("pack_gqa", pack_gqa)
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    kv_stages = check_kv_stages(kv_stages)
    p_registers = check_p_registers(p_registers)
    heads, n_q, d = Q.shape
    group = heads // K.shape[0]
    config = RunConfig(variant, heads, n_q, K.shape[1], d, dtype, scale, causal, causal_variant,
                       block_q, block_kv, write_logsumexp, gpu, None, schedule, cache, o_accum_dtype,
                       kv_stages, window, K.shape[0] if group > 1 else None, pack_gqa)
    sched = config.tile_schedule()
    if pack_gqa:
        Q = pack_heads(Q, group)
    request = trace_request(trace, trace_heads, trace_tiles, sched, config.cta_heads, d, trace_budget)
    check_schedule(schedule)
    tile_rows = min(block_q, sched.n_rows)  # a tile never exceeds the sequence
    machine, capacity = _simulated_gpu(gpu, sram_bytes, record_events, cache, tile_rows)
    if FLASH_ALGORITHMS[variant].kernel_model:  # the kernel's allocation must fit before any CTA runs
        check_fits(cta_resources(tile_rows, min(block_kv, sched.n_kv), d, dtype, kv_stages, p_registers), gpu_spec(gpu),
                   capacity)
    config = attrs.evolve(config, sram_bytes=capacity)
    machine.hbm.place("Q", Q, Q.dtype)
    machine.hbm.place("K", K, K.dtype)
    machine.hbm.place("V", V, V.dtype)
    machine.hbm.allocate("O", Q.shape, Q.dtype)
    if write_logsumexp:
        machine.hbm.allocate("L", Q.shape[:2], STATE_DTYPE)
    return _FlashSetup(machine, sched, request, config, np.shape(q), p_registers)


def check_o_accum_dtype(variant: str, o_accum_dtype: object) -> str:
    """The dtype `variant` keeps its running output in between KV tiles: one it supports."""
    allowed = FLASH_ALGORITHMS[variant].o_accum_dtypes
    if o_accum_dtype not in allowed:
        raise ValueError(f"o_accum_dtype must be one of {allowed} for variant {variant!r}, got {o_accum_dtype!r}"
                         + ("" if len(allowed) > 1 else
                            f" ({variant} keeps its accumulator on chip; o_accum_dtype applies to variant='fa1')"))
    return o_accum_dtype


def run_tiled(
    machine: SimulatedGPU, variant: str, sched: TileSchedule, scale: float, trace: TraceRequest | None = None,
    *, write_logsumexp: bool = False, slots: int = 1, longest_first: bool = False, o_accum_dtype: str = "storage",
    kv_stages: int = DEFAULT_KV_STAGES, p_registers: str = DEFAULT_P_REGISTERS,
) -> Iterator[TileStep]:
    """Run every CTA of a registered tiled algorithm on `machine`, as one kernel; yield the traced steps.

    Q, K, V (heads, n, d) and O must be in HBM already, and L when write_logsumexp; the per-row
    statistics the algorithm keeps in HBM (its `row_state`) are allocated here. Each CTA runs on its
    own SRAM (`machine.for_cta`), `slots` of them resident at a time (1: one after another, in
    launch order). An algorithm's other HBM tensors are allocated by its `allocate`; the finished
    output is then in `FLASH_ALGORITHMS[variant].output(o_accum_dtype)` ("O" unless FA-1 keeps O in float32).
    kv_stages and p_registers go to algorithms that model the kernel's on-chip state (FA-2).
    """
    algorithm = FLASH_ALGORITHMS[variant]
    check_o_accum_dtype(variant, o_accum_dtype)
    request = TraceRequest("none") if trace is None else trace
    heads, n_rows = machine.hbm.shape("Q")[:2]
    for name in algorithm.row_state:
        machine.hbm.allocate(name, (heads, n_rows), STATE_DTYPE)
    options: dict[str, Any] = {"write_logsumexp": write_logsumexp}
    if algorithm.kernel_model:
        options["kv_stages"] = kv_stages
        options["p_registers"] = p_registers
    if algorithm.allocate is not None:
        algorithm.allocate(machine.hbm, o_accum_dtype)
        options["o_accum_dtype"] = o_accum_dtype

    def body(cta):
        cta_gpu = machine.for_cta(cta.index)
        return _attributed(cta_gpu, cta.index, algorithm.cta(cta_gpu, sched, scale, request, cta, **options))

    ctas = algorithm.grid(sched, heads, longest_first=longest_first, group=heads // machine.hbm.shape("K")[0])
    with machine.hbm.kernel(algorithm.kernel):
        yield from run_bodies({cta: functools.partial(body, cta) for cta in ctas}, slots, machine.hbm)


def _trace_config(config: RunConfig) -> dict[str, Any]:
    """A run's config as its trace records it: schedule and cache only where they are not the defaults,
    so the traces of sequential runs without an L2 read as they always have."""
    defaults = {"schedule": "sequential", "cache": None, "o_accum_dtype": "storage", "kv_stages": DEFAULT_KV_STAGES,
                "window": (-1, -1), "kv_heads": None, "pack_gqa": False, "num_splits": None, "cache_seqlens": None}
    return {k: v for k, v in attrs.asdict(config).items() if k not in defaults or v != defaults[k]}


def _flash_steps(setup: _FlashSetup) -> Generator[TileStep, None, Run]:
    machine, config, sched = setup.machine, setup.config, setup.sched
    profile = KERNEL_PROFILES["simflash"]
    concurrent = config.schedule == "concurrent"
    assert config.gpu is not None and config.block_q is not None and config.block_kv is not None  # a tiled run's
    slots = resident_ctas(gpu_spec(config.gpu), profile, config.block_q, config.block_kv, config.d,
                          storage_dtype(config.dtype).itemsize) if concurrent else 1
    if machine.hbm.l2 is not None:
        machine.hbm.l2.flush(residue=config.cache == "cold")
    yield from run_tiled(machine, config.algorithm, sched, config.scale, setup.request,
                         write_logsumexp=config.write_logsumexp, slots=slots,
                         longest_first=concurrent and profile.longest_first, o_accum_dtype=config.o_accum_dtype,
                         kv_stages=config.kv_stages, p_registers=setup.p_registers)
    output = FLASH_ALGORITHMS[config.algorithm].output(config.o_accum_dtype)
    group = config.heads // machine.hbm.shape("K")[0]

    def unpacked(x: np.ndarray) -> np.ndarray:
        return unpack_heads(x, group) if config.pack_gqa else x

    return Run(
        out=unpacked(machine.hbm.inspect(output)).reshape(setup.q_shape),
        traffic=machine.hbm.traffic(),
        flops=machine.compute.flops,
        trace=Trace(setup.request.level, (), _trace_config(config)),
        config=config,
        on_chip=machine.on_chip_statistics(),
        logsumexp=unpacked(machine.hbm.inspect("L")).reshape(setup.q_shape[:-1]) if config.write_logsumexp else None,
        events=tuple(machine.log.events) if machine.log is not None else (),
        flops_by_kind=machine.compute.flops_by_kind(),
        physical=machine.hbm.l2.traffic() if machine.hbm.l2 is not None else None,
    )


def _attributed(gpu: SimulatedGPU, index: tuple[int, ...], body):
    """Run a CTA's generator with its work attributed to it in the event log, step by step."""
    if gpu.log is None:  # nothing to attribute: let the steps through untouched
        yield from body
        return
    while True:
        with gpu.cta(*index):
            try:
                item = next(body)
            except StopIteration:
                return
        yield item


def flash_attention(
    q, k, v, block_q: int = 128, block_kv: int = 64, *, causal: bool = False,
    causal_variant: CausalVariant = "upper_left", scale: float | None = None, dtype: StorageDtypeName = "float16",
    variant: Variant = "fa2", trace: TraceLevel = "stats", trace_heads: Iterable[int] | None = None,
    trace_tiles: Iterable[int] | None = None, write_logsumexp: bool = False,
    gpu: str = DEFAULT_GPU, sram_bytes: int | None = None, record_events: bool = False,
    schedule: Schedule = "sequential", cache: CacheMode | None = None, o_accum_dtype: OAccumDtype = "storage",
    kv_stages: int = DEFAULT_KV_STAGES, window: tuple[int, int] = (-1, -1), pack_gqa: bool = False,
    p_registers: str = DEFAULT_P_REGISTERS,
) -> Run:
    """Tiled attention on the simulated GPU. q: (..., n_q, d); k, v: (..., n_kv, d).

    Heads: q (..., H_q, n_q, d) may share K/V heads, k and v (..., H_kv, n_kv, d) with H_q a multiple of
    H_kv (grouped-query or multi-query attention): query head h reads K/V head h // (H_q / H_kv).
    pack_gqa=False runs one CTA per query head and query tile, each reading its group's K/V tiles;
    pack_gqa=True packs the H_q / H_kv query heads of a group into the rows of one tile (packed row
    r x group + h is position r of the group's head h; FA-3's PackGQA), so each K/V tile is read once
    per tile of packed rows. A packed row keeps its position r for the causal and window bounds.
    window=(left, right): query r sees key c iff r + off - left <= c <= r + off + right (-1: unbounded
    on that side; off = 0 upper_left, n_kv - n_q lower_right); causal=True is right = 0. KV tiles wholly
    outside are never loaded, tiles the window's edge cuts are masked.

    trace: "none", "stats" (m, alpha, l per tile) or "full" (plus the accumulator a). By default
    every head and query tile is recorded; a trace that would outgrow 64 MiB is refused rather than
    cut short: name the query tiles (`trace_tiles`) and heads (`trace_heads`) to keep.
    sram_bytes defaults to the shared-memory carve-out of `gpu`. record_events keeps every
    transfer, buffer hold and matmul as `run.events` (grows with the number of tiles: small runs).
    schedule: "sequential" (one CTA after another) or "concurrent" (the CTAs resident on `gpu` in
    lock-step, in launch order); outputs and the ledger are the same. cache: "cold" or "warm" passes
    every transfer through `gpu`'s L2 model and reports `run.physical` (DRAM and L2 bytes).
    o_accum_dtype (variant="fa1" only): "storage" keeps the running O in HBM in `dtype`, as the paper
    reads; "float32" keeps it in float32, as the released FA-1 kernel did (twice O's round-trip bytes,
    still ledger tensor "O"), and a last pass reads it once more and writes `run.out` in `dtype` as
    the ledger tensor "out".
    kv_stages (FA-2): K_j, V_j buffers in shared memory, 2 (double-buffered, as the GPU kernel) or 1;
    a tile configuration whose shared memory (Q_i + kv_stages x (K_j + V_j)) or register-held state
    does not fit `gpu` raises SRAMOverflowError naming block_q, block_kv and d.
    p_registers (FA-2): where P_ij waits for its P V product: "overwrite_s" (over S_ij's float32
    registers, as kernel versions 1 and 2) or "own" (registers of its own in the storage dtype, held
    beside the next tile's S_ij, as version 3 and FlashAttention-3); only the register report differs.
    """
    setup = _flash_setup(
        q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, causal_variant=causal_variant,
        scale=scale, dtype=dtype, variant=variant, trace=trace, trace_heads=trace_heads,
        trace_tiles=trace_tiles, trace_budget=DEFAULT_TRACE_BUDGET_BYTES,
        write_logsumexp=write_logsumexp, gpu=gpu, sram_bytes=sram_bytes, record_events=record_events,
        schedule=schedule, cache=cache, o_accum_dtype=o_accum_dtype, kv_stages=kv_stages, window=window,
        pack_gqa=pack_gqa, p_registers=p_registers,
    )
    steps, run = _exhaust(_flash_steps(setup))
    return attrs.evolve(run, trace=attrs.evolve(run.trace, steps=tuple(steps)))


def flash_attention_steps(
    q, k, v, block_q: int = 128, block_kv: int = 64, *, causal: bool = False,
    causal_variant: CausalVariant = "upper_left", scale: float | None = None, dtype: StorageDtypeName = "float16",
    variant: Variant = "fa2", trace_heads: Iterable[int] | None = None,
    trace_tiles: Iterable[int] | None = None, gpu: str = DEFAULT_GPU, sram_bytes: int | None = None,
    window: tuple[int, int] = (-1, -1), pack_gqa: bool = False,
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
        record_events=False, window=window, pack_gqa=pack_gqa,
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
    q, k, v, *, causal: bool = False, causal_variant: CausalVariant = "upper_left",
    scale: float | None = None, dtype: StorageDtypeName = "float16", record_events: bool = False,
    schedule: Schedule = "sequential", cache: CacheMode | None = None, gpu: str = DEFAULT_GPU,
    window: tuple[int, int] = (-1, -1),
) -> Run:
    """The explicit three-kernel baseline on the simulated GPU: S and P materialised in HBM.

    Heads and window as in `flash_attention` (each query head's GEMMs read its group's K and V; S and
    P hold only the entries a row may see).

    cache: "cold" (the L2 flushed before every kernel) or "warm" (once, before the first: the three
    kernels share it) reports `run.physical`. Each kernel's CTAs (one per head) stream in head order
    under either schedule; the P V GEMM's run as many heads side by side as a wave of its tiles holds.
    """
    run, _ = naive_forward(q, k, v, causal, causal_variant, scale, dtype, record_events=record_events,
                           schedule=schedule, cache=cache, gpu=gpu, window=window)
    return run


def naive_forward(q, k, v, causal, causal_variant, scale, dtype, *, record_events=False, schedule="sequential",
                  cache=None, gpu=DEFAULT_GPU, window=(-1, -1)) -> tuple[Run, HBM | TiledHBM]:
    """`naive_attention`'s run, and the HBM it leaves: S and P stay there for a backward to read."""
    causal = check_bool("causal", causal)
    record_events = check_bool("record_events", record_events)
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    check_schedule(schedule)
    heads, n_q, d = Q.shape
    n_kv = K.shape[1]
    config = RunConfig("naive", heads, n_q, n_kv, d, dtype, scale, causal, causal_variant, gpu=gpu,
                       schedule=schedule, cache=cache, window=window,
                       kv_heads=K.shape[0] if K.shape[0] != heads else None)
    sched = config.tile_schedule()
    machine, _ = _simulated_gpu(gpu, None, record_events, cache)  # naive holds no tiles we model
    hbm = machine.hbm
    hbm.place("Q", Q, Q.dtype)
    hbm.place("K", K, K.dtype)
    hbm.place("V", V, V.dtype)
    for name in ("S", "P"):  # read back only where stored (read_where), so no poison needed
        hbm.allocate(name, (heads, n_q, n_kv), Q.dtype, poison=False)
    hbm.allocate("O", Q.shape, Q.dtype)
    wave_rows = gemm_pv_wave_rows(gpu_spec(gpu))
    softmax_rows = softmax_resident_rows(gpu_spec(gpu), n_kv, Q.dtype.itemsize)
    layouts = {"gemm_pv": {"wave_rows": wave_rows}, "softmax": {"resident_rows": softmax_rows}}

    def naive_body(kernel: str, cta: CTA) -> Iterator:
        return _attributed(machine, cta.index, NAIVE_CTAS[kernel](machine, sched, scale, cta, **layouts.get(kernel, {})))

    overflow = 0
    for kernel in NAIVE_KERNELS:
        if hbm.l2 is not None and (cache == "cold" or kernel == NAIVE_KERNELS[0]):
            hbm.l2.flush(residue=cache == "cold")
        # An S beyond the storage dtype's range is stored as inf, as an fp16 eager path stores it, and its
        # row's softmax is NaN: counted below in run.overflow, not left to NumPy's RuntimeWarning.
        with hbm.kernel(kernel), np.errstate(over="ignore", invalid="ignore"):
            slots = concurrent_heads(kernel, sched, wave_rows)
            ctas = naive_grid(kernel, sched, heads, Q.dtype.itemsize, wave_rows, softmax_rows)
            for _ in run_bodies({cta: functools.partial(naive_body, kernel, cta) for cta in ctas}, slots, hbm):
                pass
        if kernel == NAIVE_KERNELS[0]:  # only the stored entries: masked ones are never written
            stored = np.isinf(hbm.inspect("S").astype(STATE_DTYPE))
            overflow = int((stored & sched.mask(0, 0)).sum() if sched.masks else stored.sum())
    return Run(
        out=hbm.inspect("O").reshape(np.shape(q)),
        traffic=hbm.traffic(),
        flops=machine.compute.flops,
        trace=Trace("none", (), _trace_config(config)),
        config=config,
        events=tuple(machine.log.events) if machine.log is not None else (),
        flops_by_kind=machine.compute.flops_by_kind(),
        physical=hbm.l2.traffic() if hbm.l2 is not None else None,
        overflow=overflow,
    ), hbm
