"""Closed forms of the backward pass: exact HBM bytes and FLOPs by kind, no simulation.

FlashAttention-2's backward (Dao 2023, Algorithm 2) runs KV tiles outer: the CTA of KV tile j loads
K_j, V_j once, then Q_i, dO_i, L_i, D_i of every query tile i that visits it, and sends
scale dS_ij K_j to the float32 dQ_accum by atomic adds. So the counts come from the query tiles that
visit each KV tile (`kv_tile_visits`), derived here from the definition of the window, not from the
simulator's loops; the tests hold the two equal byte for byte.

Per query head h (K/V head g = h // (H_q / H_kv)), b the storage itemsize, 4 for float32:

    flash2_backward_preprocess   reads O, dO (n_q d b each); writes D (n_q 4), zeroes dQ_accum (n_q d 4)
    flash2_backward              per KV tile j that some query tile visits: reads K_j, V_j; per visit
                                 (j, i): reads Q_i, dO_i (r d b each), L_i, D_i (r 4 each), atomically adds
                                 r d 4 to dQ_accum; every KV tile writes dK_j, dV_j (c d b each; zeros
                                 where no query tile visits)
    flash2_backward_convert      reads dQ_accum (n_q d 4); writes dQ (n_q d b)
    flash2_backward_gqa_sum      grouped-query heads only: the main kernel writes dK, dV per query head
                                 into dK_expanded, dV_expanded; this reads them (H_q n_kv d b each) and
                                 writes each group's sum to dK, dV (H_kv n_kv d b each)

The naive backward reads the P its forward stored, and stores dP and dS (only the E entries a row may
see, as its forward stores S and P):

    gemm_dv           dV = P^T dO              reads P (E b), dO; writes dV
    gemm_dp           dP = dO V^T              reads dO, V; writes dP (E b)
    softmax_backward  dS = P o (dP - rowsum(dP o P))   reads P, dP; writes dS
    gemm_dq           dQ = scale dS K          reads dS, K; writes dQ
    gemm_dk           dK = scale dS^T Q        reads dS, Q; writes dK
    gqa_sum           grouped-query heads only, as flash2_backward_gqa_sum: gemm_dk and gemm_dv
                      write dK_expanded, dV_expanded per query head, this adds each group's up
"""

from __future__ import annotations

import attrs
import numpy as np

from simflash.config import STATE_DTYPE, check_bool, check_positive_int, storage_dtype
from simflash.memory import Flow, Traffic
from simflash.model.flops import KINDS
from simflash.model.traffic import (
    MAX_QUERY_TILES,
    _bounds,
    _diagonal_offset,
    _sizes,
    head_groups,
    permitted_entries,
)

NAIVE_BACKWARD_KERNELS = ("gemm_dv", "gemm_dp", "softmax_backward", "gemm_dq", "gemm_dk")


@attrs.frozen
class KVTileVisits:
    """Each KV tile of one head: its columns, and the run of query tiles that visit it."""

    cols: np.ndarray  # (T_c,) keys of the tile
    first: np.ndarray  # (T_c,) its first visiting query tile
    count: np.ndarray  # (T_c,) query tiles that visit it (0: none)
    q_rows: np.ndarray  # (T_c,) query rows of those tiles

    @property
    def visited(self) -> np.ndarray:
        return self.count > 0


