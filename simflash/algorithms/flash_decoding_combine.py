"""Flash-Decoding, kernel 2 of 2: the combine kernel, a logsumexp over the splits' partial results.

Split s left, for every row, O_s (its output normalised by its own sum l_s) and LSE_s = m_s + log l_s.
The row's full softmax sum is sum_s l_s exp(m_s) = sum_s exp(LSE_s), so

    LSE = log sum_s exp(LSE_s)       computed as lse_max + log sum_s exp(LSE_s - lse_max)
    w_s = exp(LSE_s - LSE)           split s's share of the row's probability mass
    O   = sum_s w_s O_s              written once, in the storage dtype

A split that saw no key of a row (LSE_s = -inf) gets w_s = 0; a row that no split saw (every LSE_s =
-inf: lse_max is taken as 0, the sum is 0, LSE = +inf) gets every w_s = 0 and outputs 0, never NaN.

How this relates to FlashAttention-2's combine_attn_seqk_parallel (csrc/flash_attn/src/flash_fwd_kernel.h):
the same grid (one CTA per `block_rows` consecutive rows of the flattened batch x heads x rows, kBlockM
= 4, 8 or 16 by head dim) and the same reads: every split's LSE_partial for the CTA's rows, into shared
memory (its sLSE), reduced to lse_max, the sum and the weights; then every split's O_partial rows in turn,
scaled and summed in registers, zero weights included (it loads all num_splits). Two differences: FA-2
pads each O_partial row to d_rounded (a multiple of 32 or 64) where simflash's hold exactly d floats, and
FA-2 also writes the final LSE (softmax_lse, returned to its caller), which simflash keeps on chip.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import numpy as np

from simflash.config import STATE_DTYPE
from simflash.grid import CTA
from simflash.memory import SimulatedGPU

KERNEL = "flash_decoding_combine"


@attrs.frozen(eq=False)
class CombineWeights:
    """What a combine CTA records for a trace: the weights w_s = exp(LSE_s - LSE) of its rows."""

    row_start: int
    weights: np.ndarray  # (splits, rows)


def combine_grid(n_rows: int, block_rows: int, num_splits: int) -> list[CTA]:
    """One CTA per `block_rows` consecutive rows of the n_rows output rows, in order; one step per split."""
    return [CTA((c,), num_splits, (c,)) for c in range(-(-n_rows // block_rows))]


def combine_cta(gpu: SimulatedGPU, block_rows: int, cta: CTA, record: bool) -> Iterator[CombineWeights | None]:
    """The work of one CTA: rows c x block_rows onwards. Yields after every split's O_partial (the first
    yield carries the weights when `record`)."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    (c,) = cta.index
    num_splits, n_rows, d = hbm.shape("O_partial")
    rows = slice(c * block_rows, min((c + 1) * block_rows, n_rows))
    B = rows.stop - rows.start

    # -- every split's logsumexp of these rows, into shared memory
    LSE_s = sram.load("LSE_s", hbm, "LSE_partial", (slice(None), rows))  # (splits, B)
    lse_max = LSE_s.max(axis=0)  # (B,)
    lse_max[lse_max == -np.inf] = 0.0  # a row no split saw: exp(-inf - 0) = 0, not NaN
    lse_sum = np.exp(LSE_s - lse_max).sum(axis=0)  # (B,)
    LSE = np.full(B, np.inf, dtype=STATE_DTYPE)  # (B,) +inf where the sum is 0, so every weight is 0
    seen = lse_sum > 0
    LSE[seen] = np.log(lse_sum[seen]) + lse_max[seen]
    w = np.exp(LSE_s - LSE)  # (splits, B)
    # max, subtract, exp, sum over the splits; log, add per row; subtract, exp for the weights
    compute.elementwise(exp=2 * LSE_s.size + B, fp32=4 * LSE_s.size + B)

    # -- stream every split's partial output, scaled by its weight, into the accumulator
    O = sram.state("O_acc", (B, d), 0.0)  # (B, d)
    for s in range(num_splits):
        O_s = sram.load("O_s", hbm, "O_partial", (s, rows))  # (B, d)
        O = O + w[s][:, None] * O_s
        compute.elementwise(fp32=2 * O_s.size)  # multiply, add
        sram.free("O_s")
        yield CombineWeights(rows.start, w) if record and s == 0 else None

    # -- the output, once, in the storage dtype
    sram.store(hbm, "O", rows, O)
    sram.free("LSE_s", "O_acc")
