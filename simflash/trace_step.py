"""TileStep, one recorded step of the online-softmax state, and the trace levels.

Its own module so that the trace-file readers (simflash.trace_files and the modules it uses) can build
TileSteps without importing simflash.trace, whose Trace.save and Trace.load use them.
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np

TraceLevel = Literal["none", "stats", "full"]
TRACE_LEVELS: tuple[TraceLevel, ...] = ("none", "stats", "full")  # stats: m, alpha, l; full: plus the accumulator a


@attrs.frozen(eq=False)
class TileStep:
    """The state of query tile `i` (head `head`) right after KV tile `j` was folded in.

    m, alpha, l are float32 arrays over the tile's rows (global rows `rows`); a is (rows, d), or
    None in a "stats" trace. `masked` says whether the tile needed element masking. alpha is
    exp(m_old - m_new), the factor that moves the state kept so far onto the new running max.

    Algorithms that keep tile-local statistics (FA-1's Algorithm 1) also record them: m_tile
    (m~_ij = rowmax(S_ij)), l_tile (l~_ij = rowsum(exp(S_ij - m~_ij))) and beta (exp(m~_ij - m_new),
    the factor that moves the tile onto the new max). The others leave them None.

    Split-KV kernels (Flash-Decoding) name the split whose run of KV tiles the step belongs to
    (`split`); the others leave it None.
    """

    head: int
    i: int
    j: int
    row_start: int
    masked: bool
    m: np.ndarray
    alpha: np.ndarray
    l: np.ndarray  # the paper's symbol
    a: np.ndarray | None
    m_tile: np.ndarray | None = None
    l_tile: np.ndarray | None = None
    beta: np.ndarray | None = None
    split: int | None = None

    @property
    def rows(self) -> range:
        return range(self.row_start, self.row_start + self.m.size)
