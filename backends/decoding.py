"""Flash-Decoding on a real GPU: flash_decoding_split.cu and flash_decoding_combine.cu, launched like
simflash.flash_decoding.

The tiling, the split count (FA-2's num_splits_heuristic on this GPU's SMs when none is given) and
the checks are the simulator's (simflash.model.decode, simflash.schedule.SplitSchedule).
`flash_decoding` takes host arrays and hands back a GPURun whose `traffic` (instrumented build)
compares equal to `sf.model.flash_decoding_traffic(...)`; `DecodePath` is the device-array entry point
the timing and profiling code uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from simflash.api import prepare_inputs
from simflash.backends.flash2 import GPURun, bounds, device_view, poisoned_output
from simflash.backends.kernels import (
    DECODE_BLOCK_KV,
    DECODE_THREADS,
    DecodeCombineKernel,
    DecodeSplitKernel,
    decode_slices,
    import_cupy,
)
from simflash.config import check_bool
from simflash.memory import Flow, Traffic
from simflash.model.decode import SPLIT_BLOCK_Q, num_splits_heuristic
from simflash.schedule import SplitSchedule, check_cache_seqlens

if TYPE_CHECKING:
    from simflash.backends.kernels import DeviceArray

SPLIT_KERNEL, COMBINE_KERNEL = "flash_decoding_split", "flash_decoding_combine"  # the ledger's kernel names
SPLIT_COUNTED = ("Q", "K", "V", "O", "O_partial", "LSE_partial")  # order of the split kernel's counters
COMBINE_COUNTED = ("LSE_partial", "O_partial", "O")  # and of the combine's


def device_sm_count() -> int:
    cupy = import_cupy()
    return int(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"])


def split_schedule(batch: int, heads: int, kv_heads: int, n_q: int, n_kv: int, d: int, num_splits: int | None = None,
                   block_kv: int | None = None, pack_gqa: bool = True, cache_seqlens=None, causal: bool = False,
                   window=(-1, -1), sm_count: int | None = None) -> SplitSchedule:
    """The SplitSchedule the kernels run: 64-row query tiles, KV tiles of block_kv rows (None: the
    default of DECODE_BLOCK_KV[d]), and num_splits or FA-2's heuristic, fed as FA-2 feeds it (CTAs of the
    split grid without splits; SMs x 2; KV tiles). heads, kv_heads: all batch elements'."""
    if d not in DECODE_BLOCK_KV:
        raise ValueError(f"d must be one of {list(DECODE_BLOCK_KV)} for the GPU Flash-Decoding kernels, got {d}")
    block_kv = DECODE_BLOCK_KV[d][0] if block_kv is None else block_kv
    if block_kv not in DECODE_BLOCK_KV[d]:
        raise ValueError(f"block_kv must be one of {list(DECODE_BLOCK_KV[d])} at d = {d} for the GPU Flash-Decoding "
                         f"kernels, got {block_kv!r}")
    pack = heads // kv_heads if check_bool("pack_gqa", pack_gqa) else 1
    kv_tiles = -(-n_kv // block_kv)
    if num_splits is None:
        q_tiles = -(-n_q * pack // SPLIT_BLOCK_Q)
        sms = device_sm_count() if sm_count is None else sm_count
        num_splits = num_splits_heuristic(heads // pack * q_tiles, 2 * sms, kv_tiles)
    return SplitSchedule(n_q, n_kv, SPLIT_BLOCK_Q, block_kv, num_splits, check_cache_seqlens(cache_seqlens, batch, n_kv),
                         check_bool("causal", causal), window, pack)


@attrs.define
class DecodePath:
    """Device buffers and kernels of one Flash-Decoding configuration; `run()` launches the split kernel
    and, with several splits, the combine, on the current stream (so a stream capture records both into
    one CUDA graph, as serving stacks replay a decode step)."""

    Q: DeviceArray  # (batch x H_q, n_q, d) 16-bit device array
    K: DeviceArray  # (batch x H_kv, n_kv, d)
    V: DeviceArray  # (batch x H_kv, n_kv, d)
    batch: int
    sched: SplitSchedule
    scale: float
    dtype: str = "float16"
    instrumented: bool = False
    O: DeviceArray = attrs.field(init=False)  # (batch x H_q, n_q, d)
    O_partial: DeviceArray = attrs.field(init=False)  # (splits, batch x H_q x n_q, d) float32
    LSE_partial: DeviceArray = attrs.field(init=False)  # (splits, batch x H_q x n_q) float32
    cache_seqlens: DeviceArray | None = attrs.field(init=False)  # (batch,) int32; None when every cache is full
    counters: DeviceArray = attrs.field(init=False)  # instrumented: the split kernel's, then the combine's

    def __attrs_post_init__(self) -> None:
        cupy = import_cupy()
        heads, n_q, d = self.Q.shape
        if self.K.shape != self.V.shape or heads % self.K.shape[0] or (n_q, self.K.shape[1]) != (self.sched.n_q,
                                                                                               self.sched.n_kv):
            raise ValueError(f"shapes Q {self.Q.shape}, K {self.K.shape}, V {self.V.shape} do not match the schedule")
        rows = heads * n_q
        splits = self.sched.num_splits
        self.O = poisoned_output(self.Q.shape, self.dtype)
        self.O_partial = cupy.full((splits, rows, d), np.nan, dtype=cupy.float32) if splits > 1 else None
        self.LSE_partial = cupy.full((splits, rows), np.nan, dtype=cupy.float32) if splits > 1 else None
        full = all(n == self.sched.n_kv for n in self.sched.cache_seqlens)
        self.cache_seqlens = None if full else cupy.asarray(self.sched.cache_seqlens, dtype=cupy.int32)
        self.counters = cupy.zeros(len(SPLIT_COUNTED) + len(COMBINE_COUNTED), dtype=cupy.uint64)

    @property
    def split_kernel(self) -> DecodeSplitKernel:
        rows = min(self.sched.block_q, self.sched.n_q * self.sched.pack)  # a query tile's
        return DecodeSplitKernel(self.dtype, self.Q.shape[2], self.sched.block_kv, decode_slices(rows), self.instrumented)

    @property
    def combine_kernel(self) -> DecodeCombineKernel:
        return DecodeCombineKernel(self.dtype, self.Q.shape[2], self.instrumented)

    def run(self) -> None:
        self.launch_split()
        if self.sched.num_splits > 1:
            self.launch_combine()

    def launch_split(self) -> None:
        """The split kernel on the current stream (it writes O itself with one split)."""
        heads, n_q, _ = self.Q.shape
        s = self.sched
        null = np.uint64(0)
        left, right = bounds(s.of_batch(0))
        cta_heads = heads // s.pack  # all batch elements'
        split = self.split_kernel
        split.function()(
            (s.n_q_tiles, s.num_splits, cta_heads), (DECODE_THREADS,),
            (self.Q, self.K, self.V, self.O, self.O_partial if s.num_splits > 1 else null,
             self.LSE_partial if s.num_splits > 1 else null, null if self.cache_seqlens is None else self.cache_seqlens,
             np.int32(n_q), np.int32(s.n_kv),
             np.float32(self.scale), np.int32(cta_heads // self.batch), np.int32(s.pack),
             np.int32(heads // self.K.shape[0]), np.int32(s.tiles_per_split), np.int32(left), np.int32(right),
             self.counters if self.instrumented else null),
            shared_mem=split.shared_bytes,
        )

    def launch_combine(self) -> None:
        """The combine kernel on the current stream (several splits only)."""
        if self.sched.num_splits == 1:
            raise ValueError("one split writes O in the split kernel: there is nothing to combine")
        heads, n_q, _ = self.Q.shape
        rows = heads * n_q
        combine = self.combine_kernel
        combine.function(self.sched.num_splits)(
            (rows,), (DECODE_THREADS,),
            (self.O_partial, self.LSE_partial, self.O, np.int32(rows), np.int32(self.sched.num_splits),
             self.counters[len(SPLIT_COUNTED):] if self.instrumented else np.uint64(0)),
            shared_mem=combine.shared_bytes(self.sched.num_splits),
        )

    def traffic(self) -> Traffic:
        """The bytes both kernels counted (instrumented build), keyed like the simulator's ledger: with one
        split, the split kernel's Q, K, V and O; with several, its partials and the combine's."""
        counts = [int(c) for c in self.counters.get()]
        split = dict(zip(SPLIT_COUNTED, counts))
        combine = dict(zip(COMBINE_COUNTED, counts[len(SPLIT_COUNTED):]))
        ledger = {(SPLIT_KERNEL, t): Flow(read_bytes=split[t]) for t in ("Q", "K", "V")}
        if self.sched.num_splits == 1:
            return Traffic(ledger | {(SPLIT_KERNEL, "O"): Flow(write_bytes=split["O"])})
        return Traffic(ledger | {
            (SPLIT_KERNEL, "O_partial"): Flow(write_bytes=split["O_partial"]),
            (SPLIT_KERNEL, "LSE_partial"): Flow(write_bytes=split["LSE_partial"]),
            (COMBINE_KERNEL, "LSE_partial"): Flow(read_bytes=combine["LSE_partial"]),
            (COMBINE_KERNEL, "O_partial"): Flow(read_bytes=combine["O_partial"]),
            (COMBINE_KERNEL, "O"): Flow(write_bytes=combine["O"]),
        })

    def resources(self) -> dict:
        found = {"split": self.split_kernel.resources()}
        if self.sched.num_splits > 1:
            found["combine"] = self.combine_kernel.resources(self.sched.num_splits)
        return found


def flash_decoding(
    q, k, v, num_splits: int | None = None, block_kv: int | None = None, *, pack_gqa: bool = True,
    cache_seqlens=None, causal: bool = False, window: tuple[int, int] = (-1, -1), scale: float | None = None,
    dtype: str = "float16", instrumented: bool = True,
) -> GPURun:
    """Flash-Decoding on the GPU. q: (batch, H_q, n_q, d) or (H_q, n_q, d); k, v: (batch, H_kv, n_kv, d) or
    (H_kv, n_kv, d); the arguments of sf.flash_decoding. block_kv: one of DECODE_BLOCK_KV[d] (None: its
    first); num_splits None: FA-2's heuristic on this GPU's SMs."""
    if np.ndim(q) not in (3, 4):
        raise ValueError(f"q must have shape (batch, H_q, n_q, d) or (H_q, n_q, d), got shape {np.shape(q)}")
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, "lower_right")
    batch = np.shape(q)[0] if np.ndim(q) == 4 else 1
    sched = split_schedule(batch, Q.shape[0], K.shape[0], Q.shape[1], K.shape[1], Q.shape[2], num_splits, block_kv,
                           pack_gqa, cache_seqlens, causal, window)
    path = DecodePath(device_view(Q, dtype), device_view(K, dtype), device_view(V, dtype), batch, sched, scale, dtype,
                      bool(instrumented))
    path.run()
    out = path.O.get().view(Q.dtype).reshape(np.shape(q))
    counted = frozenset(path.traffic().ledger) if instrumented else frozenset()
    return GPURun(out=out, traffic=path.traffic() if instrumented else None, counted=counted, trace=(),
                  resources=path.resources())
