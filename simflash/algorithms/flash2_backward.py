"""FlashAttention-2 backward, kernel 2 of 3: dK, dV and the atomic adds to dQ (Dao 2023, Algorithm 2).

KV tiles outer (one CTA each, "for 1 <= j <= T_c"), query tiles inner. S and P are never read from
HBM: P_ij = exp(S_ij - L_i) is recomputed from Q_i, K_j and the forward's logsumexp L, which turns the
forward's running max and sum into one subtraction. Then, on chip:

    dV_j += P_ij^T dO_i          dP_ij = dO_i V_j^T          dS_ij = P_ij o (dP_ij - D_i)
    dQ_i += scale dS_ij K_j      dK_j += scale dS_ij^T Q_i

dK_j and dV_j stay in float32 registers until the last query tile, then go to HBM once. dQ_i is
shared by every KV tile's CTA: Algorithm 2 (line 16) loads dQ_i from HBM, adds, and writes it back
for every (j, i); the shipped kernel sends its float32 addend by atomic adds instead, which the L2
resolves, so the ledger counts a write of the addend and no read. The preprocess kernel zeroed
dQ_accum; the convert kernel rounds it to dQ. Algorithm 2 also loads O_i for every (j, i); D_i,
computed once by the preprocess, is all the main kernel needs of it.

Causal or windowed: a KV tile loads only the query tiles whose rows see one of its keys
(`TileSchedule.q_tiles(j)`), and masks the tiles the diagonal or the window's edge cuts. A KV tile
no query tile visits writes dK_j = dV_j = 0 without loading K_j, V_j. A row that saw no key has
L_i = +inf, so its P_ij = exp(-inf) = 0 and it adds nothing. Grouped-query heads: the CTA of query
head h reads K/V head h // group and writes its own head's dK_j, dV_j (into dK_expanded,
dV_expanded); the kernel flash2_backward_gqa_sum (simflash.algorithms.gqa_sum) adds the group's up.

The scale: dK_j accumulates dS_ij^T Q_i and is scaled once before it is written (as the shipped
kernel does); dQ's addend carries its scale, so dQ_accum holds dQ itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simflash.algorithms.gqa_sum import per_query_head
from simflash.algorithms.online_softmax import masked_scores
from simflash.config import STATE_DTYPE
from simflash.grid import kv_head
from simflash.memory import SimulatedGPU
from simflash.numerics import round_to_storage
from simflash.schedule import TileSchedule
from simflash.trace_backward_step import BackwardStep

KERNEL = "flash2_backward"


def _row_norms(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x, axis=1).astype(STATE_DTYPE)


def flash2_backward_cta(
    gpu: SimulatedGPU, sched: TileSchedule, scale: float, trace: str, h: int, j: int,
) -> Iterator[BackwardStep | None]:
    """The work of one CTA: KV tile j of query head h against the query tiles that visit it. Yields
    after every query tile (a BackwardStep when trace is "stats" or "full")."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    h_kv = kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0])
    d = hbm.shape("Q")[-1]
    storage = hbm.inspect("Q").dtype  # P_ij and dS_ij enter their matmuls in the storage dtype
    dK, dV = per_query_head(hbm, "dK"), per_query_head(hbm, "dV")  # dK_expanded, dV_expanded if grouped
    cols = sched.kv_cols(j)
    B_c = cols.stop - cols.start
    q_tiles = sched.q_tiles(j)  # causal, windowed: the query tiles whose rows see a key of tile j
    if not q_tiles:
        # -- no query row sees these keys: their gradients are 0, and K_j, V_j are never loaded
        sram.store(hbm, dK, (h, cols), np.zeros((B_c, d), dtype=STATE_DTYPE))
        sram.store(hbm, dV, (h, cols), np.zeros((B_c, d), dtype=STATE_DTYPE))
        return
    K_j = sram.load("K_j", hbm, "K", (h_kv, cols))  # (B_c, d)
    V_j = sram.load("V_j", hbm, "V", (h_kv, cols))  # (B_c, d)
    dK_j = sram.state("dK_j", (B_c, d), 0.0)  # dS^T Q summed over query tiles (scaled at the end)
    dV_j = sram.state("dV_j", (B_c, d), 0.0)  # P^T dO summed over query tiles

    for i in q_tiles:
        rows = sched.q_rows(i)
        B_r = rows.stop - rows.start
        Q_i = sram.load("Q_i", hbm, "Q", (h, rows))  # (B_r, d)
        dO_i = sram.load("dO_i", hbm, "dO", (h, rows))  # (B_r, d)
        L_i = sram.load("L_i", hbm, "L", (h, rows))  # (B_r,) float32
        D_i = sram.load("D_i", hbm, "D", (h, rows))  # (B_r,) float32
        sram.registers.hold("S_ij", B_r * B_c * STATE_DTYPE.itemsize)  # P_ij overwrites it
        sram.registers.hold("dP_ij", B_r * B_c * STATE_DTYPE.itemsize)  # dS_ij overwrites it
        sram.alloc("P_ij", (B_r, B_c), storage)  # the transposed matmuls read P_ij, dS_ij from shared memory
        sram.alloc("dS_ij", (B_r, B_c), storage)

        # -- recompute P from the logsumexp: masked scores are -inf, so their P is 0
        S_ij, masked = masked_scores(compute, Q_i, K_j, scale, sched, i, j)  # (B_r, B_c)
        P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c)
        compute.elementwise(exp=P_ij.size, fp32=2 * P_ij.size)  # scale, subtract L

        # -- dV_j += P_ij^T dO_i
        dV_j += compute.matmul(round_to_storage(P_ij, storage).T, dO_i)  # (B_c, d)

        # -- dS_ij = P_ij o (dP_ij - D_i): the softmax's Jacobian applied to dP_ij
        dP_ij = compute.matmul(dO_i, V_j.T)  # (B_r, B_c)
        dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
        compute.elementwise(fp32=2 * dS_ij.size)
        dS_ij = round_to_storage(dS_ij, storage)

        # -- dQ_i += scale dS_ij K_j, by atomic adds into float32 dQ_accum
        sram.registers.hold("dQ_ij", B_r * d * STATE_DTYPE.itemsize)
        dQ_ij = scale * compute.matmul(dS_ij, K_j)  # (B_r, d)
        compute.elementwise(fp32=dQ_ij.size)
        hbm.atomic_add("dQ_accum", (h, rows), dQ_ij)

        # -- dK_j += dS_ij^T Q_i
        dK_j += compute.matmul(dS_ij.T, Q_i)  # (B_c, d)
        sram.free("Q_i", "dO_i", "L_i", "D_i", "S_ij", "dP_ij", "P_ij", "dS_ij", "dQ_ij")
        yield None if trace == "none" else BackwardStep(
            h, j, i, cols.start, rows.start, masked, L_i, D_i, P_ij.sum(axis=1), _row_norms(dQ_ij),
            _row_norms(scale * dK_j), _row_norms(dV_j),
            *((P_ij, dS_ij, scale * dK_j, dV_j.copy()) if trace == "full" else ()))

    # -- the scale dK_j has waited for, then dK_j, dV_j to HBM once
    dK_j *= scale
    compute.elementwise(fp32=dK_j.size)
    sram.store(hbm, dK, (h, cols), dK_j)
    sram.store(hbm, dV, (h, cols), dV_j)
    sram.free("K_j", "V_j", "dK_j", "dV_j")
