"""The naive path with its P V GEMM laid out as cuBLAS runs it, for the L2 variants (variants.py): tried,
not kept.

The model (simflash.algorithms.naive) streams each head's rows of P in blocks and writes a wave's O at the
end of the wave. Here each CTA of the P V GEMM owns TILE_ROWS rows of O (one CTA per SM), walks P's
columns CHUNK at a time, reading its rows of P and the chunk of V, and writes its O tile as it ends; the
softmax writes P in the same (row block, column chunk) blocks so that the L2 sees one tensor. Only the
traffic-only prediction changes (`naive` replaces simflash.model.physical._naive); the naive sweeps hold
no causal rows, so the causal case is left out.
"""

from simflash.algorithms.naive import GEMM_TILE_ROWS, _row_blocks, naive_grid, naive_program
from simflash.grid import CTA, Access, CTAProgram, run_programs
from simflash.model.physical import _naive
from simflash.schedule import TileSchedule

TILE_ROWS = 256  # rows of O per CTA (nvjet's 128 x 256 tile, transposed)
CHUNK = 512  # columns of P per step: 256 KiB of P per CTA


def programs(kernel: str, sched: TileSchedule, heads: int, d: int, itemsize: int) -> list[CTAProgram]:
    rows = _row_blocks(sched, itemsize)
    chunks = [slice(c, min(c + CHUNK, sched.n_kv)) for c in range(0, sched.n_kv, CHUNK)]
    if kernel == "gemm_qk":
        return [naive_program(kernel, sched, cta, d, itemsize, 0) for cta in naive_grid(kernel, sched, heads, itemsize, sched.n_q)]
    if kernel == "softmax":
        def softmax_step(h: int, t: int) -> tuple[Access, ...]:
            r = rows[t]
            return (Access(("S", h, r.start), (r.stop - r.start) * sched.n_kv * itemsize),
                    *(Access(("P", h, r.start, c.start), (r.stop - r.start) * (c.stop - c.start) * itemsize, True)
                      for c in chunks))
        return [CTAProgram(cta, lambda t, h=cta.index[0]: softmax_step(h, t)) for cta in naive_grid(kernel, sched, heads, itemsize, sched.n_q)]

    def pv_step(h: int, tile: list[slice], k: int) -> tuple[Access, ...]:
        c = chunks[k]
        return (*(Access(("P", h, r.start, c.start), (r.stop - r.start) * (c.stop - c.start) * itemsize) for r in tile),
                Access(("V", h, c.start), (c.stop - c.start) * d * itemsize))

    tiles = [slice(r, min(r + TILE_ROWS, sched.n_q)) for r in range(0, sched.n_q, TILE_ROWS)]
    return [CTAProgram(CTA((h, i), len(chunks), (h, i)),
                       lambda k, h=h, tile=[r for r in rows if t.start <= r.start < t.stop]: pv_step(h, tile, k),
                       epilogue=(Access(("O", h, t.start), (t.stop - t.start) * d * itemsize, True),))
            for h in range(heads) for i, t in enumerate(tiles)]


def play(kernel: str, sched: TileSchedule, heads: int, d: int, itemsize: int, wave_rows: int, softmax_rows: int, l2):
    """One kernel laid out as above, played through the L2 (what simflash.model.physical._naive takes as `play`):
    the P V GEMM's CTAs one an SM (a wave's rows over GEMM_TILE_ROWS), the other kernels' one a head at a time. Its
    softmax writes a block's P as it reads its S, as the model's did when this was tried (not `softmax_rows` later)."""
    slots = wave_rows // GEMM_TILE_ROWS if kernel == "gemm_pv" else 1
    kernel_programs = programs(kernel, sched, heads, d, itemsize)
    return [p.cta.n_steps for p in kernel_programs], slots, len(run_programs(kernel_programs, slots, l2))


def naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache):
    """simflash.model.physical._naive with the P V GEMM as tiles (one CTA per SM)."""
    if causal:
        raise ValueError("pv_tiles lays out the unmasked naive path only")
    return _naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache, play=play)
