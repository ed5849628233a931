"""Amdahl's law on a measured time share."""

from __future__ import annotations

import math


def amdahl(f_time: float, s_kernel: float) -> float:
    """End-to-end speedup when a fraction `f_time` of the time gets `s_kernel` times faster."""
    if not (isinstance(f_time, (int, float)) and 0.0 <= f_time <= 1.0):
        raise ValueError(f"f_time must be a time share in [0, 1], got {f_time!r}")
    if not (isinstance(s_kernel, (int, float)) and math.isfinite(s_kernel) and s_kernel > 0):
        raise ValueError(f"s_kernel must be a finite positive speedup, got {s_kernel!r}")
    return 1.0 / ((1.0 - f_time) + f_time / s_kernel)
