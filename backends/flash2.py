"""FA-2 forward on a real GPU: the kernel of flash2_forward.cu, launched like simflash.flash_attention
(grouped-query heads packed or not, causal and sliding windows).

`flash_attention` takes host arrays, checks them exactly as the simulator does, runs the kernel
(instrumented by default, so the run carries the HBM bytes the kernel counted and the m, l trace of one
tile) and hands back a GPURun whose `traffic` compares equal to the simulator's; with
write_logsumexp=True the kernel also writes L, for a backward pass, as the simulator does. `launch` is the
device-array entry point the timing and profiling code uses. The kernel comes in numbered versions
(VERSIONS: one .cu file each, same results; v3 takes tensor maps); `version` picks one. Only v1 writes L.
"""

from __future__ import annotations

import attrs
import numpy as np

from simflash.api import prepare_inputs
from simflash.backends.flash2_v2 import Flash2V2Kernel
from simflash.backends.flash2_v3 import Flash2V3Kernel, Flash2V3NoPingPongKernel, tensor_maps
from simflash.backends.kernels import Flash2Kernel, import_cupy
from simflash.config import check_bool
from simflash.memory import Flow, Traffic
from simflash.schedule import TileSchedule

KERNEL = "flash2_forward"  # the ledger's kernel name, as in the simulator
COUNTED_TENSORS = ("Q", "K", "V", "O", "L")  # order of the kernel's bytes_moved counters (L: v1, when written)
# The kernel versions by name: v1 flash2_forward.cu, v2 flash2_forward_v2.cu (FA-2's own layout),
# v3 flash2_forward_v3.cu (FA-3's layout on Hopper: TMA, wgmma, warp specialisation, ping-pong), and
# v3-nopp the same kernel without ping-pong.
VERSIONS = {"v1": Flash2Kernel, "v2": Flash2V2Kernel, "v3": Flash2V3Kernel, "v3-nopp": Flash2V3NoPingPongKernel}
# Output poison: a NaN bit pattern per storage dtype, so an element the kernel never wrote shows up.
POISON_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0}
UNBOUNDED = 1 << 30  # a window side with no bound, as the kernels take it (flash2_tile.cuh's Visibility)


@attrs.frozen
class TileStats:
    """m_i and l_i of query tile `i` (head `head`) right after KV tile `j`, as the kernel recorded them."""

    head: int
    i: int
    j: int
    row_start: int
    m: np.ndarray  # (rows,) float32: running max of the scaled scores
    l: np.ndarray  # (rows,) float32: running sum of exp(S - m)


@attrs.frozen(eq=False)
class GPURun:
    """What a GPU run leaves: the output (host copy, storage dtype), the counted traffic and trace."""

    out: np.ndarray
    traffic: Traffic | None  # None for an uninstrumented run
    counted: frozenset[tuple[str, str]]  # ledger keys counted on the device (the rest are logical)
    trace: tuple[TileStats, ...]
    resources: dict
    logsumexp: np.ndarray | None = None  # float32, shape q.shape[:-1], when write_logsumexp=True


def device_view(x, dtype: str):
    """A host array in storage dtype as a contiguous device array of its 16-bit patterns."""
    cupy = import_cupy()
    return cupy.asarray(np.ascontiguousarray(x).view(np.uint16))


def poisoned_output(shape: tuple[int, ...], dtype: str):
    cupy = import_cupy()
    return cupy.full(shape, POISON_BITS[dtype], dtype=cupy.uint16)


def bounds(sched: TileSchedule) -> tuple[int, int]:
    """(left, right) as the kernels take them: keys visible before and after the diagonal, UNBOUNDED
    for a side with no bound (right = 0 when causal)."""
    return (UNBOUNDED if sched.left is None else sched.left), (UNBOUNDED if sched.right is None else sched.right)


