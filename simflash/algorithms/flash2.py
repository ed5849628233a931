"""FlashAttention-2 forward (Dao 2023, Algorithm 1).

Query tiles outer (one CTA each, "for each i, in parallel"), KV tiles inner. The accumulator a_i
stays unnormalised; the one division happens after the last KV tile. Causal or windowed: KV tiles
outside the skip bounds are never loaded; tiles the diagonal or the window's edge cuts are masked
before the running max and sum see their scores. Grouped-query heads: a CTA reads the K/V head of
its query head's group (or, packed, of the group whose rows its tile holds).

`flash2_cta` is the work of one CTA; the grid runner (simflash.grid) decides which CTAs run when.
`flash2_program` lists the same CTA's transfers without values, for traffic-only runs.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterable, Iterator

import numpy as np

from simflash.algorithms.online_softmax import exp_base, masked_scores
from simflash.config import STATE_DTYPE
from simflash.grid import CTA, Access, CTAProgram, block_key, kv_head
from simflash.memory import SRAM, SimulatedGPU
from simflash.numerics import round_to_storage
from simflash.onchip import DEFAULT_KV_STAGES, DEFAULT_P_REGISTERS
from simflash.schedule import TileSchedule
from simflash.trace import TileStep, TraceRequest

KERNEL = "flash2_forward"


def flash2_grid(sched: TileSchedule, heads: int, longest_first: bool = False, group: int = 1,
                kv_descending: bool = False) -> list[CTA]:
    """One CTA per (head, query tile), query tiles fastest. longest_first: blockIdx.x = T_r - 1 - i,
    as the GPU backend launches them (the longest causal rows start first). group: query heads per
    K/V head; CTAs that read the same K/V head from the same first tile form a cohort (the last tile of
    their range where they walk it from the last down, `kv_descending`)."""
    tiles = range(sched.n_q_tiles - 1, -1, -1) if longest_first else range(sched.n_q_tiles)
    ctas = []
    for h in range(heads):
        for i in tiles:
            kv = sched.kv_range(i)
            ctas.append(CTA((h, i), len(kv), (kv_head(h, group), kv.stop if kv_descending else kv.start)))
    return ctas


def flash2_cta(
    gpu: SimulatedGPU,
    sched: TileSchedule,
    scale: float,
    trace: TraceRequest,
    cta: CTA,
    write_logsumexp: bool = False,
    kv_stages: int = DEFAULT_KV_STAGES,
    p_registers: str = DEFAULT_P_REGISTERS,
) -> Iterator[TileStep | None]:
    """The work of one CTA: query tile i of head h against its KV tiles. Yields after every KV tile.

    Shared memory holds Q_i and kv_stages buffers of (K_j, V_j) (2: K_{j+1}, V_{j+1} arrive while tile j
    computes, as the GPU kernel double-buffers them); S_ij, m_i, l_i and a_i live in float32 registers,
    and P_ij over S_ij (p_registers="overwrite_s") or in registers of its own ("own"; simflash.onchip).
    """
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    h, i = cta.index
    h_kv = kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0])
    d = hbm.shape("Q")[-1]
    rows = sched.q_rows(i)
    B_r = rows.stop - rows.start
    kv_tiles = sched.kv_tiles(i)  # causal, windowed: within the skip bounds
    if not kv_tiles:
        # -- nothing to visit (every row's keys lie past the tile): exit without loading Q_i;
        # each row saw no key, so O_i = 0 and L_i = +inf (a backward's exp(S - L) is then 0, not NaN)
        sram.store(hbm, "O", (h, rows), np.zeros((B_r, d), dtype=STATE_DTYPE))
        if write_logsumexp:
            sram.store(hbm, "L", (h, rows), np.full(B_r, np.inf, dtype=STATE_DTYPE))
        return
    Q_i = sram.load("Q_i", hbm, "Q", (h, rows))  # (B_r, d)
    m_i, l_i, a_i = yield from fold_kv_tiles(gpu, sched, scale, trace, Q_i, kv_tiles, (h, i), h_kv, kv_stages,
                                             p_registers=p_registers)

    # -- normalise once; a row that saw no key outputs 0
    O_i = np.divide(a_i, l_i[:, None], out=np.zeros_like(a_i), where=l_i[:, None] > 0)
    compute.elementwise(div=B_r * d)
    sram.store(hbm, "O", (h, rows), O_i)
    if write_logsumexp:
        # -- logsumexp L_i = m_i + log l_i, for a backward; a row that saw no key gets +inf, as FA-2 writes it
        seen = l_i > 0  # (B_r,)
        L_i = np.full(B_r, np.inf, dtype=STATE_DTYPE)  # (B_r,)
        L_i[seen] = m_i[seen] + np.log(l_i[seen])
        sram.store(hbm, "L", (h, rows), L_i)
    release_tiles(sram, len(kv_tiles), kv_stages)


def release_tiles(sram: SRAM, n_tiles: int, kv_stages: int) -> None:
    """Free what a CTA holds after `fold_kv_tiles` over n_tiles KV tiles: Q_i, the stage buffers it
    filled, m_i, l_i and a_i."""
    stages = min(n_tiles, kv_stages)
    sram.free("Q_i", *(f"{name}[{s}]" for s in range(stages) for name in ("K_j", "V_j")), "m_i", "l_i", "a_i")


def fold_kv_tiles(gpu: SimulatedGPU, sched: TileSchedule, scale: float, trace: TraceRequest, Q_i: np.ndarray,
                  kv_tiles: Iterable[int], tile: tuple[int, int], h_kv: int, kv_stages: int = DEFAULT_KV_STAGES,
                  split: int | None = None, p_registers: str = DEFAULT_P_REGISTERS,
                  ) -> Generator[TileStep | None, None, tuple[np.ndarray, ...]]:
    """FA-2's inner loop: fold KV tiles `kv_tiles` of K/V head h_kv into the online softmax of query tile
    `tile` = (h, i), whose Q_i is on chip. Yields after every KV tile (a TileStep when recorded, naming
    `split` for a split-KV kernel); returns the unnormalised (m_i, l_i, a_i), held in registers.
    The K_j, V_j stage buffers stay held: the caller frees them with Q_i. p_registers="own" holds P_ij
    in registers of its own (storage dtype) from its softmax until the next tile's scores are done, as a
    kernel that overlaps P_ij V_j with S_{i,j+1} must; the last is freed after the loop."""
    hbm, sram, compute = gpu.hbm, gpu.sram, gpu.compute
    h, i = tile
    B_r, d = Q_i.shape
    row_start = sched.q_rows(i).start
    storage = hbm.inspect("Q").dtype  # P_ij enters the second matmul in the storage dtype
    recording = trace.records(h, i)
    m_i = sram.state("m_i", (B_r,), -np.inf)  # running row max
    l_i = sram.state("l_i", (B_r,), 0.0)  # running row sum of exp(S - m)
    a_i = sram.state("a_i", (B_r, d), 0.0)  # unnormalised output accumulator

    for t, j in enumerate(kv_tiles):
        cols = sched.kv_cols(j)
        K_buf, V_buf = f"K_j[{t % kv_stages}]", f"V_j[{t % kv_stages}]"  # the stage buffers tile j fills
        if t >= kv_stages:
            sram.free(K_buf, V_buf)  # every warp is done with tile j - kv_stages: refill its buffers
        K_j = sram.load(K_buf, hbm, "K", (h_kv, cols))  # (B_c, d)
        V_j = sram.load(V_buf, hbm, "V", (h_kv, cols))  # (B_c, d)
        sram.registers.hold("S_ij", B_r * (cols.stop - cols.start) * STATE_DTYPE.itemsize)  # P_ij reuses it

        # -- scores; mask the keys a row may not see before the statistics see them
        S_ij, masked = masked_scores(compute, Q_i, K_j, scale, sched, i, j)  # (B_r, B_c)

        # -- update m_i and l_i
        m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
        base = exp_base(m_new)  # (B_r,) exp_minus's guarded m_new, computed once for alpha and P_ij
        alpha = np.exp(m_i - base)  # (B_r,) moves the old state onto the new max
        P_ij = np.exp(S_ij - base[:, None])  # (B_r, B_c)
        l_i = alpha * l_i + P_ij.sum(axis=1)  # (B_r,)
        compute.elementwise(exp=P_ij.size + B_r, fp32=5 * P_ij.size + B_r * d)

        # -- update the accumulator (P_ij rounded to the storage dtype, as tensor cores take it)
        P_ij = round_to_storage(P_ij, storage)
        if p_registers == "own":  # P_i,j-1 was held beside S_ij; now P_ij takes its place
            if t > 0:
                sram.free("P_ij")
            sram.registers.hold("P_ij", P_ij.size * storage.itemsize)
        a_i = alpha[:, None] * a_i + compute.matmul(P_ij, V_j)  # (B_r, d)
        m_i = m_new
        sram.free("S_ij")
        yield trace.step(h, i, j, row_start, masked, m_i, alpha, l_i, a_i, split=split) if recording else None
    if sram.registers.holds("P_ij"):
        sram.free("P_ij")
    return m_i, l_i, a_i


def flash2_program(sched: TileSchedule, cta: CTA, d: int, itemsize: int, write_logsumexp: bool = False,
                   group: int = 1, kv_descending: bool = False) -> CTAProgram:
    """The transfers of `flash2_cta` for the same CTA, without values (same blocks, same order; with
    `kv_descending`, its KV tiles from the last down, as FlashAttention-2's own kernel walks them)."""
    h, i = cta.index
    rows = sched.q_rows(i)
    kv = sched.kv_range(i)
    kv_blocks = _kv_blocks(sched, kv_head(h, group), d * itemsize)
    row_bytes = d * itemsize
    tile_bytes = (rows.stop - rows.start) * row_bytes
    epilogue: tuple[Access, ...] = (Access(block_key("O", h, rows), tile_bytes, write=True),)
    if write_logsumexp:
        epilogue += (Access(block_key("L", h, rows), (rows.stop - rows.start) * STATE_DTYPE.itemsize, write=True),)
    # a tile with nothing to visit exits without loading Q_i
    prologue = (Access(block_key("Q", h, rows), tile_bytes),) if len(kv) else ()
    if kv_descending:
        return CTAProgram(cta, lambda step: kv_blocks[kv.stop - 1 - step], prologue, epilogue)
    return CTAProgram(cta, lambda step: kv_blocks[kv.start + step], prologue, epilogue)


@functools.lru_cache(maxsize=4)
def _kv_blocks(sched: TileSchedule, h: int, row_bytes: int) -> tuple[tuple[Access, Access], ...]:
    """(K_j, V_j) of head h for every KV tile j: built once per head, shared by its CTAs' programs."""
    blocks = []
    for j in range(sched.n_kv_tiles):
        cols = sched.kv_cols(j)
        nbytes = (cols.stop - cols.start) * row_bytes
        blocks.append((Access(block_key("K", h, cols), nbytes), Access(block_key("V", h, cols), nbytes)))
    return tuple(blocks)
