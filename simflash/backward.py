"""The backward pass on the simulated GPU: FlashAttention-2's recomputation against naive's stored P.

Both entry points run their forward first (`run.forward`), then the backward's kernels on a machine
whose HBM holds what the forward left for them: naive keeps P (N x N per head, training retention);
FlashAttention-2 keeps O and the logsumexp L (N x d and N per head) and recomputes P tile by tile.
`run.traffic` and the FLOP counts are the backward's kernels only.
"""

from __future__ import annotations

import attrs
import numpy as np

from simflash.algorithms.flash2_backward import KERNEL as MAIN_KERNEL
from simflash.algorithms.flash2_backward import flash2_backward_cta
from simflash.algorithms.flash2_backward_convert import KERNEL as CONVERT_KERNEL
from simflash.algorithms.flash2_backward_convert import flash2_backward_convert_cta
from simflash.algorithms.flash2_backward_preprocess import KERNEL as PREPROCESS_KERNEL
from simflash.algorithms.flash2_backward_preprocess import flash2_backward_preprocess_cta
from simflash.algorithms.gqa_sum import gqa_sum_cta
from simflash.algorithms.naive_backward import KERNELS as NAIVE_BACKWARD_KERNELS
from simflash.algorithms.naive_backward import NAIVE_BACKWARD_CTAS
from simflash.api import (
    Run,
    RunConfig,
    _simulated_gpu,
    _trace_config,
    flash_attention,
    heads_layout,
    naive_forward,
    prepare_inputs,
    stored_heads,
)
from simflash.config import (
    DEFAULT_GPU,
    STATE_DTYPE,
    CausalVariant,
    StorageDtypeName,
    check_bool,
    check_positive_int,
)
from simflash.memory import HBM, OnChipStats, SimulatedGPU, TiledHBM, Traffic
from simflash.trace_backward import BackwardStep, BackwardTrace, check_backward_trace
from simflash.trace_step import TraceLevel


@attrs.frozen(eq=False)
class BackwardRun:
    """What a simulated backward leaves: the gradients as stored in HBM, its forward, the ledger, FLOPs."""

    dq: np.ndarray  # storage dtype, shape of q
    dk: np.ndarray  # storage dtype, shape of k
    dv: np.ndarray  # storage dtype, shape of v
    forward: Run  # the forward whose stored tensors the backward read
    traffic: Traffic  # the backward's kernels only
    flops: int  # tensor-core FLOPs of the backward's kernels
    flops_by_kind: dict[str, int]
    config: RunConfig
    trace: BackwardTrace  # its steps (FA-2 with trace="stats" or "full") and the run's configuration
    on_chip: OnChipStats | None = None  # peak SRAM and register occupancy of the largest CTA (FA-2)


def _machine_with_inputs(q, k, v, do, dtype, scale, causal_variant) -> tuple[SimulatedGPU, tuple, float]:
    """The backward's machine with Q, K, V and dO placed in HBM (not kernel traffic); their (heads, n, d)
    shapes; the scale."""
    Q, K, V, scale = prepare_inputs(q, k, v, dtype, scale, causal_variant)
    do = heads_layout("do", do)
    if do.shape != np.shape(q):
        raise ValueError(f"do (the gradient of the output) must have q's shape {np.shape(q)}, got {do.shape}")
    machine, _ = _simulated_gpu(DEFAULT_GPU, None, False, None)  # shared memory: the GPU's carve-out
    for name, x in (("Q", Q), ("K", K), ("V", V), ("dO", stored_heads("do", do, dtype))):
        machine.hbm.place(name, x, x.dtype)
    return machine, (Q.shape, K.shape), scale


