"""Physical traffic and time, predicted: the logical transfers played through the whole chip.

A traffic-only run: each kernel's CTAs (simflash.algorithms) as programs without values, launched
onto the chip's CTA slots in lock-step (simflash.grid), every transfer through the L2 model
(simflash.l2), cold (flushed before every kernel) or warm (flushed once before the first). Per kernel:
logical bytes, L2 hits, DRAM reads and writes, dirty bytes left in the L2, and a predicted time.
A kernel that spills registers also writes some of its stack frame to DRAM (`spill_write_bytes`),
which the logical ledger does not see; its DRAM writes include them. Where a kernel's CTAs read K and V
again one after another (PyTorch's FA-2 kernel with the mask), at least a fitted share of those reads
miss once the grid runs in more than one wave (`with_reread_floor`).

Time, per kernel: the larger of
- compute: the busiest SM's work over the lock-step schedule. Each CTA stays on the SM of the slot
  it starts in (`busiest_sm_steps`), and at each time step the SM holding the most resident CTAs
  does one KV tile of each (tensor-core FLOPs at the kernel's achieved fraction of peak +
  exponentials on the special-function units + other FP32 work) while they share it: waves, the
  causal imbalance between CTAs, two long CTAs sharing an SM to the end, and a partial last wave
  whose CTAs have an SM each are all in it;
- DRAM: predicted DRAM bytes over the achieved HBM bandwidth;
- L2: logical bytes over the L2 bandwidth.
The naive path's GEMMs and softmax are library-style kernels with their own grids (`naive_seconds`):
a GEMM is a roofline at its achieved rates, the softmax streams at the achieved HBM bandwidth and
pays a fixed cost per row (one CTA per row). Fitted figures live in the machine file's
[calibration] table (`simflash physical-validate` says how well they hold on configurations they never saw).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.algorithms.naive import KERNELS as NAIVE_KERNELS
from simflash.algorithms.naive import QK_GROUP_KEYS, concurrent_heads, naive_grid, naive_program, stored_per_row
from simflash.chip import (KernelProfile, gemm_pv_wave_rows, kernel_profile, l2_cache, resident_ctas,
                           softmax_resident_rows)
from simflash.config import GPUSpec, check_causal_variant, check_positive_int, gpu_spec, storage_dtype
from simflash.grid import run_programs
from simflash.l2 import L2, L2Flow
from simflash.schedule import TileSchedule

ALGORITHMS = ("naive", "fa2")
CACHE_MODES = ("cold", "warm")
LAUNCH_SECONDS = 3e-6  # a kernel launch's fixed cost on the GPU side


@attrs.frozen
class KernelPrediction:
    kernel: str
    logical_read_bytes: int
    logical_write_bytes: int
    l2_hit_bytes: int
    dram_read_bytes: int
    dram_write_bytes: int
    dirty_at_end_bytes: int  # still in the L2 when the kernel ends: not DRAM traffic of this kernel
    spill_write_bytes: int  # DRAM writes of register spills (part of dram_write_bytes)
    time_s: float
    bound: str  # which term set the time: "compute", "dram" or "l2"
    ctas: int
    resident_ctas: int
    tile_steps: int  # the CTAs' steps summed (FA-2: KV tiles visited)
    makespan_steps: int  # time steps of the lock-step schedule
    busiest_sm_steps: int  # one CTA's steps the busiest SM works through (the compute term's multiplier)

    def to_dict(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen
class PhysicalPrediction:
    config: dict
    kernels: tuple[KernelPrediction, ...]
    notes: tuple[str, ...] = ()  # what the prediction leaves out, in words

    def kernel(self, name: str) -> KernelPrediction:
        return next(k for k in self.kernels if k.kernel == name)

    def to_dict(self) -> dict:
        return {"config": self.config, "kernels": [k.to_dict() for k in self.kernels], "notes": list(self.notes)}


def predict(
    algorithm: str = "fa2", n: int = 4096, d: int = 128, *, n_kv: int | None = None, heads: int = 1,
    causal: bool = False, causal_variant: str = "upper_left", dtype: str = "float16",
    block_q: int | None = None, block_kv: int | None = None, gpu: str | GPUSpec = "H200",
    cache: str = "cold", kernel: str = "simflash",
) -> PhysicalPrediction:
    """Predict DRAM bytes and time of each kernel of `algorithm` on `gpu`, without values.

    kernel names the FA-2 implementation whose occupancy and launch order are modelled: "simflash"
    (the GPU backend's kernel) or "sdpa_flash" (FlashAttention-2 in PyTorch); its default tiles
    unless block_q/block_kv are given. PyTorch runs a grid too small to fill the chip split-KV: two
    kernels (`simflash.model.decode_chip.predict_sdpa_split_kv`) in place of flash2_forward."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    for name, value in (("n", n), ("d", d), ("heads", heads)):
        check_positive_int(name, value)
    n_kv = n if n_kv is None else check_positive_int("n_kv", n_kv)
    check_causal_variant(causal_variant)
    spec = gpu_spec(gpu)
    itemsize = storage_dtype(dtype).itemsize
    profile = kernel_profile(kernel)
    default_q, default_kv = profile.tiles(d)
    block_q = default_q if block_q is None else check_positive_int("block_q", block_q)
    block_kv = default_kv if block_kv is None else check_positive_int("block_kv", block_kv)
    config = {"algorithm": algorithm, "n": n, "n_kv": n_kv, "d": d, "heads": heads, "causal": causal,
              "causal_variant": causal_variant, "dtype": dtype, "gpu": spec.name, "cache": cache}
    l2 = l2_cache(spec)
    if algorithm == "naive":
        return PhysicalPrediction(config, _naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache),
                                  _naive_notes(spec, n, n_kv, heads, causal, causal_variant, itemsize, cache))
    config.update(kernel=kernel, block_q=block_q, block_kv=block_kv)
    if kernel == "sdpa_flash" and (block_q, block_kv) == profile.tiles(d) and (
            not causal or n == n_kv or causal_variant == "lower_right"):  # the split path's mask is bottom-right
        from simflash.model.decode_chip import predict_sdpa_split_kv  # (that module builds on this one)

        split = predict_sdpa_split_kv(n, n_kv, d, heads, causal, dtype, spec, cache)
        if split is not None:
            kernels, num_splits, note = split
            return PhysicalPrediction({**config, "num_splits": num_splits}, kernels, (note,))
    sched = TileSchedule(n, n_kv, block_q, block_kv, causal=causal, causal_variant=causal_variant)
    fa2 = FLASH_ALGORITHMS["fa2"]
    ctas = fa2.grid(sched, heads, longest_first=profile.longest_first, kv_descending=profile.kv_descending)
    assert fa2.program is not None  # fa2 has a traffic-only program
    slots = resident_ctas(spec, profile, block_q, block_kv, d, itemsize)
    l2.flush(residue=cache == "cold")
    l2.kernel = fa2.kernel
    programs = (fa2.program(sched, cta, d, itemsize, kv_descending=profile.kv_descending) for cta in ctas)
    resident = run_programs(programs, slots, l2)
    l2.end_kernel()
    tile_steps = sum(cta.n_steps for cta in ctas)
    own_build = (block_q, block_kv) == profile.tiles(d) and itemsize == 2  # the instantiations the figures are of
    spills = spill_write_bytes(spec, kernel, d, causal, len(ctas), tile_steps) if own_build else 0
    flow = l2.traffic().by_kernel[fa2.kernel] + L2Flow(dram_write_bytes=spills)
    floor = spec.calibration.get(figure_key("reread_floor", kernel, d, causal), 0.0) if own_build else 0.0
    several_waves = len(ctas) > slots
    if floor and several_waves:
        flow = with_reread_floor(flow, floor, first_read_bytes(sched, heads, d, itemsize))
    sm_steps = busiest_sm_steps([cta.n_steps for cta in ctas], slots, spec.sm_count)
    terms = _flash_seconds(spec, flow, sm_steps * _flash_step_seconds(spec, kernel, block_q, block_kv, d))
    kernels = (_prediction(fa2.kernel, flow, terms, LAUNCH_SECONDS, len(ctas), slots, tile_steps, len(resident),
                           sm_steps, spills),)
    notes = (_spill_notes(spec, profile, d, causal, own_build) + _diagonal_notes(profile, causal, len(ctas), slots)
             + _floor_notes(profile, floor, several_waves))
    return PhysicalPrediction(config, kernels, notes)


