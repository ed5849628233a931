"""Naive attention: the explicit three-kernel materialising baseline.

    kernel 1 (GEMM):    S = Q K^T * scale      reads Q, K     writes S   (N x N, storage dtype)
    kernel 2 (softmax): P = softmax(S)         reads S        writes P   (N x N, storage dtype)
    kernel 3 (GEMM):    O = P V                reads P, V     writes O

Causal: kernels store and load only the permitted entries of S and P (the lower triangle); the
others are never stored, and the softmax treats them as -inf.
"""

from __future__ import annotations

import numpy as np

from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule


def naive_forward(gpu: SimulatedGPU, sched: TileSchedule, scale: float) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    # The whole (n_q, n_kv) schedule as one tile: True where query row r may see key c.
    permitted = sched.mask(0, 0) if sched.causal else None  # (n_q, n_kv) or None: all stored

    with hbm.kernel("gemm_qk"):
        Q = hbm.read("Q")  # (H, n_q, d)
        K = hbm.read("K")  # (H, n_kv, d)
        S = compute.matmul(Q, K.swapaxes(-1, -2)) * scale  # (H, n_q, n_kv)
        hbm.write_where("S", S, permitted)

    with hbm.kernel("softmax"):
        S = hbm.read_where("S", permitted, fill=-np.inf)  # (H, n_q, n_kv)
        m = S.max(axis=-1, keepdims=True)  # (H, n_q, 1)
        # A row with no visible key has m = -inf: exponentiate against 0 so exp(-inf) = 0, not NaN.
        P = np.exp(S - np.where(m == -np.inf, 0.0, m))  # (H, n_q, n_kv)
        l = P.sum(axis=-1, keepdims=True)  # noqa: E741  (H, n_q, 1)
        P /= np.where(l > 0, l, 1.0)  # such a row is all zeros: divide by 1 to keep it so
        hbm.write_where("P", P, permitted)

    with hbm.kernel("gemm_pv"):
        P = hbm.read_where("P", permitted, fill=0.0)  # (H, n_q, n_kv)
        V = hbm.read("V")  # (H, n_kv, d)
        O = compute.matmul(P, V)  # (H, n_q, d)
        hbm.write("O", (...,), O)
