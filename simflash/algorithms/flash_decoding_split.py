"""Flash-Decoding, kernel 1 of 2: the split kernel (Dao, Haziza, Massa, Sizov 2023; FlashAttention-2's
flash_fwd_splitkv_kernel, compute_attn_1rowblock_splitkv in csrc/flash_attn/src/flash_fwd_kernel.h).

Decoding brings one new query row per head (T_r = 1), so FA-2's grid (query tiles x batch x heads)
leaves most SMs idle while one CTA per head streams the whole KV cache. The split kernel adds a grid
axis along the sequence that is long, the keys: CTA (z, s, i) runs FA-2's online softmax for query
tile i of batch-head z over split s's run of KV tiles only, and writes a partial result that the
combine kernel (flash_decoding_combine.py) merges:

    O_s   = a_s / l_s        (normalised by the split's own sum, float32)
    LSE_s = m_s + log l_s    (the split's logsumexp, float32; -inf for a row that saw no key here)

With one split the CTA's result is final: it writes O in the storage dtype and there is no combine
(FA-2's template parameter Split = false).

`split_grid` lists the CTAs in launch order; `split_cta` is the work of one CTA.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simflash.algorithms.flash2 import fold_kv_tiles, release_tiles
from simflash.config import STATE_DTYPE
from simflash.grid import CTA, kv_head
from simflash.memory import SimulatedGPU
from simflash.onchip import DEFAULT_KV_STAGES
from simflash.schedule import SplitSchedule
from simflash.trace import TileStep, TraceRequest

KERNEL = "flash_decoding_split"


def split_grid(sched: SplitSchedule, heads_per_batch: int, group: int) -> list[CTA]:
    """One CTA per (query tile, split, batch x head), in launch order: blockIdx.x = query tile fastest,
    then .y = split, then .z = batch x head (z = b x heads_per_batch + h), FA-2's split-KV grid. heads are
    packed groups or query heads; group: query heads per K/V head (1 when packed)."""
    ctas = []
    for z in range(len(sched.cache_seqlens) * heads_per_batch):
        for s in range(sched.num_splits):
            for i in range(sched.n_q_tiles):
                tiles = sched.split_tiles(z // heads_per_batch, i, s)
                ctas.append(CTA((z, s, i), len(tiles), (kv_head(z, group), tiles.start)))
    return ctas


def split_cta(
    gpu: SimulatedGPU,
    sched: SplitSchedule,
    scale: float,
    trace: TraceRequest,
    cta: CTA,
    heads_per_batch: int,
    kv_stages: int = DEFAULT_KV_STAGES,
) -> Iterator[TileStep | None]:
    """The work of one CTA: query tile i of batch-head z against split s's KV tiles. Yields after every
    KV tile. Its rows of O (and of O_partial, LSE_partial) are z x rows per head + the tile's rows."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    z, s, i = cta.index
    tiling = sched.of_batch(z // heads_per_batch)  # this batch element's keys, bottom-right aligned
    h_kv = kv_head(z, hbm.shape("Q")[0] // hbm.shape("K")[0])
    d = hbm.shape("Q")[-1]
    rows = tiling.q_rows(i)
    B_r = rows.stop - rows.start
    out = slice(z * tiling.n_rows + rows.start, z * tiling.n_rows + rows.stop)
    partial = sched.num_splits > 1  # FA-2's Split: partials for the combine, or the final O
    kv_tiles = sched.split_tiles(z // heads_per_batch, i, s)
    if not kv_tiles:
        # -- nothing to visit in this split (its tiles lie past the cache's length or outside the rows'
        # keys): exit without loading Q_i; O_s = 0 and LSE_s = -inf give the split no weight in the combine
        if partial:
            sram.store(hbm, "O_partial", (s, out), np.zeros((B_r, d), dtype=STATE_DTYPE))
            sram.store(hbm, "LSE_partial", (s, out), np.full(B_r, -np.inf, dtype=STATE_DTYPE))
        else:
            sram.store(hbm, "O", out, np.zeros((B_r, d), dtype=STATE_DTYPE))
        return
    Q_i = sram.load("Q_i", hbm, "Q", (z, rows))  # (B_r, d)
    m_i, l_i, a_i = yield from fold_kv_tiles(gpu, tiling, scale, trace, Q_i, kv_tiles, (z, i), h_kv, kv_stages,
                                             split=s)

    # -- normalise by the split's own sum; a row that saw no key in this split outputs 0
    seen = l_i > 0  # (B_r,)
    O_i = np.divide(a_i, l_i[:, None], out=np.zeros_like(a_i), where=seen[:, None])  # (B_r, d)
    compute.elementwise(div=B_r * d)
    if partial:
        # -- the split's logsumexp, for the combine's weights
        LSE_i = np.full(B_r, -np.inf, dtype=STATE_DTYPE)  # (B_r,)
        LSE_i[seen] = m_i[seen] + np.log(l_i[seen])
        compute.elementwise(exp=B_r, fp32=B_r)  # a logarithm (special-function unit, as exp) and an add per row
        sram.store(hbm, "O_partial", (s, out), O_i)
        sram.store(hbm, "LSE_partial", (s, out), LSE_i)
    else:
        sram.store(hbm, "O", out, O_i)
    release_tiles(sram, len(kv_tiles), kv_stages)