def _diagonal_notes(profile: KernelProfile, causal: bool, ctas: int, slots: int) -> tuple[str, ...]:
    """Where a causal kernel that walks each CTA's KV tiles from its diagonal down runs in several waves, a
    note that its DRAM reads are the model's least reliable (docs/physical.md, "Where it is wrong")."""
    if not (profile.kv_descending and causal and ctas > slots):
        return ()
    return (f"{profile.name} with the mask walks each CTA's K and V tiles from its diagonal down, so a tile is "
            "read again by one CTA after another, never by a cohort at once; the real L2 keeps such reuse by "
            "a share that falls with the distance and with the heads before, which the model's "
            "least-recently-used caches do not describe: over several waves its DRAM reads are the model's "
            "least reliable (at d = 128, off by up to a few times on the sweeps; docs/physical.md, "
            "\"Where it is wrong\")",)


def _floor_notes(profile: KernelProfile, floor: float, several_waves: bool) -> tuple[str, ...]:
    """Where a re-read floor bounds the DRAM reads from below, a note saying so."""
    if not (floor and several_waves):
        return ()
    return (f"{profile.name}'s DRAM reads are at least Q, K and V once and {floor:.2%} of the K and V read again "
            "(the machine file's fitted floor for this compiled instantiation: docs/physical.md)",)


