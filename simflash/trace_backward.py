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
A BackwardTrace is saved and loaded as a JSON or NPZ file (simflash.trace_backward_files).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from simflash import trace_files
from simflash.config import STATE_DTYPE, MiB
from simflash.schedule import TileSchedule
from simflash.trace import DEFAULT_TRACE_BUDGET_BYTES, StepSequence
from simflash.trace_backward_files import BACKWARD_CODEC
from simflash.trace_backward_step import BackwardStep
from simflash.trace_step import TRACE_LEVELS

__all__ = ["BackwardStep", "BackwardTrace", "check_backward_trace"]


@attrs.frozen(eq=False)
class BackwardTrace(StepSequence[BackwardStep]):
    """The recorded steps of a backward, in execution order (head, then KV tile j, then query tile i),
    with the run's configuration."""

    level: str = "none"
    steps: tuple[BackwardStep, ...] = ()
    config: Mapping[str, Any] = attrs.field(factory=dict)

    def of_kv_tile(self, j: int, head: int = 0) -> list[BackwardStep]:
        """The steps of KV tile j, in the order its query tiles were visited."""
        return [step for step in self.steps if step.j == j and step.head == head]

    def save(self, path: str | Path, format: str | None = None) -> Path:
        """Write the trace by suffix: .json (readable) or .npz (arrays). See simflash.trace_backward_files."""
        return trace_files.save(self, path, format, codec=BACKWARD_CODEC)

    @classmethod
    def load(cls, path: str | Path, format: str | None = None) -> BackwardTrace:
        """Read a backward trace written by `save`; a damaged file, or a forward trace, raises
        simflash.trace_files.TraceFileError (a ValueError) naming the file and the field."""
        contents = trace_files.read(path, format, BACKWARD_CODEC)
        return cls(contents.level, contents.steps, contents.config)


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
