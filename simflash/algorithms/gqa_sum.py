"""The backward with grouped-query heads: dK and dV summed over each group.

Every query head h of a group reads the same K/V head g, so dK_g is the sum over the group of what
each query head's keys received (and dV_g likewise). Neither backward adds across heads inside its
matmuls: each writes every query head's dK, dV into buffers of H_q heads in the storage dtype, and a
reduction sums them over the group:

    dK = sum over the group of dK_expanded     reads dK_expanded (H_q heads)   writes dK (H_kv heads)
    dV = sum over the group of dV_expanded     reads dV_expanded               writes dV

FlashAttention-2 does this on the host after its kernels: `mha_bwd` (csrc/flash_attn/flash_api.cpp)
allocates `dk_expanded`, `dv_expanded` with num_heads heads and calls `at::sum_out` over the group.
An eager framework does the same when K is broadcast over the group (`expand`): the backward of the
broadcast is a sum. A library reduction, one CTA per K/V head; the sum runs in float32, rounded once.
"""

from __future__ import annotations

from simflash.memory import SimulatedGPU


def per_query_head(hbm, gradient: str) -> str:
    """The tensor a query head writes its `gradient` ("dK" or "dV") to: itself, or "<gradient>_expanded"
    when K/V heads are shared by groups of query heads."""
    return gradient if hbm.shape("Q")[0] == hbm.shape("K")[0] else f"{gradient}_expanded"


def gqa_sum_cta(gpu: SimulatedGPU, g: int) -> None:
    """K/V head g: dK_g and dV_g, each the sum of its group's query heads' expanded gradients."""
    hbm, compute = gpu.hbm, gpu.compute
    group = hbm.shape("dK_expanded")[0] // hbm.shape("dK")[0]
    heads = slice(g * group, (g + 1) * group)  # the query heads h with h // group == g
    for expanded, summed in (("dK_expanded", "dK"), ("dV_expanded", "dV")):
        per_head = hbm.read(expanded, (heads,))  # (group, n_kv, d)
        compute.elementwise(fp32=(group - 1) * per_head[0].size)
        hbm.write(summed, (g,), per_head.sum(axis=0))
