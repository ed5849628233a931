"""Flash-Decoding on the whole chip: the DRAM bytes its two kernels move past the L2, predicted.

`sf.model.predict_decode` prices every logical byte as a DRAM byte. On the GPU the L2 stands between:
without pack_gqa the query heads of a group each read the group's K and V, and the CTAs of one split
that read the same tile at once find it in the L2; every split CTA of a query tile reads the same Q_i.
This module runs the GPU backend's two kernels (backends/flash_decoding_split.cu and
flash_decoding_combine.cu) as traffic-only programs (simflash.grid.CTAProgram: the blocks
simflash/algorithms/flash_decoding_split.py and flash_decoding_combine.py move, without values),
launched as the GPU launches them, through the L2 model (simflash.l2) in the lock-step concurrent
schedule (simflash.grid), as simflash.model.physical does for FA-2 and the naive path:

- split kernel: CTA (z, s, i) in blockIdx order (query tile fastest, then split, then batch x head:
  `split_grid`), as many resident as the occupancy rules allow for its 128 threads and its shared
  memory (Q_i and three stages of K_j, V_j: two CTAs an SM at the default tiles). Prologue Q_i (when
  the split holds a tile of the query tile's run; every split CTA of the tile names the same block);
  a step per KV tile, K_j and V_j named by K/V head and first row (so the CTAs of a group that read a
  tile together hit); epilogue its rows of O_partial and LSE_partial (or of O, with one split).
- combine kernel: one CTA per output row, as the GPU launches it (the simulator's combine takes FA-2's
  4 rows a CTA: the same bytes), reading the row's LSE_partial of every split, then the split's
  O_partial rows a step each, and writing its row of O. Rows are the blocks on both sides, so a row
  the split kernel left in the L2 is a hit for the combine.

cold: the L2 flushed before each kernel (`ncu --cache-control all`, as the decode bench profiles);
warm: flushed once before the split kernel (a decode step as it runs: the combine may find the
partials where the split kernel left them). Dirty blocks left at a kernel's end are not its DRAM
writes (Nsight Compute charges them to no kernel): `dirty_at_end_bytes`.
"""

from __future__ import annotations

import functools

import attrs

from simflash.algorithms.flash_decoding_combine import KERNEL as COMBINE_KERNEL
from simflash.algorithms.flash_decoding_split import KERNEL as SPLIT_KERNEL
from simflash.algorithms.flash_decoding_split import split_grid
from simflash.chip import KernelProfile, kernel_profile, l2_cache, resident_ctas
from simflash.config import STATE_DTYPE, GPUSpec, check_bool, gpu_spec, storage_dtype
from simflash.grid import CTA, Access, CTAProgram, kv_head, run_programs
from simflash.l2 import L2, L2Flow
from simflash.model.decode import SPLIT_BLOCK_Q, combine_time, decode_launch, num_splits_heuristic
from simflash.model.physical import (CACHE_MODES, LAUNCH_SECONDS, KernelPrediction, _flash_seconds,
                                     _flash_step_seconds, _prediction, busiest_sm_steps)
from simflash.model.traffic import head_groups
from simflash.occupancy import occupancy
from simflash.schedule import SplitSchedule, check_cache_seqlens

# The GPU backend's launch (backends/kernels.py: DECODE_BLOCK_KV, DECODE_STAGES, DECODE_THREADS; the
# registers and static shared memory as ptxas reports them for the sm_90 builds).
BLOCK_KV = {64: 128, 128: 64}  # the default KV tile by head dim
STAGES = 3
THREADS = 128
SPLIT_PROFILE = KernelProfile(
    "simflash_decode_split", threads=lambda bq, bkv, d: THREADS, registers=lambda d: 168 if d > 64 else 122,
    shared_bytes=lambda bq, bkv, d, b: (bq + STAGES * 2 * bkv) * d * b, longest_first=False,
    kv_descending=False, spills=False, tiles=lambda d: (SPLIT_BLOCK_Q, BLOCK_KV[d]))
