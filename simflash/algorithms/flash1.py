"""FlashAttention-1 forward (Dao et al. 2022, Algorithm 1), line for line.

KV tiles outer, query tiles inner, one CTA per head. O, l and m live in HBM: they are initialised
there, and every visited (j, i) reads O_i, l_i, m_i back, folds K_j, V_j in and writes them out
again. Lines 10-12 of Algorithm 1, literally:

    m~_ij = rowmax(S_ij)              P~_ij = exp(S_ij - m~_ij)          l~_ij = rowsum(P~_ij)
    m_new = max(m_i, m~_ij)           l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
    O_i  <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)

so P~_ij is exponentiated against the tile's own max (FA-2 uses the running max), and the output
stays normalised: every step divides its B_r x d tile by l_new. Causal: (i, j) pairs past the skip
bound are never visited (a KV tile that no query tile visits is never loaded); tiles that straddle
the diagonal are masked before the statistics see their scores.

The running output O is kept in HBM in `o_accum_dtype`: "storage" (the paper: O has Q's dtype) or
"float32" (the released FA-1 kernel's float32 accumulator, twice the bytes per round trip), in
which case a last pass reads O once more and writes the output, rounded to the storage dtype, as
the tensor "out".

Ledger labels for what the released kernel skips (it knows which KV tile comes first): the
initialisation O = 0, l = 0, m = -inf of a query tile that will be visited is written to the
tensors "O (init)", "l (init)", "m (init)", and the first visited (j, i) of that query tile reads
these known values back from them; all later reads and every write of the running state use "O",
"l", "m". A query tile that no KV tile reaches keeps its initial values as its final state, so
those are written to "O", "l", "m" directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simflash.algorithms.online_softmax import exp_minus, masked_scores
from simflash.config import STATE_DTYPE
from simflash.grid import CTA, kv_head
from simflash.memory import HBM, SimulatedGPU
from simflash.numerics import round_to_storage
from simflash.schedule import TileSchedule
from simflash.trace import TileStep, TraceRequest

KERNEL = "flash1_forward"
O_ACCUM_DTYPES = ("storage", "float32")  # what the running O is kept in between KV tiles
INIT = " (init)"  # ledger suffix: the initialisation and its first read, which the released kernel skips


def flash1_grid(sched: TileSchedule, heads: int, longest_first: bool = False, group: int = 1) -> list[CTA]:
    """One CTA per head; its steps are the (j, i) pairs it visits. The heads of a K/V group form a cohort."""
    pairs = sum(len(sched.kv_range(i)) for i in range(sched.n_q_tiles))
    return [CTA((h,), pairs, (kv_head(h, group),)) for h in range(heads)]


def flash1_output(o_accum_dtype: str) -> str:
    """The HBM tensor that holds the finished output in the storage dtype."""
    return "out" if o_accum_dtype == "float32" else "O"


def flash1_allocate(hbm: HBM, o_accum_dtype: str) -> None:
    """The HBM tensors besides Q, K, V and O (allocated by the caller in the storage dtype)."""
    heads, n_q, d = hbm.shape("Q")
    if o_accum_dtype == "float32":
        hbm.allocate("out", (heads, n_q, d), hbm.inspect("O").dtype)
        hbm.allocate("O", (heads, n_q, d), STATE_DTYPE)
    hbm.allocate("O" + INIT, (heads, n_q, d), hbm.inspect("O").dtype)
    for name in ("l", "m", "l" + INIT, "m" + INIT):
        hbm.allocate(name, (heads, n_q), STATE_DTYPE)


def flash1_cta(
    gpu: SimulatedGPU,
    sched: TileSchedule,
    scale: float,
    trace: TraceRequest,
    cta: CTA,
    write_logsumexp: bool = False,
    o_accum_dtype: str = "storage",
) -> Iterator[TileStep | None]:
    """The work of one CTA: all of head h, KV tiles outer. Yields after every (j, i) pair."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    (h,) = cta.index
    h_kv = kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0])
    d = hbm.shape("Q")[-1]
    storage = hbm.inspect("Q").dtype  # P~_ij enters the second matmul in the storage dtype
    first_j = {i: sched.kv_tiles(i)[0] for i in range(sched.n_q_tiles) if sched.kv_tiles(i)}

    # -- initialise O = 0, l = 0, m = -inf in HBM (line 2)
    for i in range(sched.n_q_tiles):
        suffix = INIT if i in first_j else ""  # a tile never visited: these are its final values
        rows = sched.q_rows(i)
        hbm.write("O" + suffix, (h, rows), 0.0)  # (B_r, d)
        hbm.write("l" + suffix, (h, rows), 0.0)  # (B_r,)
        hbm.write("m" + suffix, (h, rows), -np.inf)  # (B_r,)

    for j in range(sched.n_kv_tiles):  # line 5
        q_tiles = [i for i in range(sched.n_q_tiles) if sched.tile_kind(i, j) != "skipped"]
        if not q_tiles:
            continue  # no query row sees a key of this tile (causal future, outside the window): never loaded
        cols = sched.kv_cols(j)
        K_j = sram.load("K_j", hbm, "K", (h_kv, cols))  # (B_c, d)  line 6
        V_j = sram.load("V_j", hbm, "V", (h_kv, cols))  # (B_c, d)

        for i in q_tiles:  # line 7
            rows = sched.q_rows(i)
            B_r = rows.stop - rows.start
            state = INIT if j == first_j[i] else ""  # the first visit reads the known initial values
            Q_i = sram.load("Q_i", hbm, "Q", (h, rows))  # (B_r, d)  line 8
            O_i = sram.load("O_i", hbm, "O" + state, (h, rows))  # (B_r, d) normalised output so far
            l_i = sram.load("l_i", hbm, "l" + state, (h, rows))  # (B_r,)
            m_i = sram.load("m_i", hbm, "m" + state, (h, rows))  # (B_r,)
            sram.alloc("S_ij", (B_r, cols.stop - cols.start), storage)

            # -- S_ij = tau Q_i K_j^T (line 9); mask the keys a row may not see before the statistics see them
            S_ij, masked = masked_scores(compute, Q_i, K_j, scale, sched, i, j)  # (B_r, B_c)

            # -- tile-local statistics (line 10); a row with no visible key in this tile has m~ = -inf
            m_tile = S_ij.max(axis=1)  # (B_r,) m~_ij
            P_tile = exp_minus(S_ij, m_tile)  # (B_r, B_c) P~_ij
            l_tile = P_tile.sum(axis=1)  # (B_r,) l~_ij

            # -- m_new, l_new and the two rescale factors (line 11)
            m_new = np.maximum(m_i, m_tile)  # (B_r,)
            alpha = exp_minus(m_i, m_new)  # (B_r,) e^(m_i - m_new): moves the old state onto m_new
            beta = exp_minus(m_tile, m_new)  # (B_r,) e^(m~_ij - m_new): moves this tile onto m_new
            l_scaled = l_i * alpha  # (B_r,) diag(l_i) e^(m_i - m_new)
            l_new = l_scaled + beta * l_tile  # (B_r,)

            # -- O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j) (line 12);
            #    P~_ij rounded to the storage dtype, as tensor cores take it; a row that saw no key stays 0
            PV = compute.matmul(round_to_storage(P_tile, storage), V_j)  # (B_r, d)
            numerator = l_scaled[:, None] * O_i + beta[:, None] * PV  # (B_r, d)
            O_new = np.divide(numerator, l_new[:, None], out=np.zeros_like(numerator), where=l_new[:, None] > 0)
            compute.elementwise(
                exp=P_tile.size + 2 * B_r,  # P~_ij, alpha, beta
                fp32=4 * P_tile.size  # scale S, rowmax, S - m~, rowsum
                + 6 * B_r  # m_new, the two differences, l_i alpha, beta l~, the sum
                + 3 * B_r * d,  # (l_i alpha) O_i, beta PV, their sum
                div=B_r * d,  # diag(l_new)^-1 applied to the (B_r, d) tile
            )

            # -- write O_i, l_i, m_i back to HBM (line 13)
            sram.store(hbm, "O", (h, rows), O_new)
            sram.store(hbm, "l", (h, rows), l_new)
            sram.store(hbm, "m", (h, rows), m_new)
            sram.free("Q_i", "O_i", "l_i", "m_i", "S_ij")
            if trace.records(h, i):
                yield trace.step(h, i, j, rows.start, masked, m_new, alpha, l_new, O_new,
                                 m_tile=m_tile, l_tile=l_tile, beta=beta)
            else:
                yield None
        sram.free("K_j", "V_j")

    if o_accum_dtype == "float32":
        # -- epilogue: the float32 running O, read once more and written out in the storage dtype
        for i in range(sched.n_q_tiles):
            rows = sched.q_rows(i)
            O_i = sram.load("O_i", hbm, "O", (h, rows))  # (B_r, d) float32
            sram.store(hbm, "out", (h, rows), O_i)  # rounded to the storage dtype
            sram.free("O_i")

    if write_logsumexp:
        # -- epilogue: the statistics are final only after the last KV tile, so read them back once
        for i in range(sched.n_q_tiles):
            rows = sched.q_rows(i)
            l_i = sram.load("l_i", hbm, "l", (h, rows))  # (B_r,)
            m_i = sram.load("m_i", hbm, "m", (h, rows))  # (B_r,)
            # (B_r,) logsumexp, for a backward pass; +inf for a row that saw no key, so exp(S - L) = 0 there
            L_i = np.full(l_i.shape, np.inf, dtype=STATE_DTYPE)
            np.add(np.log(l_i, where=l_i > 0, out=np.zeros_like(l_i)), m_i, out=L_i, where=l_i > 0)
            sram.store(hbm, "L", (h, rows), L_i)
            sram.free("l_i", "m_i")
