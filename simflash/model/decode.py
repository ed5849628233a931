"""Flash-Decoding in closed form: FlashAttention-2's split choices, the launch (CTAs, waves), the exact
bytes and arithmetic of its two kernels, and a predicted time on the whole chip.

FlashAttention-2's choices, as its sources make them (github.com/Dao-AILab/flash-attention, read at
commit 0251105a):

- csrc/flash_attn/flash_api.cpp, `set_params_splitkv`: the KV tile block_n by head dim
  (`head_size <= 64 ? 256 : (head_size <= 128 ? 128 : 64)`, "needs to match with
  run_mha_fwd_splitkv_dispatch"), query tiles of 64 rows ("kBlockM = 64 only for the splitKV
  kernels"), and, when the caller passes no split count, `num_splits_heuristic(batch_size *
  num_heads * num_m_blocks, num_sm * 2, num_n_blocks, 128)`: SMs x 2 because the kernel runs 128
  threads per CTA, two CTAs to an SM. mha_fwd_kvcache calls it after folding a group's query heads
  into the rows when seqlen_q = 1 (`seqlenq_ngroups_swapped`: num_heads becomes the K/V heads and
  seqlen_q the group size), which is what pack_gqa does here.
- the same file, `num_splits_heuristic`: for each eligible split count up to min(max_splits, SMs,
  n_blocks), the wave efficiency n_waves / ceil(n_waves) with n_waves = CTAs x splits / SMs; it takes
  the smallest count within 85% of the best, and one split when the CTAs already fill 80% of the SMs.
  A count is eligible when it changes the tiles per split (12 splits of 64 tiles are 11 in effect).
- csrc/flash_attn/src/flash_fwd_launch_template.h, `run_flash_splitkv_fwd`: the split grid
  (query tiles, splits, batch x heads) and the combine's kBlockM rows per CTA by head dim
  (`kHeadDim % 128 == 0 ? 4 : (kHeadDim % 64 == 0 ? 8 : 16)`, kHeadDim the compiled head dim:
  d rounded up to 32, 64, 96, 128, 192 or 256, HEADDIM_SWITCH in static_switch.h). With one split,
  that commit's `run_mha_fwd_splitkv_dispatch` switches to the non-split kernel's KV tile (64 for
  d > 64, `run_mha_fwd_splitkv_align`, for numerics identical to the standard kernel); simflash keeps
  block_n for every split count, so one split and many cut the same tiles.

Bytes and arithmetic here are derived from the tiling alone (per query tile: the run of KV tiles it
visits, cut at the split boundaries), independently of the simulator's loops; the tests hold the two
equal byte for byte.
"""

from __future__ import annotations

import math
from collections import Counter

import attrs
import numpy as np

from simflash.chip import KERNEL_PROFILES, resident_ctas
from simflash.config import STATE_DTYPE, GPUSpec, check_bool, check_positive_int, gpu_spec, storage_dtype
from simflash.memory import Flow, Traffic
from simflash.model.physical import LAUNCH_SECONDS, _flash_step_seconds, dram_seconds
from simflash.model.traffic import head_groups, query_tiles
from simflash.occupancy import occupancy
from simflash.schedule import check_cache_seqlens, check_num_splits

SPLIT_KERNEL = "flash_decoding_split"
COMBINE_KERNEL = "flash_decoding_combine"
SPLIT_BLOCK_Q = 64  # kBlockM of FA-2's split kernel
MAX_SPLITS = 128  # set_params_splitkv: "num_splits > 128 not supported"
FA2_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # the head dims FA-2 compiles (HEADDIM_SWITCH)
FA2_THREADS = 128  # both kernels: Flash_fwd_kernel_traits<..., 4 warps>
# FlashAttention-2 as PyTorch ships it: the split kernel uses the same kernel traits (4 warps, Q_i, K_j,
# V_j in shared memory), so its occupancy is that profile's; simflash.chip cites its register count.
SPLIT_PROFILE = KERNEL_PROFILES["sdpa_flash"]


