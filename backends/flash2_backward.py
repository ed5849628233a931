"""FA-2 backward on a real GPU: the kernels of flash2_backward_preprocess.cu, flash2_backward.cu and
flash2_backward_convert.cu, after the forward kernel, which writes the O and L they start from.

`flash_attention_backward` takes host arrays q, k, v and the output gradient do, checks them as the
simulator does, runs the forward kernel (writing L) and the three backward kernels (instrumented by
default, so the run carries the HBM bytes each backward kernel counted, keyed like the simulator's
ledger) and hands back dq, dk, dv in the storage dtype. `launch_backward` is the device-array entry
point the timing and profiling code uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from simflash.api import prepare_inputs
from simflash.backends import flash2
from simflash.backends.flash2 import GPURun, device_view, poisoned_output
from simflash.backends.kernels import ELEMENTWISE_THREADS, Flash2BackwardKernels, import_cupy
from simflash.config import check_bool, storage_dtype
from simflash.memory import Flow, Traffic
from simflash.schedule import TileSchedule

if TYPE_CHECKING:
    from simflash.backends.kernels import DeviceArray

# Each kernel's bytes_moved counters, in order: (tensor, direction), named as in the simulator's ledger.
COUNTED = {
    "flash2_backward_preprocess": (("O", "read"), ("dO", "read"), ("D", "write"), ("dQ_accum", "write")),
    "flash2_backward": (("K", "read"), ("V", "read"), ("Q", "read"), ("dO", "read"), ("L", "read"), ("D", "read"),
                        ("dQ_accum", "write"), ("dK", "write"), ("dV", "write")),
    "flash2_backward_convert": (("dQ_accum", "read"), ("dQ", "write")),
}
COUNTERS = sum(len(tensors) for tensors in COUNTED.values())
FORWARD_TILES = (128, 64)  # B_r, B_c of the forward kernel that writes O and L


@attrs.frozen
class BackwardBuffers:
    """The device arrays of one backward pass: Q, K, V, O, dO (H, n, d) as 16-bit patterns, L (H, n_q)
    float32 from the forward, and what the kernels write: D (H, n_q) and dQ_accum (H, n_q, d) float32,
    dQ, dK, dV 16-bit. Everything the kernels write starts as NaN, so an element never written shows."""

    Q: DeviceArray
    K: DeviceArray
    V: DeviceArray
    O: DeviceArray
    dO: DeviceArray
    L: DeviceArray
    D: DeviceArray
    dQ_accum: DeviceArray
    dQ: DeviceArray
    dK: DeviceArray
    dV: DeviceArray

    @classmethod
    def allocate(cls, Q, K, V, O, dO, L, dtype: str) -> BackwardBuffers:
        cupy = import_cupy()
        D = cupy.full(Q.shape[:2], np.nan, dtype=cupy.float32)
        dQ_accum = cupy.full(Q.shape, np.nan, dtype=cupy.float32)
        return cls(Q, K, V, O, dO, L, D, dQ_accum, poisoned_output(Q.shape, dtype), poisoned_output(K.shape, dtype),
                   poisoned_output(V.shape, dtype))


def launch_backward(kernels: Flash2BackwardKernels, b: BackwardBuffers, sched: TileSchedule, scale: float,
                    counters=None) -> None:
    """Run preprocess, main and convert on the device arrays of `b`, in order.

    counters: a device uint64 array of COUNTERS (instrumented build), filled in COUNTED's order.
    """
    heads, n_q, d = b.Q.shape
    if (n_q, sched.n_kv) != (sched.n_q, b.K.shape[1]) or d != kernels.d or b.K.shape != b.V.shape \
            or b.K.shape[0] != heads:
        raise ValueError(f"shapes Q {b.Q.shape}, K {b.K.shape}, V {b.V.shape} do not match the schedule and "
                         f"d={kernels.d}")
    preprocess, main, convert = kernels.functions()
    counters_of = {}  # each kernel's slice of `counters` (a null pointer for the timed build)
    at = 0
    for kernel, tensors in COUNTED.items():
        counters_of[kernel] = np.uint64(0) if counters is None else counters[at:at + len(tensors)]
        at += len(tensors)
    preprocess((sched.n_q_tiles, heads), (ELEMENTWISE_THREADS,),
               (b.O, b.dO, b.D, b.dQ_accum, np.int32(n_q), counters_of["flash2_backward_preprocess"]))
    main((sched.n_kv_tiles, heads), (kernels.threads,),
         (b.Q, b.K, b.V, b.dO, b.L, b.D, b.dQ_accum, b.dK, b.dV, np.int32(n_q), np.int32(sched.n_kv),
          np.float32(scale), np.int32(sched.causal), np.int32(sched.diagonal_offset), counters_of["flash2_backward"]),
         shared_mem=kernels.shared_bytes)
    values = heads * n_q * d
    convert((-(-values // (8 * ELEMENTWISE_THREADS)),), (ELEMENTWISE_THREADS,),
            (b.dQ_accum, b.dQ, np.int64(values), counters_of["flash2_backward_convert"]))


def counted_traffic(counts) -> Traffic:
    """The ledger of the instrumented build's counters (COUNTED's order)."""
    counts = [int(c) for c in counts]
    ledger = {}
    at = 0
    for kernel, tensors in COUNTED.items():
        for tensor, direction in tensors:
            ledger[(kernel, tensor)] = Flow(read_bytes=counts[at]) if direction == "read" else Flow(write_bytes=counts[at])
            at += 1
    return Traffic(ledger)


def output_gradient(do, q_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The output gradient dO as the simulator takes it: q's shape, finite; (heads, n_q, d) in the storage dtype."""
    do = np.asarray(do)
    if do.shape != tuple(q_shape):
        raise ValueError(f"do must have the shape of q {tuple(q_shape)}, got {do.shape}")
    if not np.isfinite(do.astype(np.float64)).all():
        raise ValueError("do must be finite (no NaN or inf)")
    with np.errstate(over="ignore"):  # reported just below
        stored = do.reshape(-1, *do.shape[-2:]).astype(storage_dtype(dtype))
    if not np.isfinite(stored.astype(np.float32)).all():
        raise ValueError(f"do has values beyond the range of {dtype}")
    return stored