def launch(kernel: Flash2Kernel, Q, K, V, O, sched: TileSchedule, scale: float, counters=None, trace=None,
           L=None) -> None:
    """Run the kernel on device arrays Q (H_q, n_q, d), K, V (H_kv, n_kv, d) and O (H_q, n_q, d), 16-bit;
    sched.pack > 1 packs each group's query heads into the tiles' rows.

    counters: a device uint64 array of 4, or 5 with L (instrumented build); trace: (head, tile, m, l)
    with m, l device float32 arrays of (its KV tiles, block_q) for the chosen tile; L: a device float32
    array (H_q, n_q) for the logsumexp, or None (version v1 only).
    """
    heads, n_q, d = Q.shape
    if (n_q, sched.n_kv) != (sched.n_q, K.shape[1]) or d != kernel.d or K.shape != V.shape or heads % K.shape[0]:
        raise ValueError(f"shapes Q {Q.shape}, K {K.shape}, V {V.shape} do not match the schedule and d={kernel.d}")
    null = np.uint64(0)
    trace_head, trace_tile, trace_m, trace_l = trace if trace is not None else (-1, -1, null, null)
    if isinstance(kernel, (Flash2V2Kernel, Flash2V3Kernel)):  # multi-head, causal or not: bounds are one flag
        name = "v2" if isinstance(kernel, Flash2V2Kernel) else "v3"  # v3-nopp is v3 built without ping-pong
        if sched.pack != 1 or heads != K.shape[0] or sched.left is not None or sched.right not in (None, 0):
            raise ValueError(f"kernel version {name} runs multi-head attention, causal or not: no window, no grouped "
                             "query heads (use version v1)")
        if L is not None:
            raise ValueError(f"kernel version {name} writes no logsumexp L (use version v1)")
        geometry: tuple[np.integer, ...] = (np.int32(sched.right == 0), np.int32(sched.diagonal_offset))
        logsumexp: tuple = ()
    else:
        left, right = bounds(sched)
        geometry = (np.int32(sched.pack), np.int32(heads // K.shape[0]), np.int32(sched.diagonal_offset),
                    np.int32(left), np.int32(right))
        logsumexp = (null if L is None else L,)
    # v3 reads and writes through tensor maps in place of the four pointers
    tensors = (tensor_maps(kernel, Q, K, V, O),) if isinstance(kernel, Flash2V3Kernel) else (Q, K, V, O)
    kernel.function()(
        (sched.n_q_tiles, heads // sched.pack),
        (kernel.threads,),
        (*tensors, np.int32(n_q), np.int32(sched.n_kv), np.float32(scale), *geometry,
         null if counters is None else counters, np.int32(trace_head), np.int32(trace_tile), trace_m, trace_l,
         *logsumexp),
        shared_mem=kernel.shared_bytes,
    )


def kernel_version(version: str) -> type[Flash2Kernel]:
    """The kernel class of one version, or a ValueError naming the versions there are."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {list(VERSIONS)}, got {version!r}")
    return VERSIONS[version]


def builds(version: str, block_q: int, block_kv: int, d: int) -> bool:
    """Whether a kernel version is built for a tile shape at head dim d."""
    try:
        kernel_version(version)("float16", block_q, block_kv, d)
    except ValueError:
        return False
    return True


def flash_attention(
    q, k, v, block_q: int = 128, block_kv: int = 64, *, causal: bool = False, causal_variant: str = "upper_left",
    scale: float | None = None, dtype: str = "float16", window: tuple[int, int] = (-1, -1),
    pack_gqa: bool = False, instrumented: bool = True, trace_head: int | None = None, trace_tile: int | None = None,
    version: str = "v1", write_logsumexp: bool = False,
) -> GPURun:
    """FA-2 forward on the GPU. q: (..., H_q, n_q, d); k, v: (..., H_kv, n_kv, d); the simulator's checks,
    heads, window and pack_gqa (see sf.flash_attention).

    instrumented: run the counting build, so `traffic` holds the bytes the kernel moved (the timed
    build leaves it None). trace_head/trace_tile pick the one query tile whose m, l are recorded
    after every KV tile (instrumented build only; default: none); heads are those of the CTAs, packed
    groups with pack_gqa. version: the kernel version (VERSIONS; v2 and v3 without windows or grouped heads).
    write_logsumexp: also write L (float32, +inf for a row that saw no key) into `logsumexp`, counted as
    ("flash2_forward", "L"); version v1 only.
    """
    pack_gqa = check_bool("pack_gqa", pack_gqa)
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    write_logsumexp = check_bool("write_logsumexp", write_logsumexp)
    if write_logsumexp and kernel_version(version) is not Flash2Kernel:
        raise ValueError(f"kernel version {version} writes no logsumexp L: write_logsumexp=True needs version v1")
    heads, n_q, d = Q.shape
    kernel = kernel_version(version)(dtype, block_q, block_kv, d, bool(instrumented))
    sched = TileSchedule(n_q, K.shape[1], block_q, block_kv, causal=bool(causal), causal_variant=causal_variant,
                         window=window, pack=heads // K.shape[0] if pack_gqa else 1)
    cta_heads = heads // sched.pack
    traced = trace_head is not None or trace_tile is not None
    if traced and not instrumented:
        raise ValueError("trace_head/trace_tile need instrumented=True: the timed build records nothing")
    if traced and not (trace_head is not None and 0 <= trace_head < cta_heads and trace_tile is not None
                       and 0 <= trace_tile < sched.n_q_tiles):
        raise ValueError(f"trace_head must be in [0, {cta_heads}) and trace_tile in [0, {sched.n_q_tiles}), "
                         f"got {trace_head!r} and {trace_tile!r}")

    cupy = import_cupy()
    Q_d, K_d, V_d = (device_view(x, dtype) for x in (Q, K, V))
    O_d = poisoned_output(Q.shape, dtype)
    L_d = cupy.full(Q.shape[:2], np.nan, dtype=cupy.float32) if write_logsumexp else None
    counters = cupy.zeros(len(COUNTED_TENSORS), dtype=cupy.uint64) if instrumented else None
    trace = None
    if trace_head is not None and trace_tile is not None:  # traced (both given: checked above)
        T_c = len(sched.kv_tiles(trace_tile))
        m = cupy.full((max(T_c, 1), block_q), np.nan, dtype=cupy.float32)
        trace = (trace_head, trace_tile, m, cupy.full_like(m, np.nan))
    launch(kernel, Q_d, K_d, V_d, O_d, sched, scale, counters, trace, L_d)

    out = O_d.get().view(Q.dtype).reshape(np.shape(q))
    traffic = None
    if counters is not None:  # instrumented
        traffic = Traffic({(KERNEL, tensor): Flow(read_bytes=int(count)) if tensor not in ("O", "L") else Flow(write_bytes=int(count))
                           for tensor, count in zip(COUNTED_TENSORS, counters.get())
                           if tensor != "L" or write_logsumexp})
    steps: tuple[TileStats, ...] = ()
    if trace is not None:
        head, tile, m_d, l_d = trace
        rows = sched.q_rows(tile)
        m_host, l_host = m_d.get(), l_d.get()
        steps = tuple(
            TileStats(head, tile, j, rows.start, m_host[n, : rows.stop - rows.start].copy(),
                      l_host[n, : rows.stop - rows.start].copy())
            for n, j in enumerate(sched.kv_tiles(tile))
        )
    counted = frozenset((KERNEL, t) for t in COUNTED_TENSORS if t != "L" or write_logsumexp) if instrumented else frozenset()
    logsumexp = L_d.get().reshape(np.shape(q)[:-1]) if L_d is not None else None  # write_logsumexp
    return GPURun(out=out, traffic=traffic, counted=counted, trace=steps, resources=kernel.resources(),
                  logsumexp=logsumexp)