def kv_tile_visits(n_q: int, n_kv: int, block_q: int, block_kv: int, causal: bool, causal_variant: str,
                   window: tuple[int, int] = (-1, -1)) -> KVTileVisits:
    """The query tiles visiting every KV tile, in closed form. Position p sees key c iff
    p + off - left <= c <= p + off + right, so the positions touching columns [c0, c1] are
    [c0 - off - right, c1 - off + left] clipped to [0, n_q): a contiguous run, held by a run of query tiles."""
    tiles = -(-n_kv // block_kv)
    if tiles > MAX_QUERY_TILES:
        raise ValueError(f"n_kv must make at most {MAX_QUERY_TILES:,} KV tiles (the closed form sums over KV tiles), "
                         f"got {n_kv:,} ({tiles:,} tiles)")
    off = _diagonal_offset(n_q, n_kv, causal_variant)
    left, right = _bounds(causal, window)
    starts = np.arange(0, n_kv, block_kv, dtype=np.int64)
    stops = np.minimum(starts + block_kv, n_kv)
    first_position = np.zeros_like(starts) if right is None else np.maximum(0, starts - off - right)
    last_position = np.full_like(starts, n_q - 1) if left is None else np.minimum(n_q - 1, stops - 1 - off + left)
    seen = first_position <= last_position
    first = np.where(seen, first_position // block_q, 0)
    last = last_position // block_q
    count = np.where(seen, last - first + 1, 0)
    q_rows = np.where(seen, np.minimum((last + 1) * block_q, n_q) - first * block_q, 0)
    return KVTileVisits(stops - starts, first, count, q_rows)


def _flash_backward_ledger(visits: KVTileVisits, n_q: int, n_kv: int, d: int, b: int) -> dict:
    """One query head's ledger of the preprocess, main and convert kernels."""
    s = STATE_DTYPE.itemsize
    visit_rows = int(visits.q_rows.sum())  # query rows summed over every visited (j, i)
    kv_rows = int(visits.cols[visits.visited].sum())  # keys of the KV tiles some query tile visits
    return {
        ("flash2_backward_preprocess", "O"): Flow(read_bytes=n_q * d * b),
        ("flash2_backward_preprocess", "dO"): Flow(read_bytes=n_q * d * b),
        ("flash2_backward_preprocess", "D"): Flow(write_bytes=n_q * s),
        ("flash2_backward_preprocess", "dQ_accum"): Flow(write_bytes=n_q * d * s),
        ("flash2_backward", "K"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_backward", "V"): Flow(read_bytes=kv_rows * d * b),
        ("flash2_backward", "Q"): Flow(read_bytes=visit_rows * d * b),
        ("flash2_backward", "dO"): Flow(read_bytes=visit_rows * d * b),
        ("flash2_backward", "L"): Flow(read_bytes=visit_rows * s),
        ("flash2_backward", "D"): Flow(read_bytes=visit_rows * s),
        ("flash2_backward", "dQ_accum"): Flow(write_bytes=visit_rows * d * s),  # the atomic adds' addends
        ("flash2_backward_convert", "dQ_accum"): Flow(read_bytes=n_q * d * s),
        ("flash2_backward_convert", "dQ"): Flow(write_bytes=n_q * d * b),
    }


def _per_query_head_gradients(ledger: dict, kernels: tuple[str, str], heads: int, kv_count: int, grads: int,
                              sum_kernel: str) -> Traffic:
    """Every head's `ledger` plus the dK and dV writes of `kernels`: straight to dK, dV, or with
    grouped-query heads to dK_expanded, dV_expanded and then summed over each group by `sum_kernel`."""
    grouped = kv_count != heads
    for kernel, gradient in zip(kernels, ("dK", "dV")):
        ledger[kernel, f"{gradient}_expanded" if grouped else gradient] = Flow(write_bytes=grads)
    if not grouped:
        return Traffic(ledger).times(heads)
    summed = Flow(write_bytes=kv_count * grads)  # one dK and one dV per K/V head
    return Traffic({
        **Traffic({**ledger, (sum_kernel, "dK_expanded"): Flow(read_bytes=grads),
                   (sum_kernel, "dV_expanded"): Flow(read_bytes=grads)}).times(heads).ledger,
        (sum_kernel, "dK"): summed, (sum_kernel, "dV"): summed,
    })


def flash_backward_traffic(
    n: int, d: int, block_q: int = 64, block_kv: int = 128, dtype: str = "float16", causal: bool = False, *,
    n_kv: int | None = None, heads: int = 1, kv_heads: int | None = None, causal_variant: str = "upper_left",
    window: tuple[int, int] = (-1, -1),
) -> Traffic:
    """Exact HBM bytes of FlashAttention-2's backward kernels (not its forward), equal to the ledger of
    `sf.flash_attention_backward(...).traffic` for the same configuration.

    heads: query heads (all batch elements); kv_heads: K/V heads (None: as many). With fewer K/V
    heads the main kernel writes dK_expanded, dV_expanded per query head and flash2_backward_gqa_sum
    adds each group's up."""
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    block_q = check_positive_int("block_q", block_q)
    block_kv = check_positive_int("block_kv", block_kv)
    kv_count, _ = head_groups(heads, kv_heads, True)  # (H_kv, H_q / H_kv)
    b = storage_dtype(dtype).itemsize
    visits = kv_tile_visits(n_q, n_kv, block_q, block_kv, check_bool("causal", causal), causal_variant, window)
    return _per_query_head_gradients(_flash_backward_ledger(visits, n_q, n_kv, d, b),
                                     ("flash2_backward", "flash2_backward"), heads, kv_count, n_kv * d * b,
                                     "flash2_backward_gqa_sum")


def naive_backward_traffic(
    n: int, d: int, dtype: str = "float16", causal: bool = False, *, n_kv: int | None = None, heads: int = 1,
    kv_heads: int | None = None, causal_variant: str = "upper_left", window: tuple[int, int] = (-1, -1),
) -> Traffic:
    """Exact HBM bytes of the naive backward's kernels (not its forward), equal to the ledger of
    `sf.naive_attention_backward(...).traffic`. P, dP and dS hold only the entries a row may see; with
    grouped-query heads gemm_dk, gemm_dv write dK_expanded, dV_expanded and gqa_sum adds each group's up."""
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    kv_count, _ = head_groups(heads, kv_heads, True)  # (H_kv, H_q / H_kv)
    b = storage_dtype(dtype).itemsize
    scores = permitted_entries(n_q, n_kv, check_bool("causal", causal), causal_variant, window) * b
    rows, keys = n_q * d * b, n_kv * d * b  # Q (dO, dQ) and K (V, dK, dV) of one head
    ledger = {
        ("gemm_dv", "P"): Flow(read_bytes=scores),
        ("gemm_dv", "dO"): Flow(read_bytes=rows),
        ("gemm_dp", "dO"): Flow(read_bytes=rows),
        ("gemm_dp", "V"): Flow(read_bytes=keys),
        ("gemm_dp", "dP"): Flow(write_bytes=scores),
        ("softmax_backward", "P"): Flow(read_bytes=scores),
        ("softmax_backward", "dP"): Flow(read_bytes=scores),
        ("softmax_backward", "dS"): Flow(write_bytes=scores),
        ("gemm_dq", "dS"): Flow(read_bytes=scores),
        ("gemm_dq", "K"): Flow(read_bytes=keys),
        ("gemm_dq", "dQ"): Flow(write_bytes=rows),
        ("gemm_dk", "dS"): Flow(read_bytes=scores),
        ("gemm_dk", "Q"): Flow(read_bytes=rows),
    }
    return _per_query_head_gradients(ledger, ("gemm_dk", "gemm_dv"), heads, kv_count, keys, "gqa_sum")


def backward_flops_by_kind(
    n: int, d: int, variant: str = "fa2", causal: bool = False, block_q: int = 64, block_kv: int = 128, *,
    n_kv: int | None = None, heads: int = 1, kv_heads: int | None = None, causal_variant: str = "upper_left",
    window: tuple[int, int] = (-1, -1),
) -> dict[str, int]:
    """Arithmetic by kind of the backward kernels of variant "fa2" or "naive", equal to `run.flops_by_kind`.

    fa2, per visited tile (j, i) of r query rows and c keys: five matmuls (S, dV, dP, dQ, dK: 10 r c d
    tensor FLOPs), P = exp(scale S - L) (r c exp), scale, subtract L, dP - D and the product with P
    (4 r c fp32), the scale of dQ's addend (r d fp32); per KV tile visited, dK_j's scale (c d fp32).
    The preprocess's rowsum(dO o O) is 2 n_q d fp32 per head, the GQA sum (H_q - H_kv) x 2 n_kv d.
    naive: four full matmuls (8 n_q n_kv d), the softmax backward 4 n_q n_kv fp32 (dP o P, its row sum,
    dP - D, the product with P), the scale in dQ's and dK's GEMM epilogues (n_q d and n_kv d), the
    GQA sum as fa2's."""
    variants = ("naive", "fa2")
    if variant not in variants:
        raise ValueError(f"variant must be one of {variants}, got {variant!r}")
    n_q, n_kv, d, heads = _sizes(n, d, n_kv, heads)
    kv_count, _ = head_groups(heads, kv_heads, True)  # (H_kv, H_q / H_kv)
    group_sums = (heads - kv_count) * 2 * n_kv * d  # dK and dV summed over each group (0 without groups)
    if variant == "naive":
        entries = n_q * n_kv
        return {"tensor": heads * 8 * entries * d, "exp": 0,
                "fp32": heads * (4 * entries + n_q * d + n_kv * d) + group_sums, "div": 0}
    visits = kv_tile_visits(n_q, n_kv, check_positive_int("block_q", block_q), check_positive_int("block_kv", block_kv),
                            check_bool("causal", causal), causal_variant, window)
    scores = int((visits.cols * visits.q_rows).sum())  # r c summed over visited (j, i)
    visit_rows = int(visits.q_rows.sum())
    kv_rows = int(visits.cols[visits.visited].sum())
    counts = {"tensor": 10 * scores * d, "exp": scores, "fp32": 4 * scores + visit_rows * d + kv_rows * d + 2 * n_q * d,
              "div": 0}
    totals = {kind: heads * counts[kind] for kind in KINDS}
    totals["fp32"] += group_sums
    return totals