def default_block_kv(d: int) -> int:
    """FA-2's KV tile for the split kernel by head dim (set_params_splitkv's block_n)."""
    d = check_positive_int("d", d)
    return 256 if d <= 64 else 128 if d <= 128 else 64


def combine_block_rows(d: int) -> int:
    """Rows per combine CTA (FA-2's kBlockM): 4, 8 or 16 by the compiled head dim."""
    d = check_positive_int("d", d)
    compiled = next((dim for dim in FA2_HEAD_DIMS if dim >= d), d)  # past 256, FA-2 has no kernel: d itself
    return 4 if compiled % 128 == 0 else 8 if compiled % 64 == 0 else 16


def split_efficiencies(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int,
                       max_splits: int = MAX_SPLITS) -> dict[int, float]:
    """The wave efficiency n_waves / ceil(n_waves) of every split count FA-2's heuristic considers, in its
    float32 arithmetic (n_waves = CTAs x splits / SMs): 1..min(max_splits, SMs, n-blocks), eligible ones
    only (a count is eligible when it changes the tiles per split: 12 splits of 64 tiles are 11 in effect)."""
    for name, value in (("batch_nheads_mblocks", batch_nheads_mblocks), ("num_sms", num_sms),
                        ("num_n_blocks", num_n_blocks), ("max_splits", max_splits)):
        check_positive_int(name, value)
    f32 = np.float32
    efficiency = {}
    for splits in range(1, min(max_splits, num_sms, num_n_blocks) + 1):
        if splits == 1 or -(-num_n_blocks // splits) != -(-num_n_blocks // (splits - 1)):
            n_waves = f32(batch_nheads_mblocks * splits) / f32(num_sms)
            efficiency[splits] = float(n_waves / f32(math.ceil(n_waves)))
    return efficiency


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int,
                         max_splits: int = MAX_SPLITS) -> int:
    """FlashAttention-2's split count (csrc/flash_attn/flash_api.cpp, num_splits_heuristic): one split when
    the CTAs already fill 80% of the SMs, else the smallest eligible count whose wave efficiency is at
    least 85% of the best (`split_efficiencies`)."""
    efficiency = split_efficiencies(batch_nheads_mblocks, num_sms, num_n_blocks, max_splits)
    if np.float32(batch_nheads_mblocks) >= np.float32(0.8) * np.float32(num_sms):
        return 1
    best = max(efficiency.values())
    return next(splits for splits, eff in efficiency.items() if eff >= 0.85 * best)


@attrs.frozen
class DecodeLaunch:
    """How Flash-Decoding launches one configuration: the split count, the grid and the waves."""

    num_splits: int
    heuristic: bool  # chosen by FA-2's num_splits_heuristic (else given)
    block_q: int  # query tile rows (packed rows with pack_gqa)
    block_kv: int
    kv_tiles: int  # T_c of the allocated cache
    tiles_per_split: int
    split_ctas: int  # query tiles x splits x batch x heads (K/V heads when packed)
    combine_ctas: int  # 0 with one split (no combine)
    combine_block_rows: int
    sm_count: int
    cta_slots: int  # split CTAs resident on the whole chip at once (occupancy x SMs)
    waves: float  # split CTAs / CTA slots
    wave_efficiency: float  # waves / ceil(waves): the fraction of the last wave's slots busy, on average

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def _sizes(n_kv, d, batch, heads, kv_heads, n_q, pack_gqa) -> tuple[int, int, int, int, int, int]:
    """Checked sizes: (n_kv, d, batch, n_q, CTA heads per batch element, pack)."""
    n_kv, d, batch, n_q = (check_positive_int(name, value) for name, value in
                           (("n_kv", n_kv), ("d", d), ("batch", batch), ("n_q", n_q)))
    cta_heads, pack = head_groups(check_positive_int("heads", heads), kv_heads, pack_gqa)
    return n_kv, d, batch, n_q, cta_heads, pack


