"""Amdahl's law on a measured time share, and why a FLOP share cannot stand in for it."""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from simflash.config import check_positive_int
from simflash.model.roofline import attention_flops

SENSITIVITY_F_TIME = (0.15, 0.40, 0.65)  # the lesson's sensitivity rows
QUOTED_FLOP_SHARE = 0.032  # an input: the lesson's quoted attention share of prefill FLOPs at P = 2,048


def amdahl(f_time: float, s_kernel: float) -> float:
    """End-to-end speedup when a fraction `f_time` of the time gets `s_kernel` times faster."""
    if not (isinstance(f_time, (int, float)) and 0.0 <= f_time <= 1.0):
        raise ValueError(f"f_time must be a time share in [0, 1], got {f_time!r}")
    if not (isinstance(s_kernel, (int, float)) and math.isfinite(s_kernel) and s_kernel > 0):
        raise ValueError(f"s_kernel must be a finite positive speedup, got {s_kernel!r}")
    return 1.0 / ((1.0 - f_time) + f_time / s_kernel)


@attrs.frozen
class Projection:
    """What Amdahl's law projects for one time share and kernel speedup."""

    f_time: float
    s_kernel: float
    speedup: float
    latency_reduction: float  # fraction of the end-to-end time removed: 1 - 1 / speedup


def project(f_time: float, s_kernel: float) -> Projection:
    speedup = amdahl(f_time, s_kernel)
    return Projection(float(f_time), float(s_kernel), speedup, 1.0 - 1.0 / speedup)


def sensitivity(s_kernel: float, f_times: Iterable[float] = SENSITIVITY_F_TIME) -> list[Projection]:
    """The same kernel speedup at several time shares: the steepness is the point."""
    return [project(f, s_kernel) for f in f_times]


@attrs.frozen
class FlopShare:
    """Attention's share of prefill FLOPs under a simple count (a FLOP share, not a time share)."""

    attention_flops: int  # the two attention matmuls over the visible score entries, all layers and heads
    linear_flops: int  # one multiply-add per parameter per prompt token
    prompt_tokens: int

    @property
    def share(self) -> float:
        return self.attention_flops / (self.attention_flops + self.linear_flops)


def attention_flop_share(
    prompt_tokens: int, params: float, layers: int, heads: int, head_dim: int, causal: bool = True,
) -> FlopShare:
    """Prefill FLOPs: 2 x params per token for the weights, plus attention's QK^T and PV per layer and head."""
    prompt_tokens = check_positive_int("prompt_tokens", prompt_tokens)
    if not (isinstance(params, (int, float)) and math.isfinite(params) and params > 0):
        raise ValueError(f"params must be a finite positive parameter count, got {params!r}")
    layers = check_positive_int("layers", layers)
    attention = attention_flops(prompt_tokens, head_dim, causal, heads=heads) * layers
    return FlopShare(attention, round(2 * params * prompt_tokens), prompt_tokens)
