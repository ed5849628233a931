"""The tile schedule: which KV tiles each query tile visits, and which of those need element masking.

The causal *skip bound* (drop a KV tile whose every column lies in the future of every row of the
query tile) only changes the cost. The *mask* (set future scores to -inf inside a visited tile)
changes the answer. They are kept apart on purpose: see `kv_tiles` and `mask`.
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np

from simflash.config import check_bool, check_causal_variant, check_positive_int

TileKind = Literal["full", "masked", "skipped"]


def _positive_int(_instance, attribute: attrs.Attribute, value: object) -> None:
    check_positive_int(attribute.name, value)


@attrs.frozen
class TileSchedule:
    """Query tiles of `block_q` rows x KV tiles of `block_kv` columns; tile indices are 0-based."""

    n_q: int = attrs.field(validator=_positive_int)
    n_kv: int = attrs.field(validator=_positive_int)
    block_q: int = attrs.field(validator=_positive_int)
    block_kv: int = attrs.field(validator=_positive_int)
    causal: bool = attrs.field(default=False, converter=lambda v: check_bool("causal", v))
    causal_variant: str = attrs.field(default="upper_left", validator=lambda _, __, v: check_causal_variant(v))

    @property
    def n_q_tiles(self) -> int:
        """T_r: the number of query tiles (the last one may be ragged)."""
        return -(-self.n_q // self.block_q)

    @property
    def n_kv_tiles(self) -> int:
        """T_c: the number of KV tiles (the last one may be ragged)."""
        return -(-self.n_kv // self.block_kv)

    @property
    def diagonal_offset(self) -> int:
        """Query row r may see key column c when c <= r + diagonal_offset (causal only)."""
        return 0 if self.causal_variant == "upper_left" else self.n_kv - self.n_q

    def q_rows(self, i: int) -> slice:
        return slice(i * self.block_q, min((i + 1) * self.block_q, self.n_q))

    def kv_cols(self, j: int) -> slice:
        return slice(j * self.block_kv, min((j + 1) * self.block_kv, self.n_kv))

    def last_visible_col(self, i: int) -> int:
        """The largest key column any row of query tile i may see (may be < 0: sees nothing)."""
        if not self.causal:
            return self.n_kv - 1
        return min(self.q_rows(i).stop - 1 + self.diagonal_offset, self.n_kv - 1)

    def kv_tiles(self, i: int) -> list[int]:
        """KV tiles query tile i loads: all of them, or (causal) up to the skip bound."""
        return list(self.kv_range(i))

    def kv_range(self, i: int) -> range:
        """`kv_tiles(i)` as a range (no list of T_c entries)."""
        last_col = self.last_visible_col(i)
        return range(last_col // self.block_kv + 1) if last_col >= 0 else range(0)

    def tile_kind(self, i: int, j: int) -> TileKind:
        if not (0 <= i < self.n_q_tiles and 0 <= j < self.n_kv_tiles):
            raise IndexError(f"tile (i={i}, j={j}) is outside the {self.n_q_tiles} x {self.n_kv_tiles} grid")
        last_col = self.last_visible_col(i)
        if last_col < 0 or j > last_col // self.block_kv:
            return "skipped"
        if not self.causal:
            return "full"
        # Full when even the first row of the tile sees the last column of the tile.
        first_row_sees = self.q_rows(i).start + self.diagonal_offset
        return "full" if self.kv_cols(j).stop - 1 <= first_row_sees else "masked"

    def mask(self, i: int, j: int) -> np.ndarray:
        """Boolean (rows, cols) of tile (i, j): True where the query row may see the key column."""
        rows = np.arange(self.q_rows(i).start, self.q_rows(i).stop)
        cols = np.arange(self.kv_cols(j).start, self.kv_cols(j).stop)
        if not self.causal:
            return np.ones((rows.size, cols.size), dtype=bool)
        return cols[None, :] <= rows[:, None] + self.diagonal_offset

    def kind_map(self) -> np.ndarray:
        """(T_r, T_c) array of tile kinds, for pictures and tables."""
        return np.array(
            [[self.tile_kind(i, j) for j in range(self.n_kv_tiles)] for i in range(self.n_q_tiles)],
            dtype=object,
        )
