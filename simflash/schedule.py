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

from collections.abc import Iterable
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
        if not self.masks:  # no mask: every tile visited whole (checked first, as kernels ask for every tile)
            return "full"
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


def check_cache_seqlens(cache_seqlens: object, batch: int, n_kv: int) -> tuple[int, ...]:
    """Each batch element's valid K/V rows: `batch` integers in 1..n_kv (None: all n_kv rows of every one)."""
    if cache_seqlens is None:
        return (n_kv,) * batch
    if isinstance(cache_seqlens, np.ndarray):
        cache_seqlens = cache_seqlens.tolist() if cache_seqlens.ndim == 1 else None
    if not isinstance(cache_seqlens, (list, tuple)) or len(cache_seqlens) != batch:
        raise ValueError(f"cache_seqlens must be None or a sequence of {batch} integers (one per batch element), "
                         f"got {cache_seqlens!r}")
    wrong = [n for n in cache_seqlens if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer))
             or not 1 <= n <= n_kv]
    if wrong:
        raise ValueError(f"cache_seqlens must hold integers in 1..n_kv = {n_kv} (K/V rows valid per batch element), "
                         f"got {wrong[0]!r}")
    return tuple(int(n) for n in cache_seqlens)


def check_num_splits(num_splits: object, n_kv_tiles: int) -> int:
    """A split count the KV tiles allow: 1..T_c (a split holds whole KV tiles)."""
    if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer)) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer (or None for the heuristic), got {num_splits!r}")
    if num_splits > n_kv_tiles:
        raise ValueError(f"num_splits must be at most {n_kv_tiles}, the KV tiles T_c a split holds whole, got "
                         f"{num_splits}")
    return int(num_splits)


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen
class SplitSchedule:
    """Flash-Decoding's tiling (split-KV): FA-2's query tiles x KV tiles, with the KV tiles cut into
    `num_splits` runs of whole tiles, ceil(T_c / num_splits) each, T_c from the allocated n_kv (as
    FlashAttention-2's split kernel cuts them, whatever each sequence's length).

    Batch element b holds `cache_seqlens[b]` valid K/V rows; its causal mask and window are aligned to
    the bottom-right corner of its own rows (query row r is position seqlen_b - n_q + r, as decoding
    appends the new queries at the end of the cache), so its tiling is a lower_right TileSchedule over
    seqlen_b keys: rows at or past seqlen_b are never visited.
    """

    n_q: int = attrs.field(validator=_positive_int)
    n_kv: int = attrs.field(validator=_positive_int)  # allocated K/V rows
    block_q: int = attrs.field(validator=_positive_int)
    block_kv: int = attrs.field(validator=_positive_int)
    num_splits: int = attrs.field(validator=_positive_int)
    cache_seqlens: tuple[int, ...] = attrs.field(converter=_int_tuple)
    causal: bool = attrs.field(default=False, converter=lambda v: check_bool("causal", v))
    window: tuple[int, int] = attrs.field(default=(-1, -1), converter=lambda v: check_window(v))
    pack: int = attrs.field(default=1, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        check_num_splits(self.num_splits, self.n_kv_tiles)
        check_cache_seqlens(self.cache_seqlens, len(self.cache_seqlens), self.n_kv)
        self.of_batch(0)  # causal with a window's right bound: refused as TileSchedule refuses it

    @property
    def n_kv_tiles(self) -> int:
        """T_c of the allocated cache."""
        return -(-self.n_kv // self.block_kv)

    @property
    def n_q_tiles(self) -> int:
        """T_r: query tiles of (packed) rows, the same for every batch element."""
        return -(-self.n_q * self.pack // self.block_q)

    @property
    def tiles_per_split(self) -> int:
        return -(-self.n_kv_tiles // self.num_splits)

    def of_batch(self, b: int) -> TileSchedule:
        """Batch element b's tiling: its own keys, bottom-right aligned."""
        return TileSchedule(self.n_q, self.cache_seqlens[b], self.block_q, self.block_kv, self.causal,
                            "lower_right", self.window, self.pack)

    def split_tiles(self, b: int, i: int, s: int) -> range:
        """The KV tiles query tile i of batch element b visits in split s: its run cut to the split's tiles."""
        run = self.of_batch(b).kv_range(i)
        first = s * self.tiles_per_split
        return range(max(run.start, first), min(run.stop, first + self.tiles_per_split))
