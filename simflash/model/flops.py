"""Closed-form arithmetic by kind: what the simulator's `run.flops_by_kind` counts, without running.

Kinds: "tensor" (matmul FLOPs on the tensor cores, 2mnk per product: `run.flops`), "exp"
(exponentials), "div" (divisions) and "fp32" (every other float32 operation: scale, max, subtract,
sum, rescale). Per visited tile of B_r x B_c scores (r rows, c keys, d the head dim):

    naive    scale S (gemm_qk): N_q N_kv fp32; softmax: max, subtract, sum 3 N_q N_kv fp32,
             exp N_q N_kv, divide N_q N_kv div (the full rows: causal entries are -inf, not skipped)
    fa2      exp r c + r (P_ij, alpha); fp32 5 r c + r d; once per query tile the r x d division
    fa1      exp r c + 2r (P~_ij, alpha, beta); fp32 4 r c + 6 r + 3 r d; div r d (Algorithm 1's
             diag(l_new)^-1 on every visited tile, not once)

The sums run over query tiles only (each visits a prefix of KV tiles), so any N is instant.
"""

from __future__ import annotations

from simflash.config import check_positive_int
from simflash.model.traffic import _sizes, kv_rows_visited

KINDS = ("tensor", "exp", "fp32", "div")



def _tiles(n_q, n_kv, block_q, block_kv, causal, causal_variant):
    """Sums over visited (i, j): of r c (scores), of r (rows per visited tile); and n_q."""
    kv_rows = kv_rows_visited(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    kv_tiles = [-(-rows // block_kv) for rows in kv_rows]
    q_rows = [min(block_q, n_q - start) for start in range(0, n_q, block_q)]
    scores = sum(r * c for r, c in zip(q_rows, kv_rows))
    step_rows = sum(r * t for r, t in zip(q_rows, kv_tiles))
    return scores, step_rows


def naive_flops(n_q, n_kv, d) -> dict[str, int]:
    entries = n_q * n_kv
    return {"tensor": 4 * entries * d, "exp": entries, "fp32": 4 * entries, "div": entries}


def fa2_flops(n_q, n_kv, d, block_q, block_kv, causal, causal_variant) -> dict[str, int]:
    scores, step_rows = _tiles(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    kv_rows = kv_rows_visited(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    q_rows = [min(block_q, n_q - start) for start in range(0, n_q, block_q)]
    normalised = sum(r for r, kv in zip(q_rows, kv_rows) if kv)  # a tile that visits nothing exits before it
    return {"tensor": 4 * scores * d, "exp": scores + step_rows, "fp32": 5 * scores + step_rows * d,
            "div": normalised * d}  # a_i / l_i once, after the last KV tile


def fa1_flops(n_q, n_kv, d, block_q, block_kv, causal, causal_variant) -> dict[str, int]:
    scores, step_rows = _tiles(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    return {"tensor": 4 * scores * d, "exp": scores + 2 * step_rows,
            "fp32": 4 * scores + 6 * step_rows + 3 * step_rows * d, "div": step_rows * d}


FLASH_FLOPS = {"fa2": fa2_flops, "fa1": fa1_flops}


def flops_by_kind(
    n: int, d: int, variant: str = "fa2", causal: bool = False, block_q: int = 128, block_kv: int = 64, *,
    n_kv: int | None = None, heads: int = 1, causal_variant: str = "upper_left",
) -> dict[str, int]:
    """Arithmetic by kind of variant "naive", "fa2" or "fa1", equal to the simulator's `run.flops_by_kind`."""
    variants = ("naive", *FLASH_FLOPS)
    if variant not in variants:
        raise ValueError(f"variant must be one of {variants}, got {variant!r}")
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    if variant == "naive":
        counts = naive_flops(n_q, n_kv, d)
    else:
        block_q = check_positive_int("block_q", block_q)
        block_kv = check_positive_int("block_kv", block_kv)
        counts = FLASH_FLOPS[variant](n_q, n_kv, d, block_q, block_kv, bool(causal), causal_variant)
    return {kind: heads * counts[kind] for kind in KINDS}