PV_WARM_SCORE_BYTES = 8 * 1024 * 1024  # P (all heads) from which the P V GEMM's warm writes go astray


def _naive_notes(spec: GPUSpec, n: int, n_kv: int, heads: int, causal: bool, causal_variant: str, itemsize: int,
                 cache: str) -> tuple[str, ...]:
    """Where the naive path's cuBLAS kernels do what the model's one CTA a head does not, notes saying so, with
    what the sweeps measured (docs/physical.md, "Where it is wrong")."""
    notes = []
    sched = TileSchedule(n, n_kv, n, n_kv, causal=causal, causal_variant=causal_variant)
    capacity = spec.calibration.get("l2_effective_bytes", spec.l2_bytes)  # the L2 model's (chip.l2_cache)
    if itemsize == 2 and heads * int(stored_per_row(sched).sum()) * itemsize >= capacity:
        notes.append("gemm_qk's DRAM writes (the S the L2 cannot keep) depend on which of two families of kernels "
                     "cuBLAS picks, which the model does not know: its kernels whose names end in _TNT leave a median "
                     "28.0 MiB of S dirty at their end, as the model does (28.5), those ending in _TNN 26.1, so about "
                     "2 MiB more is written (benchmarks/gpu/naive_warm/residues.txt)")
    if itemsize != 2 and n_kv > QK_GROUP_KEYS:
        notes.append("gemm_qk reads Q's tiles again once a group of 2,048 keys, as cuBLAS's 16-bit Q K GEMM walks "
                     "them (benchmarks/gpu/naive_warm/qk_shapes.txt); its kernels for other element sizes were not "
                     "measured, so its predicted DRAM reads are the 16-bit kernel's")
    if cache == "warm" and heads * n * n_kv * itemsize >= PV_WARM_SCORE_BYTES:
        notes.append("gemm_pv's warm DRAM writes (the P the softmax left dirty, written back as the GEMM runs) "
                     "depend on the tile cuBLAS picks, which the model does not know: within 10% / 1 MiB of the "
                     "measured on 135 of the sweeps' 224 unseen rows (benchmarks/gpu/naive_warm/pv_kernels.txt)")
    return tuple(notes)


def _spill_notes(spec: GPUSpec, profile: KernelProfile, d: int, causal: bool, own_build: bool) -> tuple[str, ...]:
    """Where a kernel that spills is predicted without its spill writes, a note saying so and why."""
    if not profile.spills:
        return ()
    build = f"{profile.name} at d={d}{' causal' if causal else ''}"
    if not own_build:
        block_q, block_kv = profile.tiles(d)
        return (f"{build} spills as compiled for its own tiles ({block_q}x{block_kv}) in a 16-bit dtype; for other "
                "tiles or dtypes the DRAM writes leave its register spills out",)
    if f"{figure_key('spill', profile.name, d, causal)}_cta_bytes" not in spec.calibration:
        return (f"{spec.name}'s machine file has no spill figures for {build}: the DRAM writes leave out the "
                "kernel's register spills",)
    return ()


def _play_naive_kernel(kernel: str, sched: TileSchedule, heads: int, d: int, itemsize: int, wave_rows: int,
                       softmax_rows: int, l2: L2) -> tuple[list[int], int, int]:
    """One naive kernel's CTAs played through the L2: their steps, the slots they run in, the makespan in steps."""
    ctas = naive_grid(kernel, sched, heads, itemsize, wave_rows, softmax_rows)
    slots = concurrent_heads(kernel, sched, wave_rows)
    resident = run_programs((naive_program(kernel, sched, cta, d, itemsize, wave_rows, softmax_rows=softmax_rows)
                             for cta in ctas), slots, l2)
    return [cta.n_steps for cta in ctas], slots, len(resident)


