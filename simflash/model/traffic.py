"""Closed-form HBM traffic: exact integer bytes for any configuration, no simulation.

These formulas are derived independently of the simulator's loops; the tests hold the two equal
for every configuration. All loops here run over query tiles only, so N = 2^20 is instant; more than
MAX_QUERY_TILES query tiles are refused rather than summed for minutes.
"""

from __future__ import annotations

from simflash.config import STATE_DTYPE, check_causal_variant, check_positive_int, storage_dtype
from simflash.memory import Flow, Traffic


def _sizes(n: int, d: int, n_kv: int | None, heads: int) -> tuple[int, int, int, int]:
    n_q = check_positive_int("n", n)
    n_kv = n_q if n_kv is None else check_positive_int("n_kv", n_kv)
    return n_q, n_kv, check_positive_int("d", d), check_positive_int("heads", heads)


MAX_QUERY_TILES = 2**20  # about a second of summing; N = 2^27 at B_r = 128


def check_query_tiles(n_q: int, block_q: int) -> None:
    """Refuse a configuration whose closed form would sum over more than MAX_QUERY_TILES query tiles."""
    tiles = -(-n_q // block_q)
    if tiles > MAX_QUERY_TILES:
        raise ValueError(f"n must make at most {MAX_QUERY_TILES:,} query tiles (N <= {MAX_QUERY_TILES * block_q:,} at "
                         f"B_r = {block_q}: the closed form sums over query tiles), got {n_q:,} ({tiles:,} tiles)")


def _diagonal_offset(n_q: int, n_kv: int, causal_variant: str) -> int:
    return 0 if check_causal_variant(causal_variant) == "upper_left" else n_kv - n_q


def permitted_entries(n_q: int, n_kv: int, causal: bool, causal_variant: str = "upper_left") -> int:
    """Entries of the (n_q, n_kv) score matrix a query may see: sum over rows of clamp(r + off + 1, 0, n_kv)."""
    if not causal:
        return n_q * n_kv
    first = _diagonal_offset(n_q, n_kv, causal_variant) + 1  # keys visible to row 0
    last = first + n_q - 1  # keys visible to the last row, before clamping
    # Rows whose count lies strictly between 0 and n_kv contribute their count; rows at or past n_kv, n_kv.
    lo, hi = max(first, 1), min(last, n_kv - 1)
    partial = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    full_rows = max(0, last - max(first, n_kv) + 1)
    return partial + full_rows * n_kv


def naive_traffic(
    n: int, d: int, dtype: str = "float16", causal: bool = False, *, n_kv: int | None = None,
    heads: int = 1, causal_variant: str = "upper_left",
) -> Traffic:
    """The three-kernel baseline; causal stores only the permitted entries of S and P (exact count)."""
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    b = storage_dtype(dtype).itemsize
    sp = permitted_entries(n_q, n_kv, causal, causal_variant) * b  # bytes of S (and of P)
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


def kv_rows_visited(n_q: int, n_kv: int, block_q: int, block_kv: int, causal: bool, causal_variant: str) -> list[int]:
    """For each query tile, the K (and V) rows it loads: whole KV tiles up to the causal skip bound."""
    check_query_tiles(n_q, block_q)
    offset = _diagonal_offset(n_q, n_kv, causal_variant)
    rows = []
    for row_stop in range(block_q, n_q + block_q, block_q):
        last_col = min(row_stop, n_q) - 1 + offset if causal else n_kv - 1
        tiles = max(0, min(last_col, n_kv - 1) // block_kv + 1) if last_col >= 0 else 0
        rows.append(min(tiles * block_kv, n_kv))
    return rows


def fa2_traffic(n_q, n_kv, d, block_q, block_kv, b, causal, causal_variant, write_logsumexp) -> dict:
    """FA-2: per query tile read Q_i once and every visited K_j, V_j; write O_i once (and L_i).

    A query tile with no KV tile to visit (lower_right causal with n_q > n_kv) exits without reading
    Q_i; it still writes its O_i rows (zeros) and L_i (+inf)."""
    visited = kv_rows_visited(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    kv_rows = sum(visited)
    q_rows = sum(min(block_q, n_q - start) for start, rows in zip(range(0, n_q, block_q), visited) if rows)
    ledger = {
        ("flash2_forward", "Q"): Flow(read_bytes=q_rows * d * b),
        ("flash2_forward", "K"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_forward", "V"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_forward", "O"): Flow(write_bytes=n_q * d * b),
    }
    if write_logsumexp:
        ledger["flash2_forward", "L"] = Flow(write_bytes=n_q * STATE_DTYPE.itemsize)
    return ledger


def fa1_traffic(n_q, n_kv, d, block_q, block_kv, b, causal, causal_variant, write_logsumexp,
                o_accum_dtype="storage") -> dict:
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
    kv_rows = kv_rows_visited(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    kv_tiles = [-(-rows // block_kv) for rows in kv_rows]  # KV tiles each query tile visits (a prefix)
    q_rows = [min(block_q, n_q - start) for start in range(0, n_q, block_q)]
    step_rows = sum(r * t for r, t in zip(q_rows, kv_tiles))  # query rows summed over every visited (j, i)
    init_rows = sum(r for r, t in zip(q_rows, kv_tiles) if t)  # rows of the query tiles that are visited
    kv_loaded = max(kv_rows)  # the visited prefixes' union is the longest prefix: loaded once each
    later_reads = step_rows - init_rows  # visits after each query tile's first
    final_writes = n_q - init_rows + step_rows  # never-visited tiles' init, then every visit's write
    stats_reads = later_reads * s + (n_q * s if write_logsumexp else 0)
    ledger = {
        ("flash1_forward", "O (init)"): Flow(read_bytes=init_rows * d * ob, write_bytes=init_rows * d * ob),
        ("flash1_forward", "l (init)"): Flow(read_bytes=init_rows * s, write_bytes=init_rows * s),
        ("flash1_forward", "m (init)"): Flow(read_bytes=init_rows * s, write_bytes=init_rows * s),
        ("flash1_forward", "O"): Flow(read_bytes=(later_reads + (n_q if o_accum_dtype == "float32" else 0)) * d * ob,
                                      write_bytes=final_writes * d * ob),
        ("flash1_forward", "l"): Flow(read_bytes=stats_reads, write_bytes=final_writes * s),
        ("flash1_forward", "m"): Flow(read_bytes=stats_reads, write_bytes=final_writes * s),
        ("flash1_forward", "K"): Flow(read_bytes=kv_loaded * d * b),
        ("flash1_forward", "V"): Flow(read_bytes=kv_loaded * d * b),
        ("flash1_forward", "Q"): Flow(read_bytes=step_rows * d * b),
    }
    if o_accum_dtype == "float32":
        ledger["flash1_forward", "out"] = Flow(write_bytes=n_q * d * b)
    if write_logsumexp:
        ledger["flash1_forward", "L"] = Flow(write_bytes=n_q * s)
    return ledger


# Closed forms by variant, as the algorithms registry: (n_q, n_kv, d, B_r, B_c, itemsize, causal,
# causal_variant, write_logsumexp) -> ledger for one head.
FLASH_TRAFFIC = {
    "fa2": fa2_traffic,
    "fa1": fa1_traffic,
}


def flash_traffic(
    n: int, d: int, block_q: int = 128, block_kv: int = 64, dtype: str = "float16", causal: bool = False,
    variant: str = "fa2", *, n_kv: int | None = None, heads: int = 1, causal_variant: str = "upper_left",
    write_logsumexp: bool = False, o_accum_dtype: str = "storage",
) -> Traffic:
    """Exact HBM bytes of tiled attention, equal to the simulator's ledger for the same configuration.

    o_accum_dtype (variant="fa1" only): "storage" or "float32", as in `sf.flash_attention`.
    """
    if variant not in FLASH_TRAFFIC:
        raise ValueError(f"variant must be one of {sorted(FLASH_TRAFFIC)}, got {variant!r}")
    options = {} if o_accum_dtype == "storage" and variant != "fa1" else {"o_accum_dtype": o_accum_dtype}
    if variant != "fa1" and options or o_accum_dtype not in ("storage", "float32"):
        raise ValueError(f"o_accum_dtype must be one of ('storage', 'float32') for variant 'fa1' and 'storage' "
                         f"for the others, got {o_accum_dtype!r} for variant {variant!r}")
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    b = storage_dtype(dtype).itemsize
    ledger = FLASH_TRAFFIC[variant](n_q, n_kv, d, block_q, block_kv, b, bool(causal), causal_variant, write_logsumexp,
                                    **options)
    return Traffic(ledger).times(heads)


def kv_passes(n: int, block_q: int = 128, block_kv: int = 64, causal: bool = False, *, n_kv: int | None = None,
              causal_variant: str = "upper_left") -> float:
    """Complete passes over K/V a tiled forward makes (the lesson's 32 unmasked, 16.5 causal)."""
    n_q, n_kv, _, _ = _sizes(n, 1, n_kv, 1)
    return sum(kv_rows_visited(n_q, n_kv, block_q, block_kv, bool(causal), causal_variant)) / n_kv
