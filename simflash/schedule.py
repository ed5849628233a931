"""The tile schedule: which KV tiles each query tile visits, and which of those need element masking.

The *skip bound* (drop a KV tile whose every column lies outside what every row of the query tile
may see: in its future under causal masking, or outside its sliding window) only changes the cost.
The *mask* (set invisible scores to -inf inside a visited tile) changes the answer. They are kept
apart on purpose: see `kv_tiles` and `mask`.

Visibility: query position r sees key column c iff r + off - left <= c <= r + off + right, where
window = (left, right) (-1: unbounded on that side, as flash_attn's window_size), causal=True
means right = 0, and off = 0 for causal_variant "upper_left", n_kv - n_q for "lower_right".
With `pack` > 1 (grouped-query heads packed, FA-3's PackGQA) a query tile's rows are packed rows:
packed row p holds position p // pack of query head p % pack of its group.
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np

from simflash.config import check_bool, check_causal_variant, check_positive_int, check_window

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
    window: tuple[int, int] = attrs.field(default=(-1, -1), converter=lambda v: check_window(v))
    pack: int = attrs.field(default=1, validator=_positive_int)  # query heads packed per position

    def __attrs_post_init__(self) -> None:
        if self.causal and self.window[1] > 0:
            raise ValueError(f"window's right bound must be 0 or -1 with causal=True (causal means right = 0), "
                             f"got window={self.window}")

    @property
    def n_rows(self) -> int:
        """Query rows the tiles cut: n_q, or n_q x pack packed rows."""
        return self.n_q * self.pack

    @property
    def n_q_tiles(self) -> int:
        """T_r: the number of query tiles (the last one may be ragged)."""
        return -(-self.n_rows // self.block_q)

    @property
    def n_kv_tiles(self) -> int:
        """T_c: the number of KV tiles (the last one may be ragged)."""
        return -(-self.n_kv // self.block_kv)

    @property
    def diagonal_offset(self) -> int:
        """off: query position r's diagonal is key column r + off."""
        return 0 if self.causal_variant == "upper_left" else self.n_kv - self.n_q

    @property
    def left(self) -> int | None:
        """Keys visible before the diagonal (None: all of them)."""
        return None if self.window[0] < 0 else self.window[0]

    @property
    def right(self) -> int | None:
        """Keys visible after the diagonal (None: all of them; 0 when causal)."""
        return 0 if self.causal else None if self.window[1] < 0 else self.window[1]

    @property
    def masks(self) -> bool:
        """Whether any score can be invisible: causal, or a window bounded on some side."""
        return self.left is not None or self.right is not None

    def q_rows(self, i: int) -> slice:
        return slice(i * self.block_q, min((i + 1) * self.block_q, self.n_rows))

    def kv_cols(self, j: int) -> slice:
        return slice(j * self.block_kv, min((j + 1) * self.block_kv, self.n_kv))

    def positions(self, rows: slice) -> np.ndarray:
        """The query position of every row in `rows` (a packed row keeps its position for the bounds)."""
        return np.arange(rows.start, rows.stop) // self.pack

    def visible_cols(self, first_position: int, last_position: int) -> tuple[int, int]:
        """(lo, hi): the key columns some position in [first, last] sees; lo > hi when none."""
        off = self.diagonal_offset
        lo = 0 if self.left is None else max(0, first_position + off - self.left)
        hi = self.n_kv - 1 if self.right is None else min(self.n_kv - 1, last_position + off + self.right)
        return lo, hi

    def kv_tiles(self, i: int) -> list[int]:
        """KV tiles query tile i loads: those holding a key some row of it sees (up to the skip bounds)."""
        return list(self.kv_range(i))

    def kv_range(self, i: int) -> range:
        """`kv_tiles(i)` as a range (no list of T_c entries): the visible keys of a tile's rows are contiguous."""
        rows = self.q_rows(i)
        lo, hi = self.visible_cols(rows.start // self.pack, (rows.stop - 1) // self.pack)
        return range(lo // self.block_kv, hi // self.block_kv + 1) if lo <= hi else range(0)

    def q_tiles(self, j: int) -> list[int]:
        """Query tiles that visit KV tile j (the backward's inner loop): i with j in `kv_tiles(i)`."""
        return list(self.q_range(j))

    def q_range(self, j: int) -> range:
        """`q_tiles(j)` as a range. Position p touches the columns [c0, c1] of tile j iff
        p + off + right >= c0 and p + off - left <= c1; those positions are contiguous, and so are the
        query tiles holding their (packed) rows."""
        cols, off = self.kv_cols(j), self.diagonal_offset
        first = 0 if self.right is None else max(0, cols.start - off - self.right)
        last = self.n_q - 1 if self.left is None else min(self.n_q - 1, cols.stop - 1 - off + self.left)
        if first > last:
            return range(0)
        return range(first * self.pack // self.block_q, ((last + 1) * self.pack - 1) // self.block_q + 1)

    def tile_kind(self, i: int, j: int) -> TileKind:
        if not (0 <= i < self.n_q_tiles and 0 <= j < self.n_kv_tiles):
            raise IndexError(f"tile (i={i}, j={j}) is outside the {self.n_q_tiles} x {self.n_kv_tiles} grid")
        if j not in self.kv_range(i):
            return "skipped"
        # Full when the first row sees the tile's last column and the last row its first column.
        rows, cols = self.q_rows(i), self.kv_cols(j)
        off = self.diagonal_offset
        sees_last = self.right is None or cols.stop - 1 <= rows.start // self.pack + off + self.right
        sees_first = self.left is None or cols.start >= (rows.stop - 1) // self.pack + off - self.left
        return "full" if sees_last and sees_first else "masked"

    def mask(self, i: int, j: int) -> np.ndarray:
        """Boolean (rows, cols) of tile (i, j): True where the query row may see the key column."""
        rows, cols = self.q_rows(i), self.kv_cols(j)
        diagonal = self.positions(rows)[:, None] + self.diagonal_offset  # (rows, 1)
        c = np.arange(cols.start, cols.stop)[None, :]  # (1, cols)
        visible = np.ones((rows.stop - rows.start, cols.stop - cols.start), dtype=bool)
        if self.right is not None:
            visible &= c <= diagonal + self.right
        if self.left is not None:
            visible &= c >= diagonal - self.left
        return visible

    def kind_map(self) -> np.ndarray:
        """(T_r, T_c) array of tile kinds, for pictures and tables."""
        return np.array(
            [[self.tile_kind(i, j) for j in range(self.n_kv_tiles)] for i in range(self.n_q_tiles)],
            dtype=object,
        )
