"""The naive path with its P V GEMM laid out as cuBLAS runs it, for the L2 variants (variants.py): tried,
not kept.

The model (simflash.algorithms.naive) streams each head's rows of P in blocks and writes a wave's O at the
end of the wave. Here each CTA of the P V GEMM owns TILE_ROWS rows of O (one CTA per SM), walks P's
columns CHUNK at a time, reading its rows of P and the chunk of V, and writes its O tile as it ends; the
softmax writes P in the same (row block, column chunk) blocks so that the L2 sees one tensor. Only the
traffic-only prediction changes (`naive` replaces simflash.model.physical._naive); the naive sweeps hold
no causal rows, so the causal case is left out.
"""

from simflash.algorithms.naive import KERNELS, _row_blocks, naive_grid, naive_program, stored_per_row
from simflash.grid import CTA, Access, CTAProgram, run_programs
from simflash.model.physical import LAUNCH_SECONDS, _prediction, busiest_sm_steps, naive_seconds
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


def naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache):
    """simflash.model.physical._naive with the P V GEMM as tiles (one CTA per SM)."""
    if causal:
        raise ValueError("pv_tiles lays out the unmasked naive path only")
    sched = TileSchedule(n, n_kv, n, n_kv, causal=causal, causal_variant=causal_variant)
    stored = int(stored_per_row(sched).sum()) * heads
    predictions = []
    for kernel in KERNELS:
        if cache == "cold" or kernel == KERNELS[0]:
            l2.flush(residue=cache == "cold")
        l2.kernel = kernel
        slots = spec.sm_count if kernel == "gemm_pv" else 1
        kernel_programs = programs(kernel, sched, heads, d, itemsize)
        resident = run_programs(kernel_programs, slots, l2)
        l2.end_kernel()
        flow = l2.traffic().by_kernel[kernel]
        terms = naive_seconds(spec, kernel, flow, gemm_flops=2 * stored * d, rows=heads * n, exps=stored)
        launch = spec.calibration.get("naive_launch_seconds", LAUNCH_SECONDS)
        predictions.append(_prediction(kernel, flow, terms, launch, heads, slots, 0, len(resident),
                                       busiest_sm_steps([p.cta.n_steps for p in kernel_programs], slots,
                                                        spec.sm_count)))
    return tuple(predictions)
