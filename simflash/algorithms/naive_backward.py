"""Naive backward: five kernels over the P its forward kept in HBM (training retention), as an eager
framework runs the backward of S = Q K^T scale, P = softmax(S), O = P V:

    kernel 1 (GEMM):             dV = P^T dO                    reads P, dO     writes dV
    kernel 2 (GEMM):             dP = dO V^T                    reads dO, V     writes dP  (N x N)
    kernel 3 (softmax backward): dS = P o (dP - rowsum(dP o P)) reads P, dP     writes dS  (N x N)
    kernel 4 (GEMM):             dQ = scale dS K                reads dS, K     writes dQ
    kernel 5 (GEMM):             dK = scale dS^T Q              reads dS, Q     writes dK

P is read twice, and dP and dS make a round trip each: the quadratic traffic FlashAttention's
backward recomputes its way out of. Every matrix is stored in the storage dtype; the GEMMs and the
softmax backward compute in float32, as a library does. Causal or windowed: P, dP and dS hold only
the entries a row may see (the others are 0 and never stored), as the forward stores S and P.
Grouped-query heads: each query head's GEMMs read its group's K and V, as through a broadcast view,
and gemm_dv, gemm_dk write each query head's dV, dK (to dV_expanded, dK_expanded); the backward of
the broadcast, kernel "gqa_sum" (simflash.algorithms.gqa_sum), adds each group's up. One CTA per
query head, each reading whole operands (simflash does not model a library kernel's tiles).
"""

from __future__ import annotations

import numpy as np

from simflash.algorithms.gqa_sum import per_query_head
from simflash.grid import kv_head
from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule

KERNELS = ("gemm_dv", "gemm_dp", "softmax_backward", "gemm_dq", "gemm_dk")


def _permitted(sched: TileSchedule) -> np.ndarray | None:
    """(n_q, n_kv): True where a row may see the key (what P, dP and dS store); None: everywhere."""
    return sched.mask(0, 0) if sched.masks else None


def gemm_dv_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, h: int) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    P = hbm.read_where("P", _permitted(sched), fill=0.0, index=(h,))  # (n_q, n_kv)
    dO = hbm.read("dO", (h,))  # (n_q, d)
    hbm.write(per_query_head(hbm, "dV"), (h,), compute.matmul(P.T, dO))  # (n_kv, d)


def gemm_dp_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, h: int) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    dO = hbm.read("dO", (h,))  # (n_q, d)
    V = hbm.read("V", (_kv_head(hbm, h),))  # (n_kv, d) its group's V
    hbm.write_where("dP", compute.matmul(dO, V.T), _permitted(sched), index=(h,))  # (n_q, n_kv)


def softmax_backward_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, h: int) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    stored = _permitted(sched)
    P = hbm.read_where("P", stored, fill=0.0, index=(h,))  # (n_q, n_kv)
    dP = hbm.read_where("dP", stored, fill=0.0, index=(h,))  # (n_q, n_kv)
    D = (dP * P).sum(axis=1, keepdims=True)  # (n_q, 1) the Jacobian's row term
    dS = P * (dP - D)  # (n_q, n_kv)
    compute.elementwise(fp32=4 * dS.size)  # dP o P, its row sum, dP - D, the product with P
    hbm.write_where("dS", dS, stored, index=(h,))


def gemm_dq_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, h: int) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    dS = hbm.read_where("dS", _permitted(sched), fill=0.0, index=(h,))  # (n_q, n_kv)
    K = hbm.read("K", (_kv_head(hbm, h),))  # (n_kv, d) its group's K
    dQ = scale * compute.matmul(dS, K)  # (n_q, d)
    compute.elementwise(fp32=dQ.size)  # the scale, in the GEMM's epilogue
    hbm.write("dQ", (h,), dQ)


def gemm_dk_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, h: int) -> None:
    hbm, compute = gpu.hbm, gpu.compute
    dS = hbm.read_where("dS", _permitted(sched), fill=0.0, index=(h,))  # (n_q, n_kv)
    Q = hbm.read("Q", (h,))  # (n_q, d)
    dK_h = scale * compute.matmul(dS.T, Q)  # (n_kv, d)
    compute.elementwise(fp32=dK_h.size)  # the scale, in the GEMM's epilogue
    hbm.write(per_query_head(hbm, "dK"), (h,), dK_h)


def _kv_head(hbm, h: int) -> int:
    """The K/V head query head h reads."""
    return kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0])


NAIVE_BACKWARD_CTAS = {"gemm_dv": gemm_dv_cta, "gemm_dp": gemm_dp_cta, "softmax_backward": softmax_backward_cta,
                       "gemm_dq": gemm_dq_cta, "gemm_dk": gemm_dk_cta}