def _allocate_gradients(hbm: HBM | TiledHBM, q_shape: tuple, kv_shape: tuple, storage: np.dtype) -> None:
    """dQ, dK, dV in the storage dtype; with grouped-query heads also dK_expanded and dV_expanded, which
    hold every query head's dK and dV until the group sum."""
    hbm.allocate("dQ", q_shape, storage)
    for gradient in ("dK", "dV"):
        hbm.allocate(gradient, kv_shape, storage)
        if q_shape[0] != kv_shape[0]:
            hbm.allocate(f"{gradient}_expanded", (q_shape[0], *kv_shape[1:]), storage)


def _sum_over_groups(machine: SimulatedGPU, kernel: str) -> None:
    """With grouped-query heads, kernel `kernel` sums dK_expanded, dV_expanded over each group into dK, dV."""
    hbm = machine.hbm
    kv_heads = hbm.shape("K")[0]
    if kv_heads == hbm.shape("Q")[0]:
        return
    with hbm.kernel(kernel):
        for g in range(kv_heads):
            gqa_sum_cta(machine, g)


def _finished(machine: SimulatedGPU, inputs: tuple, forward: Run, config: RunConfig, trace: BackwardTrace,
              **more) -> BackwardRun:
    """The run: dQ, dK, dV as HBM holds them, in the shapes of q, k, v; the ledger and FLOPs; the trace."""
    hbm = machine.hbm
    dq, dk, dv = (hbm.inspect(name).reshape(np.shape(x)) for name, x in zip(("dQ", "dK", "dV"), inputs))
    return BackwardRun(dq, dk, dv, forward, hbm.traffic(), machine.compute.flops, machine.compute.flops_by_kind(),
                       config, trace, **more)


def flash_attention_backward(
    q, k, v, do, block_q: int = 64, block_kv: int = 128, *, causal: bool = False,
    causal_variant: CausalVariant = "upper_left", window: tuple[int, int] = (-1, -1), scale: float | None = None,
    dtype: StorageDtypeName = "float16", trace: TraceLevel = "none", forward_block_q: int = 128,
    forward_block_kv: int = 64,
) -> BackwardRun:
    """FlashAttention-2's backward (Dao 2023, Algorithm 2) as it ships: three kernels, plus a sum over
    each group of query heads when K/V heads are shared.

    q: (..., H_q, n_q, d); k, v: (..., H_kv, n_kv, d); do: the gradient of the output, shape of q.
    The forward is FlashAttention-2's with write_logsumexp=True, tiled forward_block_q x
    forward_block_kv (the lesson's B_r = 128, B_c = 64); the backward's CTAs take B_c = block_kv keys
    against query tiles of B_r = block_q rows (64 x 128: FlashAttention-2's tiles at d = 128).
    Kernels, in the ledger: "flash2_backward_preprocess" (D = rowsum(dO o O), dQ_accum = 0),
    "flash2_backward" (one CTA per head and KV tile: dK_j, dV_j, atomic adds into dQ_accum),
    "flash2_backward_convert" (dQ = dQ_accum in the storage dtype) and, with H_kv < H_q,
    "flash2_backward_gqa_sum" (dK, dV summed over each group).
    trace: "none", "stats" (a BackwardStep per visited tile (j, i): L_i, D_i, rowsum(P_ij), row norms of
    dQ's addend and of dK_j, dV_j) or "full" (plus P_ij, dS_ij, dK_j, dV_j). Shared memory is checked
    against the GPU's carve-out; register-held state is tracked (`on_chip`) but not capacity-checked.
    """
    causal = check_bool("causal", causal)
    machine, (q_shape, kv_shape), scale = _machine_with_inputs(q, k, v, do, dtype, scale, causal_variant)
    (heads, n_q, d), kv_heads = q_shape, kv_shape[0]
    config = RunConfig("fa2_backward", heads, n_q, kv_shape[1], d, dtype, scale, causal, causal_variant,
                       check_positive_int("block_q", block_q), check_positive_int("block_kv", block_kv),
                       gpu=DEFAULT_GPU, window=window, kv_heads=kv_heads if kv_heads != heads else None)
    sched = config.tile_schedule()
    level = check_backward_trace(trace, sched, heads, d)
    forward = flash_attention(q, k, v, forward_block_q, forward_block_kv, causal=causal, causal_variant=causal_variant,
                              scale=scale, dtype=dtype, trace="none", write_logsumexp=True, window=window)
    hbm, storage = machine.hbm, forward.out.dtype
    hbm.place("O", forward.out.reshape(q_shape), storage)
    assert forward.logsumexp is not None  # write_logsumexp=True
    hbm.place("L", forward.logsumexp.reshape(q_shape[:-1]), STATE_DTYPE)
    hbm.allocate("D", q_shape[:-1], STATE_DTYPE)
    hbm.allocate("dQ_accum", q_shape, STATE_DTYPE)
    _allocate_gradients(hbm, q_shape, kv_shape, storage)

    with hbm.kernel(PREPROCESS_KERNEL):
        for h in range(heads):
            for i in range(sched.n_q_tiles):
                flash2_backward_preprocess_cta(machine.for_cta((h, i)), sched, h, i)
    steps: list[BackwardStep] = []
    with hbm.kernel(MAIN_KERNEL):
        for h in range(heads):
            for j in range(sched.n_kv_tiles):  # blockIdx.x = j, fastest, as FlashAttention-2 launches them
                cta = flash2_backward_cta(machine.for_cta((h, j)), sched, scale, level, h, j)
                steps.extend(step for step in cta if step is not None)
    with hbm.kernel(CONVERT_KERNEL):
        for h in range(heads):
            for i in range(sched.n_q_tiles):
                flash2_backward_convert_cta(machine.for_cta((h, i)), sched, h, i)
    _sum_over_groups(machine, "flash2_backward_gqa_sum")
    trace_config = {**_trace_config(config), "forward_block_q": forward_block_q, "forward_block_kv": forward_block_kv}
    return _finished(machine, (q, k, v), forward, config, BackwardTrace(level, tuple(steps), trace_config),
                     on_chip=machine.on_chip_statistics())


