"""Closed-form HBM traffic: exact integer bytes for any configuration, no simulation.

These formulas are derived independently of the simulator's loops; the tests hold the two equal
for every configuration. All loops here run over query tiles only, so N = 2^20 is instant; more than
MAX_QUERY_TILES query tiles are refused rather than summed for minutes.
"""

from __future__ import annotations

import attrs
import numpy as np

from simflash.config import STATE_DTYPE, check_bool, check_causal_variant, check_positive_int, check_window, storage_dtype
from simflash.memory import Flow, Traffic


def _sizes(n: int, d: int, n_kv: int | None, heads: int) -> tuple[int, int, int, int]:
    n_q = check_positive_int("n", n)
    n_kv = n_q if n_kv is None else check_positive_int("n_kv", n_kv)
    return n_q, n_kv, check_positive_int("d", d), check_positive_int("heads", heads)


def head_groups(heads: int, kv_heads: int | None, pack_gqa: bool) -> tuple[int, int]:
    """(CTA heads, pack): query heads and 1, or with pack_gqa the K/V heads and the group size H_q / H_kv."""
    kv_heads = heads if kv_heads is None else check_positive_int("kv_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"heads (H_q = {heads}) must be a multiple of kv_heads (H_kv = {kv_heads})")
    return (kv_heads, heads // kv_heads) if check_bool("pack_gqa", pack_gqa) else (heads, 1)


MAX_QUERY_TILES = 2**20  # about a second of summing; N = 2^27 at B_r = 128


def check_query_tiles(n_q: int, block_q: int) -> None:
    """Refuse a configuration whose closed form would sum over more than MAX_QUERY_TILES query tiles."""
    tiles = -(-n_q // block_q)
    if tiles > MAX_QUERY_TILES:
        raise ValueError(f"n must make at most {MAX_QUERY_TILES:,} query tiles (N <= {MAX_QUERY_TILES * block_q:,} at "
                         f"B_r = {block_q}: the closed form sums over query tiles), got {n_q:,} ({tiles:,} tiles)")


def _diagonal_offset(n_q: int, n_kv: int, causal_variant: str) -> int:
    return 0 if check_causal_variant(causal_variant) == "upper_left" else n_kv - n_q


def _bounds(causal: bool, window: tuple[int, int]) -> tuple[int | None, int | None]:
    """(left, right) keys visible around the diagonal, None where unbounded; causal means right = 0."""
    left, right = check_window(window)
    if causal and right > 0:
        raise ValueError(f"window's right bound must be 0 or -1 with causal=True (causal means right = 0), "
                         f"got window={window}")
    return (None if left < 0 else left), (0 if causal else None if right < 0 else right)


def _clamped_sum(n_q: int, shift: int, n_kv: int) -> int:
    """sum over rows r < n_q of clamp(r + shift, 0, n_kv), in O(1)."""
    first, last = shift, shift + n_q - 1  # before clamping
    lo, hi = max(first, 1), min(last, n_kv - 1)  # rows whose value lies strictly between 0 and n_kv
    partial = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    return partial + max(0, last - max(first, n_kv) + 1) * n_kv  # rows at or past n_kv count n_kv


def permitted_entries(n_q: int, n_kv: int, causal: bool, causal_variant: str = "upper_left",
                      window: tuple[int, int] = (-1, -1)) -> int:
    """Entries of the (n_q, n_kv) score matrix a query may see. Row r sees the keys in
    [r + off - left, r + off + right] within [0, n_kv): clamp(r + off + right + 1) - clamp(r + off - left)."""
    off = _diagonal_offset(n_q, n_kv, causal_variant)
    left, right = _bounds(causal, window)
    below_last = n_q * n_kv if right is None else _clamped_sum(n_q, off + right + 1, n_kv)
    before_first = 0 if left is None else _clamped_sum(n_q, off - left, n_kv)
    return below_last - before_first


@attrs.frozen
class QueryTiles:
    """Each query tile of one head (or packed group): its rows, and the run of KV tiles it visits."""

    rows: np.ndarray  # (T_r,) query rows of the tile
    first: np.ndarray  # (T_r,) its first KV tile
    count: np.ndarray  # (T_r,) KV tiles it visits (0: none)
    kv_rows: np.ndarray  # (T_r,) K (and V) rows those tiles hold
    kv_tiles_loaded: int  # KV tiles some query tile visits (their union)
    kv_rows_loaded: int  # K (and V) rows of those tiles

    @property
    def visited(self) -> np.ndarray:
        return self.count > 0


def query_tiles(n_q: int, n_kv: int, block_q: int, block_kv: int, causal: bool, causal_variant: str,
                window: tuple[int, int] = (-1, -1), pack: int = 1) -> QueryTiles:
    """The visits of every query tile, in closed form. With `pack`, rows are packed rows (row p holds
    position p // pack); a tile's positions [p0, p1] see keys [p0 + off - left, p1 + off + right], a
    contiguous run, clipped to the sequence, so each tile visits one run of whole KV tiles."""
    n_rows = n_q * pack
    check_query_tiles(n_rows, block_q)
    off = _diagonal_offset(n_q, n_kv, causal_variant)
    left, right = _bounds(causal, window)
    starts = np.arange(0, n_rows, block_q, dtype=np.int64)
    stops = np.minimum(starts + block_q, n_rows)
    lo = np.zeros_like(starts) if left is None else np.maximum(0, starts // pack + off - left)
    hi = np.full_like(starts, n_kv - 1) if right is None else np.minimum(n_kv - 1, (stops - 1) // pack + off + right)
    seen = lo <= hi
    first = np.where(seen, lo // block_kv, 0)
    count = np.where(seen, hi // block_kv - lo // block_kv + 1, 0)
    end = first + count  # one past the last KV tile visited
    kv_rows = np.where(seen, np.minimum(end * block_kv, n_kv) - first * block_kv, 0)
    # the runs start and end in non-decreasing order: their union adds what passes the previous ends
    reached = np.maximum.accumulate(np.where(seen, end, 0))
    previous = np.concatenate(([0], reached[:-1]))
    tiles_loaded = int(np.maximum(0, end - np.maximum(first, previous))[seen].sum())
    last_tile_rows = n_kv - (-(-n_kv // block_kv) - 1) * block_kv  # the ragged last KV tile
    rows_loaded = tiles_loaded * block_kv - (block_kv - last_tile_rows if reached[-1] * block_kv >= n_kv else 0)
    return QueryTiles(stops - starts, first, count, kv_rows, tiles_loaded, int(rows_loaded))


def naive_traffic(
    n: int, d: int, dtype: str = "float16", causal: bool = False, *, n_kv: int | None = None,
    heads: int = 1, causal_variant: str = "upper_left", window: tuple[int, int] = (-1, -1),
    kv_heads: int | None = None,
) -> Traffic:
    """The three-kernel baseline; causal or windowed, it stores only the permitted entries of S and P
    (exact count). heads: query heads; kv_heads: K/V heads, each read by the GEMMs of its group's heads."""
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    head_groups(heads, kv_heads, False)
    b = storage_dtype(dtype).itemsize
    sp = permitted_entries(n_q, n_kv, causal, causal_variant, window) * b  # bytes of S (and of P)
    return Traffic({
        ("gemm_qk", "Q"): Flow(read_bytes=n_q * d * b),
        ("gemm_qk", "K"): Flow(read_bytes=n_kv * d * b),
        ("gemm_qk", "S"): Flow(write_bytes=sp),
        ("softmax", "S"): Flow(read_bytes=sp),
        ("softmax", "P"): Flow(write_bytes=sp),
        ("gemm_pv", "P"): Flow(read_bytes=sp),
        ("gemm_pv", "V"): Flow(read_bytes=n_kv * d * b),
        ("gemm_pv", "O"): Flow(write_bytes=n_q * d * b),
    }).times(heads)


def idealized_causal_naive_traffic(n: int, d: int, dtype: str = "float16", *, heads: int = 1) -> Traffic:
    """The lesson's idealised causal baseline: each of S and P counted as exactly N^2 / 2."""
    n, _, d, heads = _sizes(n, d, None, heads)
    b = storage_dtype(dtype).itemsize
    sp = n * n * b // 2  # every storage itemsize is even, so this is exact
    exact = naive_traffic(n, d, dtype, causal=True, heads=1)
    ledger = {key: (Flow(sp if f.read_bytes else 0, sp if f.write_bytes else 0) if key[1] in "SP" else f)
              for key, f in exact.ledger.items()}
    return Traffic(ledger).times(heads)


def fa2_traffic(tiles: QueryTiles, d: int, b: int, write_logsumexp: bool) -> dict:
    """FA-2: per query tile read Q_i once and every visited K_j, V_j; write O_i once (and L_i).

    A query tile with no KV tile to visit (lower_right causal with n_q > n_kv, or a window that misses
    the cache) exits without reading Q_i; it still writes its O_i rows (zeros) and L_i (+inf)."""
    n_rows = int(tiles.rows.sum())
    kv_rows = int(tiles.kv_rows.sum())
    ledger = {
        ("flash2_forward", "Q"): Flow(read_bytes=int(tiles.rows[tiles.visited].sum()) * d * b),
        ("flash2_forward", "K"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_forward", "V"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_forward", "O"): Flow(write_bytes=n_rows * d * b),
    }
    if write_logsumexp:
        ledger["flash2_forward", "L"] = Flow(write_bytes=n_rows * STATE_DTYPE.itemsize)
    return ledger


def fa1_traffic(tiles: QueryTiles, d: int, b: int, write_logsumexp: bool, o_accum_dtype: str = "storage") -> dict:
    """FA-1: initialise O, l, m in HBM; read each KV tile that some query tile visits once; for every
    visited (j, i) read Q_i, O_i, l_i, m_i and write O_i, l_i, m_i back (l and m in float32; O in the
    storage dtype, or float32 with o_accum_dtype="float32", which adds a last read of O and a write
    of the output in the storage dtype, "out").

    Labels: a query tile that is visited writes its initial values to "O (init)", "l (init)",
    "m (init)" and its first visit reads them back from there (what the released kernel skips); a
    query tile never visited writes them to "O", "l", "m" (its final state). With write_logsumexp,
    an epilogue reads the final l and m once and writes L = m + log l.
    """
    s = STATE_DTYPE.itemsize
    ob = s if o_accum_dtype == "float32" else b  # bytes per element of the running O
    n_rows = int(tiles.rows.sum())
    step_rows = int((tiles.rows * tiles.count).sum())  # query rows summed over every visited (j, i)
    init_rows = int(tiles.rows[tiles.visited].sum())  # rows of the query tiles that are visited
    later_reads = step_rows - init_rows  # visits after each query tile's first
    final_writes = n_rows - init_rows + step_rows  # never-visited tiles' init, then every visit's write
    stats_reads = later_reads * s + (n_rows * s if write_logsumexp else 0)
    ledger = {
        ("flash1_forward", "O (init)"): Flow(read_bytes=init_rows * d * ob, write_bytes=init_rows * d * ob),
        ("flash1_forward", "l (init)"): Flow(read_bytes=init_rows * s, write_bytes=init_rows * s),
        ("flash1_forward", "m (init)"): Flow(read_bytes=init_rows * s, write_bytes=init_rows * s),
        ("flash1_forward", "O"): Flow(read_bytes=(later_reads + (n_rows if o_accum_dtype == "float32" else 0)) * d * ob,
                                      write_bytes=final_writes * d * ob),
        ("flash1_forward", "l"): Flow(read_bytes=stats_reads, write_bytes=final_writes * s),
        ("flash1_forward", "m"): Flow(read_bytes=stats_reads, write_bytes=final_writes * s),
        ("flash1_forward", "K"): Flow(read_bytes=tiles.kv_rows_loaded * d * b),  # each visited KV tile once
        ("flash1_forward", "V"): Flow(read_bytes=tiles.kv_rows_loaded * d * b),
        ("flash1_forward", "Q"): Flow(read_bytes=step_rows * d * b),
    }
    if o_accum_dtype == "float32":
        ledger["flash1_forward", "out"] = Flow(write_bytes=n_rows * d * b)
    if write_logsumexp:
        ledger["flash1_forward", "L"] = Flow(write_bytes=n_rows * s)
    return ledger


# Closed forms by variant, as the algorithms registry: (query tiles, d, itemsize, write_logsumexp) ->
# ledger for one head (or packed group).
FLASH_TRAFFIC = {
    "fa2": fa2_traffic,
    "fa1": fa1_traffic,
}


def flash_traffic(
    n: int, d: int, block_q: int = 128, block_kv: int = 64, dtype: str = "float16", causal: bool = False,
    variant: str = "fa2", *, n_kv: int | None = None, heads: int = 1, causal_variant: str = "upper_left",
    write_logsumexp: bool = False, o_accum_dtype: str = "storage", window: tuple[int, int] = (-1, -1),
    kv_heads: int | None = None, pack_gqa: bool = False,
) -> Traffic:
    """Exact HBM bytes of tiled attention, equal to the simulator's ledger for the same configuration.

    heads: query heads (all batch elements); kv_heads: K/V heads (None: as many); pack_gqa and window
    as in `sf.flash_attention`. o_accum_dtype (variant="fa1" only): "storage" or "float32".
    """
    if variant not in FLASH_TRAFFIC:
        raise ValueError(f"variant must be one of {sorted(FLASH_TRAFFIC)}, got {variant!r}")
    options = {} if o_accum_dtype == "storage" and variant != "fa1" else {"o_accum_dtype": o_accum_dtype}
    if (variant != "fa1" and options) or o_accum_dtype not in ("storage", "float32"):
        raise ValueError(f"o_accum_dtype must be one of ('storage', 'float32') for variant 'fa1' and 'storage' "
                         f"for the others, got {o_accum_dtype!r} for variant {variant!r}")
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    cta_heads, pack = head_groups(heads, kv_heads, pack_gqa)
    b = storage_dtype(dtype).itemsize
    tiles = query_tiles(n_q, n_kv, block_q, block_kv, check_bool("causal", causal), causal_variant, window, pack)
    ledger = FLASH_TRAFFIC[variant](tiles, d, b, check_bool("write_logsumexp", write_logsumexp), **options)
    return Traffic(ledger).times(cta_heads)


def kv_passes(n: int, block_q: int = 128, block_kv: int = 64, causal: bool = False, *, n_kv: int | None = None,
              causal_variant: str = "upper_left", window: tuple[int, int] = (-1, -1)) -> float:
    """Complete passes over K/V a tiled forward makes (the lesson's 32 unmasked, 16.5 causal)."""
    n_q, n_kv, _, _ = _sizes(n, 1, n_kv, 1)
    return int(query_tiles(n_q, n_kv, block_q, block_kv, bool(causal), causal_variant, window).kv_rows.sum()) / n_kv
