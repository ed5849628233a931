"""Timing of the backward on the GPU: our three kernels (preprocess, main, convert; timed builds) against
PyTorch SDPA's flash backward in the same process, on the same inputs, with the same timer (CUDA events
around each call, median of repeats after a warm-up: simflash.backends.bench.time_ms).

FLOPs per configuration: five matrix products of 2 N^2 d per head (S recomputed, dP, dV, dK, dQ), so
10 H N^2 d, halved when causal: 2.5x the forward's, FlashAttention's convention. Our kernels start
from the O and L our forward kernel wrote; SDPA's backward from its own forward's.
"""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np

import simflash as sf
from simflash.backends.bench import BenchConfig, _torch, time_ms
from simflash.backends.flash2 import launch, poisoned_output
from simflash.backends.flash2_backward import FORWARD_TILES, BackwardBuffers, launch_backward
from simflash.backends.kernels import Flash2BackwardKernels, Flash2Kernel, import_cupy
from simflash.backends.validate_backward import defined_traffic
from simflash.schedule import TileSchedule

DTYPE = "float16"
COMPARE_MAX_N = 4096  # compare our gradients with SDPA's up to this N


@attrs.frozen
class BackwardBenchConfig(BenchConfig):
    @property
    def flops(self) -> int:
        """2.5x the forward's: five products of 2 N^2 d per head against two."""
        return super().flops * 5 // 2


def sdpa_backward(q, k, v, dO, causal: bool, scale: float):
    """(call, how): one call of SDPA's flash backward alone, after its forward ran once: the ATen op SDPA's
    autograd runs, or autograd.grad where this PyTorch lacks that op. q, k, v, dO: (1, H, N, d) tensors."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)[:8]

        def call():
            return torch.ops.aten._scaled_dot_product_flash_attention_backward(
                dO, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)

        call()
        return call, "torch.ops.aten._scaled_dot_product_flash_attention_backward"
    except (AttributeError, RuntimeError, TypeError, ValueError):
        leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)

        def call():
            return torch.autograd.grad(out, leaves, dO, retain_graph=True)

        call()
        return call, "torch.autograd.grad of scaled_dot_product_attention (flash)"


def bench_config(config: BackwardBenchConfig, seed: int, tiles: tuple[tuple[int, int], ...] = ((64, 128),),
                 gpu: str = "H200") -> dict:
    """Time one configuration: our kernels at each tile shape asked for (the first is the headline;
    a shape the GPU cannot hold is recorded as refused), then SDPA's flash backward."""
    cupy = import_cupy()
    c = config
    spec = sf.GPUS[gpu]
    rng = cupy.random.default_rng(seed)
    Q, K, V, dO = (rng.standard_normal((c.heads, c.n, c.d), dtype=cupy.float32).astype(cupy.float16)
                   for _ in range(4))
    scale = 1.0 / math.sqrt(c.d)
    row: dict = {"config": attrs.asdict(c), "flops": c.flops}

    def rate(timing: dict) -> dict:
        tflops = c.flops / (timing["ms"] * 1e-3) / 1e12
        return {**timing, "tflops": tflops, "pct_peak": 100 * tflops * 1e12 / spec.peak_flops[DTYPE]}

    # -- O and L from our forward kernel
    O = poisoned_output(Q.shape, DTYPE)
    L = cupy.full((c.heads, c.n), np.nan, dtype=cupy.float32)
    launch(Flash2Kernel(DTYPE, *FORWARD_TILES, c.d), Q, K, V, O, TileSchedule(c.n, c.n, *FORWARD_TILES, causal=c.causal),
           scale, L=L)

    # -- our three kernels, timed builds
    row["ours"] = {}
    gradients = None
    for block_q, block_kv in tiles:
        label = f"{block_q}x{block_kv}"
        kernels = Flash2BackwardKernels(DTYPE, block_q, block_kv, c.d)
        try:
            kernels.functions()
        except ValueError as error:
            row["ours"][label] = {"refused": str(error)}
            continue
        b = BackwardBuffers.allocate(Q, K, V, O, dO, L, DTYPE)
        sched = TileSchedule(c.n, c.n, block_q, block_kv, causal=c.causal)
        timing = rate(time_ms(functools.partial(launch_backward, kernels, b, sched, scale)))
        logical = defined_traffic(c.n, c.n, c.d, block_q, block_kv, DTYPE, c.causal, heads=c.heads).total_bytes
        per_s = logical / (timing["ms"] * 1e-3)
        timing["logical_bandwidth"] = {"bytes": logical, "GBps": per_s / 1e9,
                                       "pct_hbm_peak": 100 * per_s / spec.hbm_bytes_per_s}
        row["ours"][label] = timing
        if gradients is None:
            gradients = tuple(x.view(cupy.float16) for x in (b.dQ, b.dK, b.dV))
    headline = row["ours"][f"{tiles[0][0]}x{tiles[0][1]}"]

    # -- PyTorch SDPA's flash backward on the same memory
    found = _torch()
    if found is None:
        row["sdpa_flash"] = "torch is not installed"
    else:
        torch = found[0]
        q, k, v, g = (torch.from_dlpack(x).view(1, c.heads, c.n, c.d) for x in (Q, K, V, dO))
        call, row["sdpa_call"] = sdpa_backward(q, k, v, g, c.causal, scale)
        row["sdpa_flash"] = rate(time_ms(call))
        row["ratio_vs_sdpa_flash"] = headline["tflops"] / row["sdpa_flash"]["tflops"]
        if c.n <= COMPARE_MAX_N and gradients is not None:
            theirs = (cupy.from_dlpack(x.contiguous()).reshape(c.heads, c.n, c.d) for x in call()[:3])
            row["max_abs_vs_sdpa"] = {name: float(cupy.abs(mine.astype(cupy.float32) - other.astype(cupy.float32)).max())
                                      for name, mine, other in zip(("dq", "dk", "dv"), gradients, theirs)}
        torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def bench(configs: list[BackwardBenchConfig], seed: int = 0, progress=None, **options) -> list[dict]:
    """Every configuration in turn."""
    rows = []
    for index, config in enumerate(configs):
        rows.append(bench_config(config, seed + index, **options))
        if progress is not None:
            progress(rows[-1])
    return rows