def _naive(spec, l2: L2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache, play=_play_naive_kernel):
    """The three kernels, each played by `play` (the model's layout; the L2 variants lay a kernel out otherwise)."""
    sched = TileSchedule(n, n_kv, n, n_kv, causal=causal, causal_variant=causal_variant)
    stored = int(stored_per_row(sched).sum()) * heads
    wave_rows = gemm_pv_wave_rows(spec)
    softmax_rows = softmax_resident_rows(spec, n_kv, itemsize)
    predictions = []
    for kernel in NAIVE_KERNELS:
        if cache == "cold" or kernel == NAIVE_KERNELS[0]:
            l2.flush(residue=cache == "cold")
        l2.kernel = kernel
        n_steps, slots, makespan = play(kernel, sched, heads, d, itemsize, wave_rows, softmax_rows, l2)
        l2.end_kernel()
        flow = l2.traffic().by_kernel[kernel]
        terms = naive_seconds(spec, kernel, flow, gemm_flops=2 * stored * d, rows=heads * n, exps=stored)
        launch = spec.calibration.get("naive_launch_seconds", LAUNCH_SECONDS)
        predictions.append(_prediction(kernel, flow, terms, launch, heads, slots, sum(n_steps), makespan,
                                       busiest_sm_steps(n_steps, slots, spec.sm_count)))
    return tuple(predictions)


def figure_key(figure: str, kernel: str, d: int, causal: bool) -> str:
    """The name (spills: the prefix) of a compiled instantiation's `figure` in the machine file's [calibration]
    table: spill, reread_floor."""
    return f"{figure}_{kernel}_d{d}" + ("_causal" if causal else "")


def first_read_bytes(sched: TileSchedule, heads: int, d: int, itemsize: int) -> int:
    """Bytes an FA-2 grid reads at least once: every row of Q, and the rows of K and V some query tile sees."""
    kv_tiles = set().union(*(sched.kv_range(i) for i in range(sched.n_q_tiles)))
    kv_rows = sum(sched.kv_cols(j).stop - sched.kv_cols(j).start for j in kv_tiles)
    return heads * (sched.n_rows + 2 * kv_rows) * d * itemsize


def with_reread_floor(flow: L2Flow, share: float, first_reads: int) -> L2Flow:
    """`flow` with at least `share` of its reads beyond the first of each byte (`first_reads`) missing. PyTorch's
    FA-2 kernel with the mask walks each CTA's K and V from its diagonal down, so a tile is read again by one CTA
    after another; in grids of several waves the real L2 loses about 1% of those reads where least recently used
    order loses none (benchmarks/gpu/sdpa_kv_order/floor.txt; the sweeps' rows, docs/physical.md)."""
    least = first_reads + round(share * (flow.read_bytes - first_reads))
    extra = max(0, least - flow.dram_read_bytes)
    return attrs.evolve(flow, hit_bytes=flow.hit_bytes - extra, dram_read_bytes=flow.dram_read_bytes + extra)


def spill_write_bytes(spec: GPUSpec, kernel: str, d: int, causal: bool, ctas: int, tile_steps: int) -> int:
    """DRAM writes of a kernel's register spills. PyTorch's FA-2 kernel keeps a stack frame of 112-144
    bytes a thread in local memory (benchmarks/gpu/sdpa_resource_usage_sm90.txt): its SMs store many
    times O there, and the L2 gives some of those lines up to DRAM, some bytes per CTA and some per KV
    tile step. Both are fitted per compiled instantiation (head dimension, mask) on the calibration
    sweep's fit set (`simflash.model.calibration.fit_spill_writes`); 0 where the machine file has no
    figures (simflash's kernel, whose DRAM writes are O alone; SDPA at a head dimension not measured)."""
    key = figure_key("spill", kernel, d, causal)
    per_cta = spec.calibration.get(f"{key}_cta_bytes", 0.0)
    per_step = spec.calibration.get(f"{key}_step_bytes", 0.0)
    return round(per_cta * ctas + per_step * tile_steps)


def naive_seconds(spec: GPUSpec, kernel: str, flow: L2Flow, gemm_flops: int, rows: int, exps: int) -> dict[str, float]:
    """The naive path's kernels are library-style kernels with their own grids: a GEMM is a roofline (the
    largest of its FLOPs, its DRAM bytes and its L2 bytes at their achieved rates); the softmax (one
    CTA per row) streams its DRAM bytes and pays a fixed cost per row, unless its exponentials take
    longer. Achieved rates from the machine file's [calibration] table where it has them
    (`simflash.model.calibration.fit_naive_time`), peak rates otherwise."""
    cal = spec.calibration
    dram = (flow.dram_read_bytes + flow.dram_write_bytes) / cal.get("naive_hbm_bytes_per_s", spec.hbm_bytes_per_s)
    if kernel == "softmax":
        return {"dram": dram + rows * cal.get("softmax_row_seconds", 0.0), "compute": exps / spec.sfu_ops_per_s}
    return {"compute": gemm_flops / cal.get("gemm_flops_per_s", spec.peak_flops["float16"]), "dram": dram,
            "l2": (flow.read_bytes + flow.write_bytes) / cal.get("gemm_l2_bytes_per_s", spec.l2_bytes_per_s)}