COMBINE_REGISTERS = 56
COMBINE_STATIC_SHARED = 2048  # the partial sums of the row's four thread groups


@attrs.frozen
class DecodeKernelDram:
    """One kernel of the step: its launch on the chip and what the L2 made of its transfers."""

    kernel: str
    ctas: int
    resident_ctas: int
    makespan_steps: int
    tile_steps: int  # the CTAs' steps summed (split: KV tiles visited; combine: partial rows read)
    busiest_sm_steps: int  # one CTA's steps the busiest SM works through (simflash.model.physical.busiest_sm_steps)
    flow: L2Flow  # logical reads and writes, L2 hits, DRAM reads and writes, dirty at the end
    by_tensor: dict[str, L2Flow]

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "ctas": self.ctas, "resident_ctas": self.resident_ctas,
                "makespan_steps": self.makespan_steps, "tile_steps": self.tile_steps,
                "busiest_sm_steps": self.busiest_sm_steps, **attrs.asdict(self.flow),
                "by_tensor": {name: attrs.asdict(flow) for name, flow in self.by_tensor.items()}}


@attrs.frozen
class DecodeDramPrediction:
    config: dict
    kernels: tuple[DecodeKernelDram, ...]

    def kernel(self, name: str) -> DecodeKernelDram:
        return next(k for k in self.kernels if k.kernel == name)

    def to_dict(self) -> dict:
        return {"config": self.config, "kernels": [k.to_dict() for k in self.kernels]}


