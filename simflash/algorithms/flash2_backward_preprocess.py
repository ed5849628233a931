"""FlashAttention-2 backward, kernel 1 of 3: the preprocess (Dao 2023, Algorithm 2, lines 4-5).

    D = rowsum(dO o O)      reads O, dO (storage dtype)   writes D (float32)
    dQ_accum = 0            writes dQ_accum (float32): the main kernel's atomic adds land on it

D_i is what the softmax's Jacobian subtracts from every dP_ij of row i (rowsum(dP o P) = rowsum(dO o O)),
so the main kernel needs no second pass over the KV tiles to find it. One CTA per (head, query tile
of B_r rows), as FlashAttention-2's `flash_bwd_dot_do_o_kernel`.
"""

from __future__ import annotations

import numpy as np

from simflash.config import STATE_DTYPE
from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule

KERNEL = "flash2_backward_preprocess"


def flash2_backward_preprocess_cta(gpu: SimulatedGPU, sched: TileSchedule, h: int, i: int) -> None:
    """Query tile i of head h: D_i = rowsum(dO_i o O_i), and its rows of dQ_accum set to zero."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    rows = sched.q_rows(i)
    B_r, d = rows.stop - rows.start, hbm.shape("O")[-1]
    O_i = sram.load("O_i", hbm, "O", (h, rows))  # (B_r, d)
    dO_i = sram.load("dO_i", hbm, "dO", (h, rows))  # (B_r, d)
    D_i = (dO_i * O_i).sum(axis=1)  # (B_r,)
    compute.elementwise(fp32=2 * B_r * d)  # multiply, add
    sram.store(hbm, "D", (h, rows), D_i)
    sram.store(hbm, "dQ_accum", (h, rows), np.zeros((B_r, d), dtype=STATE_DTYPE))
    sram.free("O_i", "dO_i")
