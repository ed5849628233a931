"""Naive attention: the explicit three-kernel materialising baseline.

    kernel 1 (GEMM):    S = Q K^T * scale      reads Q, K     writes S   (N x N, storage dtype)
    kernel 2 (softmax): P = softmax(S)         reads S        writes P   (N x N, storage dtype)
    kernel 3 (GEMM):    O = P V                reads P, V     writes O

Each kernel's work is split into one CTA per head that streams its rows in blocks of `block_rows`
(a block of S about NAIVE_BLOCK_BYTES), reading each operand once, as the logical model counts it:
the order in which an L2 sees S and P go by. (cuBLAS and a softmax tile the work differently; what the
L2 sees of it is a stream of rows, head after head.) One thing of cuBLAS's tiling the L2 does see: the
P V GEMM's CTAs each write their tile of O as they end, so a wave's O arrives after all of the wave's
P has streamed by. The P V kernel's CTAs hold their rows of O until a wave's worth of rows (`wave_rows`)
is done, and the chip runs as many heads side by side as a wave holds.

Causal or windowed: kernels store and load only the permitted entries of S and P (the lower triangle,
the band); the others are never stored, and the softmax treats them as -inf. Grouped-query heads: each
query head's GEMMs read its group's K and V.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from simflash.config import KiB
from simflash.grid import CTA, Access, CTAProgram, block_key, kv_head
from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule

KERNELS = ("gemm_qk", "softmax", "gemm_pv")
NAIVE_BLOCK_BYTES = 256 * KiB  # rows of S streamed per step
GEMM_TILE_ROWS = 256  # rows of O per CTA of cuBLAS's P V GEMM (its H200 tile: nvjet_sm90_hsh_128x256)


def block_rows(n_kv: int, itemsize: int) -> int:
    """Rows of S per streamed block: about NAIVE_BLOCK_BYTES, a power of two no larger than GEMM_TILE_ROWS
    (so that a wave of the P V GEMM's tiles ends at the end of a block)."""
    rows = max(1, NAIVE_BLOCK_BYTES // (n_kv * itemsize))
    return min(GEMM_TILE_ROWS, 1 << (rows.bit_length() - 1))


def naive_grid(sched: TileSchedule, heads: int, itemsize: int) -> list[CTA]:
    """One CTA per head, one step per block of rows (the same grid for all three kernels)."""
    steps = -(-sched.n_q // block_rows(sched.n_kv, itemsize))
    return [CTA((h,), steps, (h,)) for h in range(heads)]


def _row_blocks(sched: TileSchedule, itemsize: int) -> list[slice]:
    rows = block_rows(sched.n_kv, itemsize)
    return [slice(r, min(r + rows, sched.n_q)) for r in range(0, sched.n_q, rows)]


def gemm_qk_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA) -> Iterator[None]:
    hbm, compute = gpu.hbm, gpu.compute
    (h,) = cta.index
    permitted = sched.mask(0, 0) if sched.masks else None  # (n_q, n_kv): True where row r may see key c
    K = hbm.read("K", (kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0]),))  # (n_kv, d) its group's K
    for rows in _row_blocks(sched, hbm.itemsize("S")):
        Q_r = hbm.read("Q", (h, rows))  # (rows, d)
        S_r = compute.matmul(Q_r, K.T) * scale  # (rows, n_kv)
        compute.elementwise(fp32=S_r.size)  # the scale, in the GEMM's epilogue
        hbm.write_where("S", S_r, None if permitted is None else permitted[rows], index=(h, rows))
        yield None


def softmax_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA) -> Iterator[None]:
    hbm, compute = gpu.hbm, gpu.compute
    (h,) = cta.index
    permitted = sched.mask(0, 0) if sched.masks else None
    for rows in _row_blocks(sched, hbm.itemsize("S")):
        stored = None if permitted is None else permitted[rows]
        S_r = hbm.read_where("S", stored, fill=-np.inf, index=(h, rows))  # (rows, n_kv)
        m = S_r.max(axis=-1, keepdims=True)  # (rows, 1)
        # A row with no visible key has m = -inf: exponentiate against 0 so exp(-inf) = 0, not NaN.
        P_r = np.exp(S_r - np.where(m == -np.inf, 0.0, m))  # (rows, n_kv)
        l = P_r.sum(axis=-1, keepdims=True)  # (rows, 1)
        P_r /= np.where(l > 0, l, 1.0)  # such a row is all zeros: divide by 1 to keep it so
        compute.elementwise(exp=P_r.size, fp32=3 * P_r.size, div=P_r.size)  # max, subtract, sum; exp; divide
        hbm.write_where("P", P_r, stored, index=(h, rows))
        yield None


