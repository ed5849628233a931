"""What FlashAttention-1 and -2 share inside a tile: the masked scores and the guarded exponential.

Both compute S_ij = scale Q_i K_j^T and hide the keys a row may not see (causal future, outside the
window) as -inf before any statistic sees them. Both exponentiate against a running or tile max m that
is -inf for a row that has seen no key yet; exp(x - m) then reads m as 0, so exp(-inf) = 0, not NaN.
"""

from __future__ import annotations

import numpy as np

from simflash.memory import Compute
from simflash.schedule import TileSchedule


def masked_scores(compute: Compute, Q_i: np.ndarray, K_j: np.ndarray, scale: float, sched: TileSchedule,
                  i: int, j: int) -> tuple[np.ndarray, bool]:
    """(S_ij, masked): the (B_r, B_c) scores of tile (i, j), -inf where the row may not see the key."""
    S_ij = compute.matmul(Q_i, K_j.T) * scale
    masked = sched.tile_kind(i, j) == "masked"
    if masked:
        S_ij = np.where(sched.mask(i, j), S_ij, -np.inf)
    return S_ij, masked


def exp_base(m: np.ndarray) -> np.ndarray:
    """m with -inf read as 0: what exp(x - m) subtracts, so that a row that has seen no key gets exp(-inf) = 0."""
    return np.where(m == -np.inf, 0.0, m)


def exp_minus(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """exp(x - m) row by row (m has one entry per row of x); a row whose m is -inf exponentiates against 0."""
    base = exp_base(m)
    return np.exp(x - (base[:, None] if x.ndim == 2 else base))
