"""FlashAttention-2 backward, kernel 3 of 3: the convert.

    dQ = dQ_accum           reads dQ_accum (float32)   writes dQ (storage dtype)

The main kernel's CTAs, one per KV tile, all add into dQ_i; only once every one of them is done is
dQ_i final, so the rounding to the storage dtype waits for a kernel of its own. One CTA per (head,
query tile of B_r rows), as FlashAttention-2's `flash_bwd_convert_dq_kernel`.
"""

from __future__ import annotations

from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule

KERNEL = "flash2_backward_convert"


def flash2_backward_convert_cta(gpu: SimulatedGPU, sched: TileSchedule, h: int, i: int) -> None:
    """Query tile i of head h: dQ_i, rounded to the storage dtype as it is written."""
    hbm, sram = gpu.hbm, gpu.sram
    rows = sched.q_rows(i)
    dQ_i = sram.load("dQ_accum_i", hbm, "dQ_accum", (h, rows))  # (B_r, d) float32
    sram.store(hbm, "dQ", (h, rows), dQ_i)
    sram.free("dQ_accum_i")