def gemm_pv_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA, wave_rows: int) -> Iterator[None]:
    hbm, compute = gpu.hbm, gpu.compute
    (h,) = cta.index
    permitted = sched.mask(0, 0) if sched.masks else None
    V = hbm.read("V", (kv_head(h, hbm.shape("Q")[0] // hbm.shape("V")[0]),))  # (n_kv, d) its group's V
    blocks = _row_blocks(sched, hbm.itemsize("P"))
    waves = _waves_ending(sched, blocks, wave_rows)
    done: dict[int, np.ndarray] = {}  # rows of O computed, not yet written, by first row
    for t, rows in enumerate(blocks):
        P_r = hbm.read_where("P", None if permitted is None else permitted[rows], fill=0.0, index=(h, rows))
        done[rows.start] = compute.matmul(P_r, V)  # (rows, d)
        for written in waves.get(t, ()):  # the wave's CTAs end: their tiles of O go out
            hbm.write("O", (h, written), done.pop(written.start))
        yield None


def gemm_pv_heads_at_once(sched: TileSchedule, wave_rows: int) -> int:
    """Heads of the P V GEMM a wave holds side by side (at least one)."""
    tiles_per_head = -(-sched.n_q // GEMM_TILE_ROWS)
    return max(1, wave_rows // GEMM_TILE_ROWS // tiles_per_head)


def concurrent_heads(kernel: str, sched: TileSchedule, wave_rows: int) -> int:
    """Heads whose CTAs run side by side in `kernel`: one at a time, but as many P V GEMM heads as a wave
    holds."""
    return gemm_pv_heads_at_once(sched, wave_rows) if kernel == "gemm_pv" else 1


NAIVE_CTAS: dict[str, Callable[..., Iterator[None]]] = {"gemm_qk": gemm_qk_cta, "softmax": softmax_cta,
                                                     "gemm_pv": gemm_pv_cta}


def naive_program(kernel: str, sched: TileSchedule, cta: CTA, d: int, itemsize: int, wave_rows: int,
                  group: int = 1) -> CTAProgram:
    """The transfers of kernel `kernel`'s CTA without values (same blocks, same order)."""
    (h,) = cta.index
    h_kv = kv_head(h, group)
    blocks = _row_blocks(sched, itemsize)
    row_entries = stored_per_row(sched)

    def score_bytes(rows: slice) -> int:
        return int(row_entries[rows].sum()) * itemsize

    def rows_bytes(rows: slice) -> int:
        return (rows.stop - rows.start) * d * itemsize

    whole = slice(0, None)
    if kernel == "gemm_qk":
        return CTAProgram(cta, lambda t: (Access(block_key("Q", h, blocks[t]), rows_bytes(blocks[t])),
                                          Access(block_key("S", h, blocks[t]), score_bytes(blocks[t]), True)),
                          prologue=(Access(block_key("K", h_kv, whole), sched.n_kv * d * itemsize),))
    if kernel == "softmax":
        return CTAProgram(cta, lambda t: (Access(block_key("S", h, blocks[t]), score_bytes(blocks[t])),
                                          Access(block_key("P", h, blocks[t]), score_bytes(blocks[t]), True)))
    waves = _waves_ending(sched, blocks, wave_rows)

    def pv_step(t: int) -> tuple[Access, ...]:
        return (Access(block_key("P", h, blocks[t]), score_bytes(blocks[t])),
                *(Access(block_key("O", h, b), rows_bytes(b), True) for b in waves.get(t, ())))

    return CTAProgram(cta, pv_step, prologue=(Access(block_key("V", h_kv, whole), sched.n_kv * d * itemsize),))


def _waves_ending(sched: TileSchedule, blocks: list[slice], wave_rows: int) -> dict[int, list[slice]]:
    """{t: the blocks of the wave that block t ends}, for the blocks that end a wave."""
    ends: dict[int, list[slice]] = {}
    wave: list[slice] = []
    for t, rows in enumerate(blocks):
        wave.append(rows)
        if rows.stop % wave_rows == 0 or rows.stop == sched.n_q:
            ends[t], wave = wave, []
    return ends


def stored_per_row(sched: TileSchedule) -> np.ndarray:
    """Entries of S (and P) each query row stores: all n_kv, or (causal, windowed) the visible ones."""
    diagonal = np.arange(sched.n_q) + sched.diagonal_offset  # (n_q,)
    last = np.full(sched.n_q, sched.n_kv - 1) if sched.right is None else diagonal + sched.right
    first = np.zeros(sched.n_q, dtype=np.int64) if sched.left is None else diagonal - sched.left
    return np.clip(last + 1, 0, sched.n_kv) - np.clip(first, 0, sched.n_kv)
