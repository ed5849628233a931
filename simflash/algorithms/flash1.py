"""FlashAttention-1 forward (Dao et al. 2022, Algorithm 1).

KV tiles outer, query tiles inner, one CTA per head. O, l and m live in HBM: they are initialised
there, and every visited (j, i) reads O_i, l_i, m_i back, folds K_j, V_j in and writes them out
again. The accumulator stays normalised (O_i is always the softmax-weighted mean of the values seen
so far), so every step divides by the new row sum. That O round trip per KV tile is the traffic
FlashAttention-2 removes by swapping the loops. Causal: (i, j) pairs past the skip bound are never
visited (a KV tile that no query tile visits is never loaded); tiles that straddle the diagonal are
masked before the running max and sum see their scores.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simflash.config import STATE_DTYPE
from simflash.grid import CTA
from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule
from simflash.trace import TileStep, TraceRequest


KERNEL = "flash1_forward"


def flash1_grid(sched: TileSchedule, heads: int, longest_first: bool = False) -> list[CTA]:
    """One CTA per head; its steps are the (j, i) pairs it visits."""
    pairs = sum(1 for j in range(sched.n_kv_tiles) for i in range(sched.n_q_tiles) if sched.tile_kind(i, j) != "skipped")
    return [CTA((h,), pairs, (h,)) for h in range(heads)]


def flash1_cta(
    gpu: SimulatedGPU,
    sched: TileSchedule,
    scale: float,
    trace: TraceRequest,
    cta: CTA,
    write_logsumexp: bool = False,
) -> Iterator[TileStep | None]:
    """The work of one CTA: all of head h, KV tiles outer. Yields after every (j, i) pair."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    (h,) = cta.index
    d = hbm.shape("Q")[-1]
    storage = hbm.inspect("Q").dtype  # P_ij enters the second matmul in the storage dtype

    # -- initialise O = 0, l = 0, m = -inf in HBM
    hbm.write("O", (h,), 0.0)  # (N, d)
    hbm.write("l", (h,), 0.0)  # (N,)
    hbm.write("m", (h,), -np.inf)  # (N,)

    for j in range(sched.n_kv_tiles):
        q_tiles = [i for i in range(sched.n_q_tiles) if sched.tile_kind(i, j) != "skipped"]
        if not q_tiles:
            continue  # every key of this tile is in every query row's future: never loaded
        cols = sched.kv_cols(j)
        K_j = sram.load("K_j", hbm, "K", (h, cols))  # (B_c, d)
        V_j = sram.load("V_j", hbm, "V", (h, cols))  # (B_c, d)

        for i in q_tiles:
            rows = sched.q_rows(i)
            B_r = rows.stop - rows.start
            Q_i = sram.load("Q_i", hbm, "Q", (h, rows))  # (B_r, d)
            O_i = sram.load("O_i", hbm, "O", (h, rows))  # (B_r, d) normalised output so far
            l_i = sram.load("l_i", hbm, "l", (h, rows))  # (B_r,)
            m_i = sram.load("m_i", hbm, "m", (h, rows))  # (B_r,)
            sram.alloc("S_ij", (B_r, cols.stop - cols.start), storage)

            # -- scores; mask future keys before the statistics see them
            S_ij = compute.matmul(Q_i, K_j.T) * scale  # (B_r, B_c)
            masked = sched.tile_kind(i, j) == "masked"
            if masked:
                S_ij = np.where(sched.mask(i, j), S_ij, -np.inf)

            # -- update m_i and l_i
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
            # A row with no visible key yet keeps m = -inf: use base 0 so exp(-inf) = 0, not NaN.
            m_base = np.where(m_new == -np.inf, 0.0, m_new)  # (B_r,)
            alpha = np.exp(m_i - m_base)  # (B_r,) moves the old state onto the new max
            P_ij = np.exp(S_ij - m_base[:, None])  # (B_r, B_c)
            l_new = alpha * l_i + P_ij.sum(axis=1)  # (B_r,)

            # -- O_i <- (l_i alpha / l_new) O_i + (1 / l_new) P_ij V_j; a row that saw no key stays 0
            P_ij = P_ij.astype(storage).astype(STATE_DTYPE)
            PV = compute.matmul(P_ij, V_j)  # (B_r, d)
            inv_l = np.divide(1.0, l_new, out=np.zeros_like(l_new), where=l_new > 0)  # (B_r,)
            O_new = (l_i * alpha * inv_l)[:, None] * O_i + inv_l[:, None] * PV  # (B_r, d)

            # -- write O_i, l_i, m_i back to HBM
            sram.store(hbm, "O", (h, rows), O_new)
            sram.store(hbm, "l", (h, rows), l_new)
            sram.store(hbm, "m", (h, rows), m_new)
            sram.free("Q_i", "O_i", "l_i", "m_i", "S_ij")
            compute.elementwise(exp=P_ij.size + B_r, fp32=4 * P_ij.size + 3 * B_r * d + 3 * B_r)
            yield trace.step(h, i, j, rows.start, masked, m_new, alpha, l_new, O_new) if trace.records(h, i) else None
        sram.free("K_j", "V_j")

    if write_logsumexp:
        # -- epilogue: the statistics are final only after the last KV tile, so read them back once
        for i in range(sched.n_q_tiles):
            rows = sched.q_rows(i)
            l_i = sram.load("l_i", hbm, "l", (h, rows))  # (B_r,)
            m_i = sram.load("m_i", hbm, "m", (h, rows))  # (B_r,)
            L_i = np.full(l_i.shape, -np.inf, dtype=STATE_DTYPE)  # (B_r,) logsumexp, for a backward pass
            np.log(l_i, out=L_i, where=l_i > 0)
            sram.store(hbm, "L", (h, rows), L_i + m_i)
            sram.free("l_i", "m_i")