def naive_attention_backward(
    q, k, v, do, *, causal: bool = False, causal_variant: CausalVariant = "upper_left",
    window: tuple[int, int] = (-1, -1), scale: float | None = None, dtype: StorageDtypeName = "float16",
) -> BackwardRun:
    """The naive backward: five kernels over the P that the three-kernel forward stored (`run.forward`).

    Shapes as in `flash_attention_backward`. Kernels, in the ledger: "gemm_dv" (dV = P^T dO),
    "gemm_dp" (dP = dO V^T), "softmax_backward" (dS = P o (dP - rowsum(dP o P))), "gemm_dq"
    (dQ = scale dS K), "gemm_dk" (dK = scale dS^T Q). P, dP and dS hold only the entries a row may see.
    """
    machine, (q_shape, kv_shape), scale = _machine_with_inputs(q, k, v, do, dtype, scale, causal_variant)
    forward, forward_hbm = naive_forward(q, k, v, causal, causal_variant, scale, dtype, window=window)
    heads = q_shape[0]
    config = attrs.evolve(forward.config, algorithm="naive_backward")
    sched = config.tile_schedule()
    hbm, storage = machine.hbm, forward.out.dtype
    hbm.place("P", forward_hbm.inspect("P"), storage)  # what the forward kept (its unstored entries never read)
    scores = (heads, q_shape[1], kv_shape[1])
    for name in ("dP", "dS"):  # read back only where stored (read_where), so no poison needed
        hbm.allocate(name, scores, storage, poison=False)
    _allocate_gradients(hbm, q_shape, kv_shape, storage)
    for kernel in NAIVE_BACKWARD_KERNELS:
        with hbm.kernel(kernel):
            for h in range(heads):
                NAIVE_BACKWARD_CTAS[kernel](machine, sched, scale, h)
    _sum_over_groups(machine, "gqa_sum")
    return _finished(machine, (q, k, v), forward, config, BackwardTrace("none", (), _trace_config(config)))