@attrs.frozen(eq=False)
class GPUBackwardRun:
    """What a GPU backward leaves: the gradients (host copies, storage dtype), the forward run that wrote
    O and L, and the bytes the three backward kernels counted (None for the timed build)."""

    dq: np.ndarray  # shape of q
    dk: np.ndarray  # shape of k
    dv: np.ndarray  # shape of v
    forward: GPURun
    traffic: Traffic | None
    counted: frozenset[tuple[str, str]]  # ledger keys counted on the device
    resources: list[dict]


def flash_attention_backward(
    q, k, v, do, block_q: int = 64, block_kv: int = 128, causal: bool = False, causal_variant: str = "upper_left",
    scale: float | None = None, dtype: str = "float16", *, instrumented: bool = True,
) -> GPUBackwardRun:
    """FA-2 backward on the GPU: dq, dk, dv of attention(q, k, v) for the output gradient do.

    q, do: (..., n_q, d); k, v: (..., n_kv, d), as many heads as q; same checks as the simulator.
    instrumented: run the counting builds, so `traffic` holds the bytes each backward kernel moved
    (and `forward.traffic` the forward's, L included); the timed builds leave them None.
    """
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    dO = output_gradient(do, np.shape(q), dtype)
    causal = check_bool("causal", causal)
    heads, n_q, d = Q.shape
    if K.shape[0] != heads:
        raise ValueError(f"k and v must have as many heads as q for the GPU backward (grouped-query heads are not "
                         f"built), got {K.shape[0]} and {heads}")
    kernels = Flash2BackwardKernels(dtype, block_q, block_kv, d, bool(instrumented))
    sched = TileSchedule(n_q, K.shape[1], block_q, block_kv, causal=causal, causal_variant=causal_variant)

    forward = flash2.flash_attention(q, k, v, *FORWARD_TILES, causal=causal, causal_variant=causal_variant,
                                     scale=scale, dtype=dtype, instrumented=instrumented, write_logsumexp=True)
    cupy = import_cupy()
    O = forward.out.reshape(Q.shape)
    assert forward.logsumexp is not None  # write_logsumexp=True
    Q_d, K_d, V_d, O_d, dO_d = (device_view(x, dtype) for x in (Q, K, V, O, dO))
    b = BackwardBuffers.allocate(Q_d, K_d, V_d, O_d, dO_d, cupy.asarray(forward.logsumexp.reshape(heads, n_q)), dtype)
    counters = cupy.zeros(COUNTERS, dtype=cupy.uint64) if instrumented else None
    launch_backward(kernels, b, sched, scale, counters)

    dq, dk, dv = (x.get().view(Q.dtype).reshape(np.shape(like)) for x, like in ((b.dQ, q), (b.dK, k), (b.dV, v)))
    traffic = counted_traffic(counters.get()) if counters is not None else None  # instrumented
    counted = frozenset((kernel, t) for kernel, tensors in COUNTED.items() for t, _ in tensors) if instrumented \
        else frozenset()
    return GPUBackwardRun(dq=dq, dk=dk, dv=dv, forward=forward, traffic=traffic, counted=counted,
                          resources=kernels.resources())
