"""Per-tile records of FlashAttention-2's backward: BackwardStep, the BackwardTrace that holds them.

The backward runs KV tiles outer, so a step is tile (j, i): query tile i folded into KV tile j's
accumulators dK_j and dV_j. What a learner checks at a breakpoint:

- rowsum(P_ij): the share of row r's softmax that falls in KV tile j. P is recomputed from the
  forward's logsumexp, not stored, so over the KV tiles a row visits these shares add up to 1 (0 for
  a row that sees no key, whose L is +inf);
- D_i = rowsum(dO_i o O_i), the term the softmax's Jacobian subtracts from every dP_ij of the row;
- |dQ_ij|: the row norms of scale dS_ij K_j, what tile j sends to dQ_i by atomic adds;
- |dK_j|, |dV_j|: the row norms of the accumulators so far (dK_j with its scale), growing tile by tile.

A "full" trace also keeps P_ij, dS_ij (B_r, B_c) and the accumulators dK_j, dV_j (B_c, d).
"""

from __future__ import annotations


import attrs
import numpy as np

from simflash.config import STATE_DTYPE, MiB
from simflash.schedule import TileSchedule
from simflash.trace import DEFAULT_TRACE_BUDGET_BYTES, StepSequence
from simflash.trace_step import TRACE_LEVELS


@attrs.frozen(eq=False)
class BackwardStep:
    """Tile (j, i) of head `head`, right after query tile i was folded into KV tile j (float32 arrays)."""

    head: int
    j: int
    i: int
    col_start: int
    row_start: int
    masked: bool  # the tile needed element masking
    L: np.ndarray  # (B_r,) the forward's logsumexp; +inf for a row that sees no key
    D: np.ndarray  # (B_r,) rowsum(dO_i o O_i)
    p_rowsum: np.ndarray  # (B_r,) rowsum(P_ij)
    dq_norm: np.ndarray  # (B_r,) row norms of scale dS_ij K_j
    dk_norm: np.ndarray  # (B_c,) row norms of dK_j so far
    dv_norm: np.ndarray  # (B_c,) row norms of dV_j so far
    P: np.ndarray | None = None  # (B_r, B_c), "full" only
    dS: np.ndarray | None = None  # (B_r, B_c)
    dK: np.ndarray | None = None  # (B_c, d)
    dV: np.ndarray | None = None  # (B_c, d)

    @property
    def rows(self) -> range:
        return range(self.row_start, self.row_start + self.L.size)

    @property
    def cols(self) -> range:
        return range(self.col_start, self.col_start + self.dk_norm.size)


@attrs.frozen(eq=False)
class BackwardTrace(StepSequence[BackwardStep]):
    """The recorded steps of a backward, in execution order (head, then KV tile j, then query tile i)."""

    level: str = "none"
    steps: tuple[BackwardStep, ...] = ()

    def of_kv_tile(self, j: int, head: int = 0) -> list[BackwardStep]:
        """The steps of KV tile j, in the order its query tiles were visited."""
        return [step for step in self.steps if step.j == j and step.head == head]


def check_backward_trace(level: object, sched: TileSchedule, heads: int, d: int,
                         budget_bytes: int = DEFAULT_TRACE_BUDGET_BYTES) -> str:
    """The trace level, or a ValueError when it is unknown or its records would outgrow `budget_bytes`."""
    if level not in TRACE_LEVELS:
        raise ValueError(f"trace must be one of {TRACE_LEVELS}, got {level!r}")
    if level == "none":
        return level
    floats = 0
    for j in range(sched.n_kv_tiles):
        cols = sched.kv_cols(j)
        c = cols.stop - cols.start
        for i in sched.q_range(j):
            rows = sched.q_rows(i)
            r = rows.stop - rows.start
            floats += 4 * r + 2 * c + (2 * r * c + 2 * c * d if level == "full" else 0)
    nbytes = heads * floats * STATE_DTYPE.itemsize
    if nbytes > budget_bytes:
        raise ValueError(f"a {level!r} trace of the backward would hold {nbytes / MiB:.1f} MiB "
                         f"(limit {budget_bytes / MiB:.0f} MiB); pass trace=\"none\" or a smaller problem")
    return level
