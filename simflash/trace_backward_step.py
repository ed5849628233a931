"""BackwardStep, one recorded tile (j, i) of FlashAttention-2's backward.

Its own module so that the backward trace files (simflash.trace_backward_files) can build steps
without importing simflash.trace_backward, whose BackwardTrace.save and BackwardTrace.load use them.
What the fields mean for a learner: simflash.trace_backward.
"""

from __future__ import annotations

import attrs
import numpy as np


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