def busiest_sm_steps(n_steps: Sequence[int], slots: int, sm_count: int) -> int:
    """One CTA's steps the busiest SM works through over the lock-step schedule, CTAs pinned to SMs: the
    CTAs (their steps, in launch order) fill the slots as the lock-step schedule does, each holding its
    slot for its steps and its epilogue, a freed slot taking the next CTA; slot i is on SM i mod SMs, so
    the first wave has a CTA on every SM before any holds two, and a CTA never moves. At each time step
    the SM holding the most CTAs works through one step of each, taking turns."""
    remaining = np.zeros(slots, dtype=np.int64)  # time steps each slot's CTA still holds it (0: free)
    sm = np.arange(slots) % sm_count
    pending = iter(n_steps)
    total = 0
    while True:
        for slot in np.flatnonzero(remaining == 0):
            steps = next(pending, None)
            if steps is None:
                break
            remaining[slot] = steps + 1
        busy = remaining > 0
        if not busy.any():
            return total
        until_one_ends = int(remaining[busy].min())  # the SMs' loads hold until then
        total += int(np.bincount(sm[busy], minlength=sm_count).max()) * until_one_ends
        remaining[busy] -= until_one_ends


def flash_step_work(spec: GPUSpec, block_q: int, block_kv: int, d: int) -> tuple[float, float]:
    """One KV tile of one CTA with an SM to itself: (its matmuls at the tensor cores' peak, its
    exponentials on the special-function units plus its other FP32 work), in seconds."""
    scores = block_q * block_kv
    tensor = 4 * scores * d / (spec.peak_flops["float16"] / spec.sm_count)
    exp = (scores + block_q) / (spec.sfu_ops_per_s / spec.sm_count)
    fp32 = (4 * scores + block_q * d) / (spec.fp32_flops_per_s / spec.sm_count)
    return tensor, exp + fp32


def _flash_step_seconds(spec: GPUSpec, kernel: str, block_q: int, block_kv: int, d: int) -> float:
    """One KV tile of one CTA with an SM to itself, its matmuls at the kernel's achieved fraction of peak."""
    tensor, other = flash_step_work(spec, block_q, block_kv, d)
    return tensor / spec.calibration.get(f"tensor_efficiency_{kernel}", 1.0) + other


def dram_seconds(nbytes: int, bytes_per_s: float) -> float:
    """Time to move `nbytes` through DRAM at `bytes_per_s`: the time model's DRAM term."""
    return nbytes / bytes_per_s


def _flash_seconds(spec: GPUSpec, flow: L2Flow, compute_s: float) -> dict[str, float]:
    """The FA-2 kernel's terms: the lock-step compute, its DRAM bytes at the achieved HBM bandwidth, its
    logical bytes at the L2's."""
    hbm = spec.hbm_bytes_per_s * spec.calibration.get("hbm_efficiency", 1.0)
    return {"compute": compute_s, "dram": dram_seconds(flow.dram_read_bytes + flow.dram_write_bytes, hbm),
            "l2": (flow.read_bytes + flow.write_bytes) / spec.l2_bytes_per_s}


def _prediction(kernel: str, flow: L2Flow, terms: dict[str, float], launch_s: float, ctas: int, slots: int,
                tile_steps: int, steps: int, sm_steps: int, spills: int = 0) -> KernelPrediction:
    """The kernel's time is its largest term plus the launch."""
    bound = max(terms, key=terms.__getitem__)
    return KernelPrediction(
        kernel=kernel, logical_read_bytes=flow.read_bytes, logical_write_bytes=flow.write_bytes,
        l2_hit_bytes=flow.hit_bytes, dram_read_bytes=flow.dram_read_bytes, dram_write_bytes=flow.dram_write_bytes,
        dirty_at_end_bytes=flow.dirty_at_end_bytes, spill_write_bytes=spills, time_s=terms[bound] + launch_s, bound=bound,
        ctas=ctas, resident_ctas=slots, tile_steps=tile_steps, makespan_steps=steps, busiest_sm_steps=sm_steps,
    )