def split_programs(sched: SplitSchedule, heads_per_batch: int, group: int, d: int, itemsize: int
                   ) -> list[CTAProgram]:
    """The split kernel's CTAs in launch order as programs. heads_per_batch: CTA heads (packed groups or
    query heads) per batch element; group: CTA heads per K/V head (1 when packed)."""
    programs = []
    for cta in split_grid(sched, heads_per_batch, group):
        z, s, i = cta.index
        tiling = sched.of_batch(z // heads_per_batch)
        rows = tiling.q_rows(i)
        out = range(z * tiling.n_rows + rows.start, z * tiling.n_rows + rows.stop)
        h_kv = kv_head(z, group)
        kv = tuple(_kv_step(tiling, h_kv, j, d * itemsize) for j in sched.split_tiles(z // heads_per_batch, i, s))
        # a split with no tile of the run exits without loading Q_i, but writes its partials
        prologue = (Access(("Q", z, rows.start), len(out) * d * itemsize),) if kv else ()
        if sched.num_splits > 1:
            epilogue = tuple(access for r in out for access in (
                Access(("O_partial", s, r), d * STATE_DTYPE.itemsize, write=True),
                Access(("LSE_partial", s, r), STATE_DTYPE.itemsize, write=True)))
        else:
            epilogue = tuple(Access(("O", r), d * itemsize, write=True) for r in out)
        programs.append(CTAProgram(cta, kv.__getitem__, prologue, epilogue))
    return programs


def _kv_step(tiling, h_kv: int, j: int, row_bytes: int) -> tuple[Access, Access]:
    cols = tiling.kv_cols(j)  # valid rows only
    nbytes = (cols.stop - cols.start) * row_bytes
    return Access(("K", h_kv, cols.start), nbytes), Access(("V", h_kv, cols.start), nbytes)


def _partial_row(split: int, row: int, nbytes: int) -> tuple[Access]:
    """The combine's step `split` for one output row: that split's O_partial row."""
    return (Access(("O_partial", split, row), nbytes),)


def combine_programs(rows: int, num_splits: int, d: int, itemsize: int) -> list[CTAProgram]:
    """The combine kernel's CTAs, one per output row in order: every split's LSE_partial of the row, then
    a step per split reading its O_partial row, then the row of O."""
    s = STATE_DTYPE.itemsize
    return [CTAProgram(CTA((r,), num_splits, (r,)), functools.partial(_partial_row, row=r, nbytes=d * s),
                       tuple(Access(("LSE_partial", split, r), s) for split in range(num_splits)),
                       (Access(("O", r), d * itemsize, write=True),))
            for r in range(rows)]


def combine_resident_ctas(spec: GPUSpec, num_splits: int) -> int:
    """Combine CTAs resident on the chip: 128 threads, a weight a split of dynamic shared memory."""
    shared = COMBINE_STATIC_SHARED + num_splits * STATE_DTYPE.itemsize
    return occupancy(spec, THREADS, COMBINE_REGISTERS, shared).cta_slots_per_sm * spec.sm_count


def predict_decode_dram(
    n_kv: int, d: int, *, batch: int = 1, heads: int = 1, kv_heads: int | None = None, n_q: int = 1,
    num_splits: int | None = None, block_kv: int | None = None, pack_gqa: bool = True, cache_seqlens=None,
    causal: bool = False, window: tuple[int, int] = (-1, -1), dtype: str = "float16", gpu: str | GPUSpec = "H200",
    cache: str = "cold", split_profile: KernelProfile = SPLIT_PROFILE,
) -> DecodeDramPrediction:
    """DRAM bytes of the GPU backend's Flash-Decoding step on `gpu`, kernel by kernel and tensor by tensor.
    heads, kv_heads: per batch element; block_kv None: the backend's default tile (BLOCK_KV); num_splits
    None: FA-2's heuristic as the backend feeds it (split CTAs without splits, SMs x 2, KV tiles).
    split_profile: the split kernel's launch (another's than the backend's, e.g. PyTorch's, with block_kv)."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
    spec = gpu_spec(gpu)
    if split_profile is SPLIT_PROFILE and d not in BLOCK_KV:
        raise ValueError(f"d must be one of {list(BLOCK_KV)} for the GPU Flash-Decoding kernels, got {d!r}")
    cta_heads, pack = head_groups(heads, kv_heads, check_bool("pack_gqa", pack_gqa))
    group = 1 if pack_gqa else heads // (kv_heads or heads)  # CTA heads per K/V head
    block_kv = BLOCK_KV[d] if block_kv is None else block_kv
    if num_splits is None:
        q_tiles = -(-n_q * pack // SPLIT_BLOCK_Q)
        num_splits = num_splits_heuristic(batch * cta_heads * q_tiles, 2 * spec.sm_count, -(-n_kv // block_kv))
    sched = SplitSchedule(n_q, n_kv, SPLIT_BLOCK_Q, block_kv, num_splits,
                          check_cache_seqlens(cache_seqlens, batch, n_kv), causal, window, pack)
    itemsize = storage_dtype(dtype).itemsize
    config = {"n_kv": n_kv, "d": d, "batch": batch, "heads": heads, "kv_heads": kv_heads, "n_q": n_q,
              "num_splits": num_splits, "block_kv": block_kv, "pack_gqa": pack_gqa, "dtype": dtype,
              "gpu": spec.name, "cache": cache}
    l2 = l2_cache(spec)
    splits = split_programs(sched, cta_heads, group, d, itemsize)
    launches = [(SPLIT_KERNEL, splits, resident_ctas(spec, split_profile, SPLIT_BLOCK_Q, block_kv, d, itemsize))]
    if num_splits > 1:
        rows = batch * cta_heads * sched.of_batch(0).n_rows
        launches.append((COMBINE_KERNEL, combine_programs(rows, num_splits, d, itemsize),
                         combine_resident_ctas(spec, num_splits)))
    return DecodeDramPrediction(config, tuple(_play(l2, cache, *launch, first=at == 0, sm_count=spec.sm_count)
                                              for at, launch in enumerate(launches)))


def _play(l2: L2, cache: str, kernel: str, programs: list[CTAProgram], slots: int, first: bool, sm_count: int
          ) -> DecodeKernelDram:
    if cache == "cold" or first:
        l2.flush()
    l2.kernel = kernel
    resident = run_programs(programs, slots, l2)
    l2.end_kernel()
    traffic = l2.traffic()
    by_tensor = {tensor: flow for (name, tensor), flow in traffic.ledger.items() if name == kernel}
    return DecodeKernelDram(kernel, len(programs), slots, len(resident), sum(p.cta.n_steps for p in programs),
                            busiest_sm_steps([p.cta.n_steps for p in programs], slots, sm_count),
                            traffic.by_kernel[kernel], by_tensor)


def predict_sdpa_split_kv(n: int, n_kv: int, d: int, heads: int, causal: bool, dtype: str, spec: GPUSpec,
                          cache: str) -> tuple[tuple[KernelPrediction, ...], int, str] | None:
    """PyTorch's FA-2 forward where its grid is too small to fill the chip: mha_fwd runs it split-KV when
    FA-2's heuristic (`simflash.model.decode.decode_launch`: query tiles of 64 rows against 2 x SMs) picks
    more than one split, as it does below 0.8 x 2 x SMs such tiles. Its two kernels (the split kernel with
    FA-2's KV tile, writing fp32 partials; the combine) are played through the L2 as Flash-Decoding's
    (`predict_decode_dram`). The split kernel is timed as the FA-2 kernel is (the busiest SM's KV tiles
    over the lock-step schedule, at 64 query rows a tile; its DRAM and L2 terms), the combine by the
    decode model (`simflash.model.decode.combine_time`) at its logical bytes. Returns the kernels, the
    split count and a note saying so, or None where FA-2 runs one split (the plain kernel)."""
    launch = decode_launch(n_kv, d, heads=heads, n_q=n, pack_gqa=False, dtype=dtype, gpu=spec)
    if launch.num_splits == 1:
        return None
    split, combine = predict_decode_dram(
        n_kv, d, heads=heads, n_q=n, num_splits=launch.num_splits, block_kv=launch.block_kv, pack_gqa=False,
        causal=causal, dtype=dtype, gpu=spec, cache=cache, split_profile=kernel_profile("sdpa_flash")).kernels
    step_s = _flash_step_seconds(spec, "sdpa_flash", SPLIT_BLOCK_Q, launch.block_kv, d)
    split_terms = _flash_seconds(spec, split.flow, split.busiest_sm_steps * step_s)
    # the combine's loads are latency-bound, little faster from the L2 than from DRAM (the splitkv sweep: 13.8 µs
    # warm, its partials all hits, 17.0 cold at N = 12,288, one head, d = 128): timed at its logical bytes
    merge = combine_time(spec, launch, d, combine.flow.read_bytes + combine.flow.write_bytes)
    kernels = (
        _prediction(split.kernel, split.flow, split_terms, LAUNCH_SECONDS, split.ctas, split.resident_ctas,
                    split.tile_steps, split.makespan_steps, split.busiest_sm_steps),
        _prediction(combine.kernel, combine.flow, {"dram": merge.dram_s, "compute": merge.compute_s},
                    LAUNCH_SECONDS, combine.ctas, combine.resident_ctas, combine.tile_steps, combine.makespan_steps,
                    combine.busiest_sm_steps))
    q_tiles = heads * -(-n // SPLIT_BLOCK_Q)
    note = (f"PyTorch runs this grid split-KV ({q_tiles} query tiles of {SPLIT_BLOCK_Q} rows fill less than 0.8 x 2 x "
            f"{spec.sm_count} SMs): {launch.num_splits} splits of {launch.block_kv}-row KV tiles, flash_fwd_splitkv_kernel "
            f"writing fp32 partial outputs and flash_fwd_splitkv_combine_kernel, predicted as the {SPLIT_KERNEL} and "
            f"{COMBINE_KERNEL} kernels; the combine's time is the decode model's")
    return kernels, launch.num_splits, note