def decode_launch(n_kv: int, d: int, *, batch: int = 1, heads: int = 1, kv_heads: int | None = None, n_q: int = 1,
                  num_splits: int | None = None, block_kv: int | None = None, pack_gqa: bool = True,
                  dtype: str = "float16", gpu: str | GPUSpec = "H200") -> DecodeLaunch:
    """The split count (FA-2's heuristic when num_splits is None, fed as FA-2 feeds it), CTAs of both
    kernels, and the split kernel's waves on `gpu`. heads, kv_heads: per batch element."""
    n_kv, d, batch, n_q, cta_heads, pack = _sizes(n_kv, d, batch, heads, kv_heads, n_q, pack_gqa)
    spec = gpu_spec(gpu)
    block_kv = default_block_kv(d) if block_kv is None else check_positive_int("block_kv", block_kv)
    kv_tiles = -(-n_kv // block_kv)
    q_tiles = -(-n_q * pack // SPLIT_BLOCK_Q)
    heuristic = num_splits is None
    if heuristic:
        num_splits = num_splits_heuristic(batch * cta_heads * q_tiles, 2 * spec.sm_count, kv_tiles)
    num_splits = check_num_splits(num_splits, kv_tiles)
    split_ctas = q_tiles * num_splits * batch * cta_heads
    rows = combine_block_rows(d)
    slots = resident_ctas(spec, SPLIT_PROFILE, SPLIT_BLOCK_Q, block_kv, d, storage_dtype(dtype).itemsize)
    waves = split_ctas / slots
    return DecodeLaunch(
        num_splits=num_splits, heuristic=heuristic, block_q=SPLIT_BLOCK_Q, block_kv=block_kv, kv_tiles=kv_tiles,
        tiles_per_split=-(-kv_tiles // num_splits), split_ctas=split_ctas,
        combine_ctas=-(-batch * cta_heads * n_q * pack // rows) if num_splits > 1 else 0, combine_block_rows=rows,
        sm_count=spec.sm_count, cta_slots=slots, waves=waves, wave_efficiency=waves / math.ceil(waves))


@attrs.frozen
class SplitVisits:
    """Per query tile of one batch-head (one cache length): rows, K/V rows and tiles it visits, and
    how many splits hold some of those tiles (each such (tile, split) CTA reads Q_i once)."""

    rows: np.ndarray  # (T_r,)
    kv_rows: np.ndarray  # (T_r,) summed over its splits: the splits partition the tile's run
    kv_tiles: np.ndarray  # (T_r,)
    splits: np.ndarray  # (T_r,) splits whose share of the run is not empty


def split_visits(n_q: int, seqlen: int, n_kv: int, block_q: int, block_kv: int, num_splits: int, causal: bool,
                 window: tuple[int, int], pack: int) -> SplitVisits:
    """A query tile's keys are one run of KV tiles (bottom-right aligned to the cache length `seqlen`);
    split s holds tiles [s t, (s + 1) t) with t = ceil(T_c / num_splits), T_c from the allocated n_kv; a
    run [first, first + count) meets the splits (first + count - 1) // t - first // t + 1."""
    tiles = query_tiles(n_q, seqlen, block_q, block_kv, causal, "lower_right", window, pack)
    kv_tiles = -(-n_kv // block_kv)
    per_split = -(-kv_tiles // num_splits)
    last = tiles.first + tiles.count - 1
    splits = np.where(tiles.visited, last // per_split - tiles.first // per_split + 1, 0)
    return SplitVisits(tiles.rows, tiles.kv_rows, tiles.count, splits)


def _visits_by_seqlen(n_kv, n_q, block_q, block_kv, num_splits, batch, cache_seqlens, causal, window, pack):
    """(SplitVisits, batch elements with that cache length) for each distinct length."""
    lengths = Counter(check_cache_seqlens(cache_seqlens, batch, n_kv))
    causal = check_bool("causal", causal)
    return [(split_visits(n_q, seqlen, n_kv, block_q, block_kv, num_splits, causal, window, pack), count)
            for seqlen, count in sorted(lengths.items())]


def _checked(n_kv, d, batch, heads, kv_heads, n_q, num_splits, block_q, block_kv, pack_gqa):
    n_kv, d, batch, n_q, cta_heads, pack = _sizes(n_kv, d, batch, heads, kv_heads, n_q, pack_gqa)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    num_splits = check_num_splits(num_splits, -(-n_kv // block_kv))
    return n_kv, d, batch, n_q, cta_heads, pack, num_splits, block_q, block_kv


def flash_decoding_traffic(
    n_kv: int, d: int, *, batch: int = 1, heads: int = 1, kv_heads: int | None = None, n_q: int = 1,
    num_splits: int = 1, block_q: int = SPLIT_BLOCK_Q, block_kv: int = 128, pack_gqa: bool = True,
    cache_seqlens=None, causal: bool = False, window: tuple[int, int] = (-1, -1), dtype: str = "float16",
) -> Traffic:
    """Exact HBM bytes of Flash-Decoding, equal to `sf.flash_decoding`'s ledger for the same configuration.
    heads, kv_heads: per batch element (kv_heads None: as many as heads).

    split kernel, per (query tile, split) CTA: read Q_i once if the split holds a tile of its run, K_j and
    V_j of those tiles (valid rows only); write O_partial (float32, d per row) and LSE_partial (float32),
    empty splits included. combine: per row read every split's LSE_partial and O_partial; write O.
    One split: the split kernel writes O in the storage dtype and there is no combine.
    """
    n_kv, d, batch, n_q, cta_heads, pack, num_splits, block_q, block_kv = _checked(
        n_kv, d, batch, heads, kv_heads, n_q, num_splits, block_q, block_kv, pack_gqa)
    b = storage_dtype(dtype).itemsize
    q_rows = kv_rows = 0
    for visits, count in _visits_by_seqlen(n_kv, n_q, block_q, block_kv, num_splits, batch, cache_seqlens, causal,
                                           window, pack):
        q_rows += count * int((visits.rows * visits.splits).sum())
        kv_rows += count * int(visits.kv_rows.sum())
    out_rows = batch * cta_heads * n_q * pack  # every query head's rows
    s = STATE_DTYPE.itemsize
    ledger = {  # each CTA head of a batch element reads its rows and that element's keys
        (SPLIT_KERNEL, "Q"): Flow(read_bytes=cta_heads * q_rows * d * b),
        (SPLIT_KERNEL, "K"): Flow(read_bytes=cta_heads * kv_rows * d * b),
        (SPLIT_KERNEL, "V"): Flow(read_bytes=cta_heads * kv_rows * d * b),
    }
    if num_splits == 1:
        ledger[SPLIT_KERNEL, "O"] = Flow(write_bytes=out_rows * d * b)
        return Traffic(ledger)
    partial = num_splits * out_rows  # every split writes every row, empty or not
    ledger |= {
        (SPLIT_KERNEL, "O_partial"): Flow(write_bytes=partial * d * s),
        (SPLIT_KERNEL, "LSE_partial"): Flow(write_bytes=partial * s),
        (COMBINE_KERNEL, "LSE_partial"): Flow(read_bytes=partial * s),
        (COMBINE_KERNEL, "O_partial"): Flow(read_bytes=partial * d * s),
        (COMBINE_KERNEL, "O"): Flow(write_bytes=out_rows * d * b),
    }
    return Traffic(ledger)


def flash_decoding_flops(
    n_kv: int, d: int, *, batch: int = 1, heads: int = 1, kv_heads: int | None = None, n_q: int = 1,
    num_splits: int = 1, block_q: int = SPLIT_BLOCK_Q, block_kv: int = 128, pack_gqa: bool = True,
    cache_seqlens=None, causal: bool = False, window: tuple[int, int] = (-1, -1),
) -> dict[str, int]:
    """Arithmetic by kind of both kernels, equal to `sf.flash_decoding`'s run.flops_by_kind.

    split kernel: per visited tile of r rows x c keys as FA-2 (tensor 4 r c d; exp r c + r; fp32 5 r c + r d);
    per (query tile, split) that visits a tile: div r d (O_s = a / l), and with partials its logsumexp,
    one logarithm (counted with the exponentials: both are special-function-unit ops) and one add per row.
    combine, per row over S splits: exp 2 S + 1 (exp(LSE_s - max), log of the sum, the weights); fp32
    4 S + 1 + 2 S d (max, subtract, sum, add, subtract; multiply-add of each O_s).
    """
    n_kv, d, batch, n_q, cta_heads, pack, num_splits, block_q, block_kv = _checked(
        n_kv, d, batch, heads, kv_heads, n_q, num_splits, block_q, block_kv, pack_gqa)
    scores = step_rows = ctas_rows = 0
    for visits, count in _visits_by_seqlen(n_kv, n_q, block_q, block_kv, num_splits, batch, cache_seqlens, causal,
                                           window, pack):
        scores += count * int((visits.rows * visits.kv_rows).sum())  # r c over every visited tile
        step_rows += count * int((visits.rows * visits.kv_tiles).sum())  # r over every visited tile
        ctas_rows += count * int((visits.rows * visits.splits).sum())  # r over every CTA that visits a tile
    flops = {"tensor": 4 * scores * d, "exp": scores + step_rows, "fp32": 5 * scores + step_rows * d,
             "div": ctas_rows * d}
    flops = {kind: cta_heads * count for kind, count in flops.items()}  # every CTA head of each batch element
    if num_splits > 1:
        rows = batch * cta_heads * n_q * pack
        flops["exp"] += cta_heads * ctas_rows + rows * (2 * num_splits + 1)
        flops["fp32"] += cta_heads * ctas_rows + rows * (4 * num_splits + 1 + 2 * num_splits * d)
    return flops


@attrs.frozen
class KernelTime:
    """One kernel's predicted time on the whole chip (see `predict_decode`)."""

    kernel: str
    ctas: int
    cta_slots: int
    sm_rounds: int  # sum over waves of ceil(CTAs in the wave / SMs): the busiest SM's CTAs, one after another
    busy_sm_fraction: float  # CTAs / (SMs x sm_rounds): the share of the SMs' time spent on a CTA
    dram_bytes: int
    dram_s: float
    compute_s: float
    time_s: float  # launch + max(DRAM, compute)
    bound: str  # "dram" or "compute"

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.dram_bytes / self.time_s

    def to_dict(self) -> dict:
        return {**attrs.asdict(self), "achieved_bytes_per_s": self.achieved_bytes_per_s}


@attrs.frozen
class DecodePrediction:
    launch: DecodeLaunch
    traffic: Traffic
    kernels: tuple[KernelTime, ...]

    @property
    def time_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the split kernel reads: what decoding must stream."""
        return self.traffic.by_tensor["K"].read_bytes + self.traffic.by_tensor["V"].read_bytes

    @property
    def kv_bytes_per_s(self) -> float:
        """K/V bandwidth: K/V bytes over the whole decode step (both kernels)."""
        return self.kv_bytes / self.time_s

    def to_dict(self) -> dict:
        return {"launch": self.launch.to_dict(), "traffic": self.traffic.to_dict(),
                "kernels": [k.to_dict() for k in self.kernels], "time_s": self.time_s, "kv_bytes": self.kv_bytes,
                "kv_bytes_per_s": self.kv_bytes_per_s}


def _kernel_time(spec: GPUSpec, kernel: str, ctas: int, slots: int, dram_bytes: int, cta_compute_s: float
                 ) -> KernelTime:
    """The time model for one kernel whose CTAs each move an equal share of `dram_bytes`.

    An SM holding one of the kernel's CTAs draws 1 / SMs of the achieved HBM bandwidth (the machine file's
    hbm_bytes_per_s x calibration.hbm_efficiency); an idle SM's share is lost, and CTAs sharing an SM share
    its share. Each wave of resident CTAs is spread over the SMs one CTA each first, so a wave of c CTAs
    takes ceil(c / SMs) CTA-times of the busiest SM; the kernel takes the sum over its waves of those,
    `sm_rounds`, for its DRAM bytes and for its compute (each CTA's FLOPs at one SM's rates)."""
    full_waves, last = divmod(ctas, slots)
    sm_rounds = full_waves * -(-slots // spec.sm_count) + -(-last // spec.sm_count)
    bandwidth = spec.hbm_bytes_per_s * spec.calibration.get("hbm_efficiency", 1.0)
    busy = ctas / (spec.sm_count * sm_rounds)
    dram_s = dram_seconds(dram_bytes, bandwidth * busy)
    compute_s = sm_rounds * cta_compute_s
    return KernelTime(kernel, ctas, slots, sm_rounds, busy, dram_bytes, dram_s, compute_s,
                      LAUNCH_SECONDS + max(dram_s, compute_s), "dram" if dram_s >= compute_s else "compute")


def predict_decode(n_kv: int, d: int, *, batch: int = 1, heads: int = 1, kv_heads: int | None = None, n_q: int = 1,
                   num_splits: int | None = None, block_kv: int | None = None, pack_gqa: bool = True,
                   dtype: str = "float16", gpu: str | GPUSpec = "H200") -> DecodePrediction:
    """Predicted time of one decode step's attention (both kernels, every cache full, no mask) on `gpu`:
    a model, stated in `_kernel_time`; DRAM bytes are the ledger's (every byte from DRAM once: a cold L2 that never hits,
    which without pack_gqa overstates K and V, read once per query head of a group; `predict_decode_dram`
    plays the GPU backend's launch through the L2 model instead)."""
    spec = gpu_spec(gpu)
    launch = decode_launch(n_kv, d, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, num_splits=num_splits,
                           block_kv=block_kv, pack_gqa=pack_gqa, dtype=dtype, gpu=spec)
    traffic = flash_decoding_traffic(n_kv, d, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q,
                                     num_splits=launch.num_splits, block_kv=launch.block_kv, pack_gqa=pack_gqa,
                                     dtype=dtype)
    flows = traffic.by_kernel
    # a split CTA: its KV tiles at FA-2's per-tile cost (64 query rows on the tensor cores, padded or not)
    tile_s = _flash_step_seconds(spec, "sdpa_flash", launch.block_q, launch.block_kv, d)
    kernels = [_kernel_time(spec, SPLIT_KERNEL, launch.split_ctas, launch.cta_slots,
                            flows[SPLIT_KERNEL].total_bytes, launch.tiles_per_split * tile_s)]
    if launch.num_splits > 1:
        kernels.append(combine_time(spec, launch, d, flows[COMBINE_KERNEL].total_bytes))
    return DecodePrediction(launch, traffic, tuple(kernels))


def combine_time(spec: GPUSpec, launch: DecodeLaunch, d: int, dram_bytes: int) -> KernelTime:
    """The combine kernel's time (`_kernel_time`), given the DRAM bytes it moves: each CTA's rows merge
    every split's partial (exponentials on the SFUs, the weighted sums in FP32)."""
    rows, splits = launch.combine_block_rows, launch.num_splits
    cta_s = (rows * (2 * splits + 1) / (spec.sfu_ops_per_s / spec.sm_count)
             + rows * (4 * splits + 1 + 2 * splits * d) / (spec.fp32_flops_per_s / spec.sm_count))
    return _kernel_time(spec, COMBINE_KERNEL, launch.combine_ctas, combine_cta_slots(spec, splits, d), dram_bytes,
                        cta_s)


def combine_cta_slots(spec: GPUSpec, num_splits: int, d: int) -> int:
    """Combine CTAs resident on the chip: 128 threads, sLSE[kMaxSplits][kBlockM + 1] floats of shared memory
    (kMaxSplits: num_splits rounded up to a power of two, at least 2), and registers as the split kernel's
    (no measured count for the combine: the same compiler budget is assumed)."""
    max_splits = max(2, 1 << (num_splits - 1).bit_length())
    shared = max_splits * (combine_block_rows(d) + 1) * STATE_DTYPE.itemsize
    return spec.sm_count * occupancy(spec, FA2_THREADS, SPLIT_PROFILE.registers(d), shared).cta_slots_per_sm
