"""Closed-form arithmetic by kind: what the simulator's `run.flops_by_kind` counts, without running.

Kinds: "tensor" (matmul FLOPs on the tensor cores, 2mnk per product: `run.flops`), "exp"
(exponentials), "div" (divisions) and "fp32" (every other float32 operation: scale, max, subtract,
sum, rescale). Per visited tile of B_r x B_c scores (r rows, c keys, d the head dim):

    naive    scale S (gemm_qk): N_q N_kv fp32; softmax: max, subtract, sum 3 N_q N_kv fp32,
             exp N_q N_kv, divide N_q N_kv div (the full rows: causal entries are -inf, not skipped)
    fa2      exp r c + r (P_ij, alpha); fp32 5 r c + r d; once per query tile the r x d division
    fa1      exp r c + 2r (P~_ij, alpha, beta); fp32 4 r c + 6 r + 3 r d; div r d (Algorithm 1's
             diag(l_new)^-1 on every visited tile, not once)

The sums run over query tiles only (each visits one run of KV tiles), so any N is instant.
"""

from __future__ import annotations

from simflash.config import check_positive_int
from simflash.model.traffic import QueryTiles, _sizes, head_groups, query_tiles

KINDS = ("tensor", "exp", "fp32", "div")


def _tiles(tiles: QueryTiles) -> tuple[int, int]:
    """Sums over visited (i, j): of r c (scores), of r (rows per visited tile)."""
    return int((tiles.rows * tiles.kv_rows).sum()), int((tiles.rows * tiles.count).sum())


def naive_flops(n_q, n_kv, d) -> dict[str, int]:
    entries = n_q * n_kv
    return {"tensor": 4 * entries * d, "exp": entries, "fp32": 4 * entries, "div": entries}


def fa2_flops(tiles: QueryTiles, d: int) -> dict[str, int]:
    scores, step_rows = _tiles(tiles)
    normalised = int(tiles.rows[tiles.visited].sum())  # a tile that visits nothing exits before it
    return {"tensor": 4 * scores * d, "exp": scores + step_rows, "fp32": 5 * scores + step_rows * d,
            "div": normalised * d}  # a_i / l_i once, after the last KV tile


def fa1_flops(tiles: QueryTiles, d: int) -> dict[str, int]:
    scores, step_rows = _tiles(tiles)
    return {"tensor": 4 * scores * d, "exp": scores + 2 * step_rows,
            "fp32": 4 * scores + 6 * step_rows + 3 * step_rows * d, "div": step_rows * d}


FLASH_FLOPS = {"fa2": fa2_flops, "fa1": fa1_flops}


def flops_by_kind(
    n: int, d: int, variant: str = "fa2", causal: bool = False, block_q: int = 128, block_kv: int = 64, *,
    n_kv: int | None = None, heads: int = 1, causal_variant: str = "upper_left",
    window: tuple[int, int] = (-1, -1), kv_heads: int | None = None, pack_gqa: bool = False,
) -> dict[str, int]:
    """Arithmetic by kind of variant "naive", "fa2" or "fa1", equal to the simulator's `run.flops_by_kind`.
    heads, kv_heads, window and pack_gqa as in `flash_traffic`."""
    variants = ("naive", *FLASH_FLOPS)
    if variant not in variants:
        raise ValueError(f"variant must be one of {variants}, got {variant!r}")
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    if variant == "naive":
        head_groups(heads, kv_heads, False)
        return {kind: heads * count for kind, count in naive_flops(n_q, n_kv, d).items()}
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    cta_heads, pack = head_groups(heads, kv_heads, pack_gqa)
    counts = FLASH_FLOPS[variant](query_tiles(n_q, n_kv, block_q, block_kv, bool(causal), causal_variant, window,
                                              pack), d)
    return {kind: cta_heads * counts[kind] for kind in KINDS}
