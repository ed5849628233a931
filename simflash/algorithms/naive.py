"""Naive attention: the explicit three-kernel materialising baseline.

    kernel 1 (GEMM):    S = Q K^T * scale      reads Q, K     writes S   (N x N, storage dtype)
    kernel 2 (softmax): P = softmax(S)         reads S        writes P   (N x N, storage dtype)
    kernel 3 (GEMM):    O = P V                reads P, V     writes O

Each kernel's work is split into one CTA per head that streams its rows in blocks of `block_rows`
(a block of S about NAIVE_BLOCK_BYTES), reading each operand once, as the logical model counts it:
the order in which an L2 sees S and P go by. (cuBLAS and a softmax tile the work differently; what the
L2 sees of it is a stream of rows, head after head.) What the L2 does see of cuBLAS's tiling, the CTA
lays out as cuBLAS does.

The Q K GEMM's CTAs (its H200 kernel, nvjet_sm90_hsh_256x128, a persistent grid) take its output tiles
(QK_TILE_KEYS keys x QK_TILE_QUERIES queries) a group of QK_GROUP_KEYS keys at a time: within a group,
query tile after query tile (every other group backwards), so each tile of Q is read again once a group,
after the S of anything from none to two groups has been written, and the group's tiles of K at every
unit (benchmarks/gpu/naive_warm/qk_shapes.txt: no reads beyond Q + K where K has one group, more with
Q's size and K's groups). The CTA takes QK_UNITS_A_STEP (group, query tile) units a step and writes S in
pieces of a group's columns, which the softmax reads; the reads again reach the L2, not the ledger.

Two things of cuBLAS's tiling of the P V GEMM the L2 sees too. Its CTAs (GEMM_TILE_ROWS rows of O
each, one on every SM) walk P's columns together, so a wave's rows of P are read a column chunk at a
time, all of them at chunk k before any at chunk k + 1: the part of P the softmax left in the L2 is
read piecemeal over the whole wave, not row after row. And each CTA writes its tile of O as it ends,
after all of the wave's P has gone by. So the P V kernel's CTA takes its rows a wave (`wave_rows`) at a
time, one step per chunk of PV_CHUNK_COLUMNS columns, and writes the wave's O at its last chunk; the chip
runs as many heads side by side as a wave holds. The softmax writes P in the (row block, column chunk)
pieces the GEMM reads.

The softmax kernel (backends/naive_softmax.cu) is one CTA a row that reads its row of S whole before it
writes the row of P, so P goes out the rows resident at once after S comes in (1,056 on the H200). Its CTA
here writes a block's P that many rows (`softmax_lead` blocks) after it reads the block's S, the head's
last blocks' P at the end: at the kernel's end the L2's newest data is P alone
(benchmarks/gpu/naive_warm/softmax_lead.txt).

Causal or windowed: kernels store and load only the permitted entries of S and P (the lower triangle,
the band); the others are never stored, and the softmax treats them as -inf. Grouped-query heads: each
query head's GEMMs read its group's K and V.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np

from simflash.config import STATE_DTYPE, KiB
from simflash.grid import CTA, Access, CTAProgram, block_key, kv_head
from simflash.memory import SimulatedGPU
from simflash.schedule import TileSchedule

KERNELS = ("gemm_qk", "softmax", "gemm_pv")
NAIVE_BLOCK_BYTES = 256 * KiB  # rows of S streamed per step
GEMM_TILE_ROWS = 256  # rows of O per CTA of cuBLAS's P V GEMM (its H200 tile: nvjet_sm90_hsh_128x256)
QK_TILE_KEYS, QK_TILE_QUERIES = 256, 128  # keys and queries of an output tile of the Q K GEMM
QK_GROUP_KEYS = 2048  # keys the Q K GEMM's CTAs take at a time: 8 key tiles
QK_UNITS_A_STEP = 16  # (group, query tile) units the Q K GEMM's 132 CTAs take a step: 128 tiles
PV_CHUNK_COLUMNS = 512  # columns of P the P V GEMM's CTAs read per step: 256 KiB of a tile's rows at fp16
# A head's chunk of V is data its P V CTAs read together (held as a cohort's in the L2) once its rows fill this many
# CTAs' tiles; fewer read it as one CTA reads a stream. A line read together by 1, 2 or 4 CTAs misses when read again as
# one CTA's does, by 16 or more as a cohort's (benchmarks/gpu/l2_probe/readers.json); chosen on the calibration
# sweep's fit rows among 1 (every head), 2, 4, 8 and 16: 236, 239, 242, 241, 241 of 256 within 10% / 1 MiB (`python
# benchmarks/gpu/l2_probe/variants.py pv-shared-v-1 pv-shared-v-2 current pv-shared-v-8 pv-shared-v-16`, variants.txt).
PV_SHARED_V_TILES = 4


def block_rows(n_kv: int, itemsize: int) -> int:
    """Rows of S per streamed block: about NAIVE_BLOCK_BYTES, a power of two no larger than GEMM_TILE_ROWS
    (so that a wave of the P V GEMM's tiles ends at the end of a block)."""
    rows = max(1, NAIVE_BLOCK_BYTES // (n_kv * itemsize))
    return min(GEMM_TILE_ROWS, 1 << (rows.bit_length() - 1))


def naive_grid(kernel: str, sched: TileSchedule, heads: int, itemsize: int, wave_rows: int,
               softmax_rows: int = 0) -> list[CTA]:
    """One CTA per head; one step per block of rows (the softmax: and per block its writes trail by), or (the P V
    GEMM) per column chunk of each wave."""
    if kernel == "gemm_pv":
        steps = -(-sched.n_q // wave_rows) * len(_column_chunks(sched))
    elif kernel == "gemm_qk":
        steps = len(_qk_steps(sched))
    else:
        steps = len(_row_blocks(sched, itemsize)) + softmax_lead(sched, itemsize, softmax_rows)
    return [CTA((h,), steps, (h,)) for h in range(heads)]


def softmax_lead(sched: TileSchedule, itemsize: int, resident_rows: int) -> int:
    """Row blocks by which the softmax's writes of P trail its reads of S. Each CTA of the kernel reads its row of S
    whole, then writes the row of P, so the writes trail the reads by the rows resident at once (`resident_rows`,
    simflash.chip.softmax_resident_rows; 0: a block's P goes out as its S comes in), in whole blocks, at most a
    head's (a head's CTA writes its own P): at the kernel's end the L2's newest data is that much P and no S
    (benchmarks/gpu/naive_warm/softmax_lead.txt)."""
    rows = block_rows(sched.n_kv, itemsize)
    return min(-(-sched.n_q // rows), resident_rows // rows)


def _row_blocks(sched: TileSchedule, itemsize: int, within: slice | None = None) -> list[slice]:
    """The blocks of `block_rows` rows (of one wave's rows, `within`, where given: whole blocks)."""
    rows = block_rows(sched.n_kv, itemsize)
    start, stop = (0, sched.n_q) if within is None else (within.start, within.stop)
    return [slice(r, min(r + rows, stop)) for r in range(start, stop, rows)]


def _waves(sched: TileSchedule, wave_rows: int) -> list[slice]:
    return [slice(r, min(r + wave_rows, sched.n_q)) for r in range(0, sched.n_q, wave_rows)]


def _column_chunks(sched: TileSchedule, columns: int = PV_CHUNK_COLUMNS) -> list[slice]:
    return [slice(c, min(c + columns, sched.n_kv)) for c in range(0, sched.n_kv, columns)]


class QKUnit(NamedTuple):
    """A group of keys and a tile of queries: the Q K GEMM's output tiles a CTA takes together."""

    keys: slice
    queries: slice
    group: int  # the group's index
    opens_group: bool  # the group's first unit: its tiles of K are read for the first time


def _qk_steps(sched: TileSchedule) -> list[list[QKUnit]]:
    """The Q K GEMM's units in the order its CTAs take them, QK_UNITS_A_STEP a step: group after group, every
    query tile of a group before the next group (every other group backwards)."""
    tiles = [slice(q, min(q + QK_TILE_QUERIES, sched.n_q)) for q in range(0, sched.n_q, QK_TILE_QUERIES)]
    units = [QKUnit(keys, queries, g, i == 0) for g, keys in enumerate(_column_chunks(sched, QK_GROUP_KEYS))
             for i, queries in enumerate(tiles if g % 2 == 0 else tiles[::-1])]
    return [units[i:i + QK_UNITS_A_STEP] for i in range(0, len(units), QK_UNITS_A_STEP)]


def _key_tiles(keys: slice) -> list[slice]:
    return [slice(k, min(k + QK_TILE_KEYS, keys.stop)) for k in range(keys.start, keys.stop, QK_TILE_KEYS)]


def _score_piece_rows(sched: TileSchedule, itemsize: int) -> int:
    """Rows of a piece of S: a row block, or a query tile's share of one, whichever is smaller."""
    return min(block_rows(sched.n_kv, itemsize), QK_TILE_QUERIES)


def _score_rows(sched: TileSchedule, itemsize: int, within: slice) -> list[slice]:
    """The rows of S's pieces within `within` (a row block or a query tile)."""
    rows = _score_piece_rows(sched, itemsize)
    return [slice(r, min(r + rows, within.stop)) for r in range(within.start, within.stop, rows)]


def _score_piece_bytes(sched: TileSchedule, itemsize: int) -> np.ndarray:
    """(rows of a piece, group of keys): bytes of the entries of S stored in each piece of S."""
    return _piece_bytes(sched, _score_rows(sched, itemsize, slice(0, sched.n_q)),
                        _column_chunks(sched, QK_GROUP_KEYS), itemsize)


def gemm_qk_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA) -> Iterator[None]:
    hbm, compute = gpu.hbm, gpu.compute
    (h,) = cta.index
    h_kv = kv_head(h, hbm.shape("Q")[0] // hbm.shape("K")[0])  # its group's K
    permitted = sched.mask(0, 0) if sched.masks else None  # (n_q, n_kv): True where row r may see key c
    for step in _qk_steps(sched):
        for unit in step:
            Q_t = hbm.read("Q", (h, unit.queries), again=unit.group > 0)  # (tile queries, d)
            K_g = np.concatenate([hbm.read("K", (h_kv, keys), again=not unit.opens_group)
                                  for keys in _key_tiles(unit.keys)])  # (group keys, d)
            S_t = compute.matmul(Q_t, K_g.T) * scale  # (tile queries, group keys)
            compute.elementwise(fp32=S_t.size)  # the scale, in the GEMM's epilogue
            for rows in _score_rows(sched, hbm.itemsize("S"), unit.queries):
                stored = None if permitted is None else permitted[rows, unit.keys]
                if stored is None or stored.any():
                    hbm.write_where("S", S_t[rows.start - unit.queries.start:rows.stop - unit.queries.start],
                                    stored, index=(h, rows, unit.keys))
        yield None


def softmax_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA, resident_rows: int = 0
                ) -> Iterator[None]:
    hbm = gpu.hbm
    (h,) = cta.index
    permitted = sched.mask(0, 0) if sched.masks else None
    groups = _column_chunks(sched, QK_GROUP_KEYS)
    blocks = _row_blocks(sched, hbm.itemsize("S"))
    lead = softmax_lead(sched, hbm.itemsize("S"), resident_rows)
    computed: deque[np.ndarray] = deque()  # P of the blocks read, not yet written
    for t in range(len(blocks) + lead):
        if t < len(blocks):
            computed.append(_softmax_block(gpu, sched, h, blocks[t], permitted, groups))
        if t >= lead:
            rows = blocks[t - lead]
            P_r = computed.popleft()
            stored = None if permitted is None else permitted[rows]
            for cols in _column_chunks(sched):  # the pieces the P V GEMM reads
                piece = None if stored is None else stored[:, cols]
                if piece is None or piece.any():
                    hbm.write_where("P", P_r[:, cols], piece, index=(h, rows, cols))
        yield None


def _softmax_block(gpu: SimulatedGPU, sched: TileSchedule, h: int, rows: slice, permitted: np.ndarray | None,
                   groups: list[slice]) -> np.ndarray:
    """P of a block of rows, from S read in the pieces the Q K GEMM wrote: (rows, n_kv)."""
    hbm, compute = gpu.hbm, gpu.compute
    S_r = np.full((rows.stop - rows.start, sched.n_kv), -np.inf, dtype=STATE_DTYPE)  # (rows, n_kv)
    for part in _score_rows(sched, hbm.itemsize("S"), rows):
        for keys in groups:
            shown = None if permitted is None else permitted[part, keys]
            if shown is None or shown.any():
                S_r[part.start - rows.start:part.stop - rows.start, keys] = hbm.read_where(
                    "S", shown, fill=-np.inf, index=(h, part, keys))
    m = S_r.max(axis=-1, keepdims=True)  # (rows, 1)
    # A row with no visible key has m = -inf: exponentiate against 0 so exp(-inf) = 0, not NaN.
    P_r = np.exp(S_r - np.where(m == -np.inf, 0.0, m))  # (rows, n_kv)
    l = P_r.sum(axis=-1, keepdims=True)  # (rows, 1)
    P_r /= np.where(l > 0, l, 1.0)  # such a row is all zeros: divide by 1 to keep it so
    compute.elementwise(exp=P_r.size, fp32=3 * P_r.size, div=P_r.size)  # max, subtract, sum; exp; divide
    return P_r


def gemm_pv_cta(gpu: SimulatedGPU, sched: TileSchedule, scale: float, cta: CTA, wave_rows: int) -> Iterator[None]:
    hbm, compute = gpu.hbm, gpu.compute
    (h,) = cta.index
    permitted = sched.mask(0, 0) if sched.masks else None
    h_kv = kv_head(h, hbm.shape("Q")[0] // hbm.shape("V")[0])  # its group's V
    chunks = _column_chunks(sched)
    V = np.empty(hbm.shape("V")[1:], dtype=STATE_DTYPE)  # (n_kv, d): read a chunk at a time by the first wave
    shared_v = v_shared(sched)
    for w, wave in enumerate(_waves(sched, wave_rows)):
        blocks = _row_blocks(sched, hbm.itemsize("P"), wave)
        O_w = np.zeros((wave.stop - wave.start, V.shape[1]), dtype=V.dtype)  # (wave rows, d) accumulated
        for k, cols in enumerate(chunks):
            if w == 0:  # the head's CTAs of the wave read it; later waves' reads hit: counted once, as the logical model does
                V[cols] = hbm.read("V", (h_kv, cols), shared=shared_v)
            for rows in blocks:  # the dense GEMM multiplies every chunk; it reads only the stored pieces
                stored = None if permitted is None else permitted[rows, cols]
                read = stored is None or stored.any()
                P_rc = hbm.read_where("P", stored, fill=0.0, index=(h, rows, cols)) if read else \
                    np.zeros((rows.stop - rows.start, cols.stop - cols.start), dtype=V.dtype)
                O_w[rows.start - wave.start:rows.stop - wave.start] += compute.matmul(P_rc, V[cols])
            if k == len(chunks) - 1:  # the wave's CTAs end: their tiles of O go out
                for rows in blocks:
                    hbm.write("O", (h, rows), O_w[rows.start - wave.start:rows.stop - wave.start])
            yield None


def v_shared(sched: TileSchedule) -> bool:
    """Whether a head's P V CTAs read each chunk of V as a cohort does: its rows fill PV_SHARED_V_TILES CTAs' tiles
    (1,024 rows) or more. A shorter head's CTAs read it as a stream, like P."""
    return sched.n_q >= PV_SHARED_V_TILES * GEMM_TILE_ROWS


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
                  group: int = 1, softmax_rows: int = 0) -> CTAProgram:
    """The transfers of kernel `kernel`'s CTA without values (same blocks, same order)."""
    (h,) = cta.index
    h_kv = kv_head(h, group)
    blocks = _row_blocks(sched, itemsize)
    chunks = _column_chunks(sched)

    def rows_bytes(rows: slice) -> int:
        return (rows.stop - rows.start) * d * itemsize

    score_rows = _score_piece_rows(sched, itemsize)
    groups = _column_chunks(sched, QK_GROUP_KEYS)
    scores = _score_piece_bytes(sched, itemsize)  # (piece rows, group): bytes stored

    def score_pieces(rows: slice, group_indices: Iterable[int], write: bool = False) -> Iterator[Access]:
        """S's stored pieces within `rows` and the groups named, piece after piece."""
        for piece in _score_rows(sched, itemsize, rows):
            for g in group_indices:
                if scores[piece.start // score_rows, g]:
                    yield Access(block_key("S", h, piece, groups[g]), int(scores[piece.start // score_rows, g]), write)

    if kernel == "gemm_qk":
        steps = _qk_steps(sched)
        return CTAProgram(cta, lambda t: tuple(
            access for unit in steps[t] for access in (
                Access(block_key("Q", h, unit.queries), rows_bytes(unit.queries), again=unit.group > 0),
                *(Access(block_key("K", h_kv, keys), rows_bytes(keys), again=not unit.opens_group)
                  for keys in _key_tiles(unit.keys)),
                *score_pieces(unit.queries, (unit.group,), write=True))))
    pieces = _piece_bytes(sched, blocks, chunks, itemsize)  # (row block, chunk): bytes stored
    if kernel == "softmax":
        lead = softmax_lead(sched, itemsize, softmax_rows)

        def softmax_step(t: int) -> tuple[Access, ...]:
            reads = score_pieces(blocks[t], range(len(groups))) if t < len(blocks) else ()
            b = t - lead  # the block whose P goes out
            writes = (Access(block_key("P", h, blocks[b], cols), int(pieces[b, k]), True)
                      for k, cols in enumerate(chunks) if pieces[b, k]) if b >= 0 else ()
            return (*reads, *writes)

        return CTAProgram(cta, softmax_step)
    # each wave's row blocks, with their index into `blocks` (a wave holds whole blocks)
    waves = [[(b, rows) for b, rows in enumerate(blocks) if wave.start <= rows.start < wave.stop]
             for wave in _waves(sched, wave_rows)]
    shared_v = v_shared(sched)

    def pv_step(t: int) -> tuple[Access, ...]:
        wave, k = waves[t // len(chunks)], t % len(chunks)
        reads = (Access(block_key("P", h, rows, chunks[k]), int(pieces[b, k])) for b, rows in wave if pieces[b, k])
        ending = [rows for _, rows in wave] if k == len(chunks) - 1 else ()  # the wave's tiles of O go out
        v = (Access(block_key("V", h_kv, chunks[k]), rows_bytes(chunks[k]), shared=shared_v),) if t < len(chunks) else ()
        return (*v, *reads, *(Access(block_key("O", h, rows), rows_bytes(rows), True) for rows in ending))

    return CTAProgram(cta, pv_step)


def _stored_columns(sched: TileSchedule) -> tuple[np.ndarray, np.ndarray]:
    """(first, one past the last) key each query row stores, clipped to the keys: all n_kv, or (causal,
    windowed) the visible ones."""
    diagonal = np.arange(sched.n_q) + sched.diagonal_offset  # (n_q,)
    last = np.full(sched.n_q, sched.n_kv - 1) if sched.right is None else diagonal + sched.right
    first = np.zeros(sched.n_q, dtype=np.int64) if sched.left is None else diagonal - sched.left
    return np.clip(first, 0, sched.n_kv), np.clip(last + 1, 0, sched.n_kv)


def stored_per_row(sched: TileSchedule) -> np.ndarray:
    """Entries of S (and P) each query row stores."""
    first, stop = _stored_columns(sched)
    return stop - first


def _piece_bytes(sched: TileSchedule, blocks: list[slice], chunks: list[slice], itemsize: int) -> np.ndarray:
    """(row block, column chunk): bytes of the entries of P stored in each piece."""
    first, stop = _stored_columns(sched)
    starts = [rows.start for rows in blocks]
    return np.stack([np.add.reduceat(np.maximum(np.minimum(stop, c.stop) - np.maximum(first, c.start), 0), starts)
                     for c in chunks], axis=1) * itemsize
