"""The naive path with its Q K^T GEMM laid out as cuBLAS's nvjet kernel walks it, for the L2 variants
(variants.py, variant `qk-tiles`): a persistent grid of 132 CTAs taking the output's tiles (256 keys x 128
queries) in groups of GROUP_KEYS keys, within a group query tile after query tile (every other group
backwards), each query tile's tiles of the group side by side; so every query tile is read again once a
group, after anything from none to twice a group's S (benchmarks/gpu/naive_warm/qk_shapes.txt: the extra
reads follow Q's size and K's number of groups, none where K has one group; l2_probe/bands.txt, serpentine
groups). A step of the lock-step schedule is UNITS_A_STEP (query tile, group) units: their tiles of K and
Q read (a block several units read, a cohort's), then their pieces of S written, one for each of the
softmax's row blocks and each group, which the softmax then reads piece by piece. Only the traffic-only
prediction changes (`naive` replaces simflash.model.physical._naive); the unmasked path only, and K of
one group (GROUP_KEYS keys or fewer) as the model lays it out.

    python benchmarks/gpu/l2_probe/qk_tiles.py > benchmarks/gpu/l2_probe/qk_tiles.txt

prints the GEMM alone, so laid out, through the model's L2 (cold) for the shapes of qk_shapes.json: the DRAM
MiB read beyond Q + K, predicted / measured.
"""

from simflash.algorithms.naive import _column_chunks, _piece_bytes, _row_blocks, block_rows, concurrent_heads
from simflash.algorithms.naive import naive_grid, naive_program
from simflash.grid import Access, CTAProgram, block_key, run_programs
from simflash.model.physical import _naive
from simflash.schedule import TileSchedule

KEY_TILE, QUERY_TILE = 256, 128  # nvjet_sm90_hsh_256x128: rows of K and rows of Q per output tile
GROUP_KEYS = 2048  # keys a group: 8 key tiles
UNITS_A_STEP = 16  # (query tile, group) units of 8 tiles each the 132 CTAs take a step (128 tiles)


def _groups(n_kv: int) -> list[slice]:
    return [slice(g, min(g + GROUP_KEYS, n_kv)) for g in range(0, n_kv, GROUP_KEYS)]


def play_gemm_qk(l2, sched: TileSchedule, heads: int, d: int, itemsize: int) -> None:
    """The Q K GEMM's tiles through the L2 in nvjet's order, UNITS_A_STEP units a step."""
    groups, rows = _groups(sched.n_kv), block_rows(sched.n_kv, itemsize)
    query_tiles = list(range(0, sched.n_q, QUERY_TILE))
    units = [(h, g, q) for h in range(heads) for g in range(len(groups))
             for q in (query_tiles if g % 2 == 0 else query_tiles[::-1])]
    for first in range(0, len(units), UNITS_A_STEP):
        step = units[first:first + UNITS_A_STEP]
        reads: dict[tuple, list[int]] = {}
        for h, g, q in step:
            cols = groups[g]
            for k in range(cols.start, cols.stop, KEY_TILE):
                cell = reads.setdefault(("K", h, k), [min(KEY_TILE, cols.stop - k) * d * itemsize, 0])
                cell[1] += 1
            cell = reads.setdefault(("Q", h, q), [min(QUERY_TILE, sched.n_q - q) * d * itemsize, 0])
            cell[1] += len(range(cols.start, cols.stop, KEY_TILE))
        for key, (nbytes, count) in reads.items():
            l2.read(key, nbytes, count)
        for h, g, q in step:
            cols = groups[g]
            for r in range(q, min(q + QUERY_TILE, sched.n_q), rows):
                l2.write(("S", h, r, cols.start), min(rows, sched.n_q - r) * (cols.stop - cols.start) * itemsize)


def softmax_programs(sched: TileSchedule, heads: int, itemsize: int, wave_rows: int):
    """The model's softmax, reading each row block of S in its groups' pieces."""
    blocks, chunks, groups = _row_blocks(sched, itemsize), _column_chunks(sched), _groups(sched.n_kv)
    pieces = _piece_bytes(sched, blocks, chunks, itemsize)

    def step(h: int, t: int):
        r = blocks[t]
        return (*(Access(("S", h, r.start, g.start), (r.stop - r.start) * (g.stop - g.start) * itemsize)
                  for g in groups),
                *(Access(block_key("P", h, r, cols), int(pieces[t, k]), True) for k, cols in enumerate(chunks)))
    return [CTAProgram(cta, lambda t, h=cta.index[0]: step(h, t))
            for cta in naive_grid("softmax", sched, heads, itemsize, wave_rows)]


def play(kernel: str, sched: TileSchedule, heads: int, d: int, itemsize: int, wave_rows: int, l2):
    """One kernel through the L2 (what simflash.model.physical._naive takes as `play`): the Q K GEMM as nvjet's
    tiles, the softmax reading S in the groups' pieces, the P V GEMM as the model lays it out."""
    if kernel == "gemm_qk":
        play_gemm_qk(l2, sched, heads, d, itemsize)
        return [1], 1, 1
    programs = (softmax_programs(sched, heads, itemsize, wave_rows) if kernel == "softmax" else
                [naive_program(kernel, sched, cta, d, itemsize, wave_rows)
                 for cta in naive_grid(kernel, sched, heads, itemsize, wave_rows)])
    slots = concurrent_heads(kernel, sched, wave_rows)
    return [p.cta.n_steps for p in programs], slots, len(run_programs(programs, slots, l2))


def naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache):
    """simflash.model.physical._naive with the Q K GEMM as nvjet's tiles, where K has several groups."""
    if causal or n_kv <= GROUP_KEYS:
        return _naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache)
    return _naive(spec, l2, n, n_kv, d, heads, causal, causal_variant, itemsize, cache, play=play)


def shapes_table() -> None:
    import json
    from pathlib import Path

    from simflash.chip import l2_cache
    from simflash.config import MiB, gpu_spec

    measured = json.loads((Path(__file__).resolve().parents[1] / "naive_warm" / "qk_shapes.json").read_text())
    print("Q K GEMM of one head, d = 128, fp16, cold: DRAM MiB read beyond Q + K, the nvjet walk through the model's L2")
    print("   N (Q)   M (K)  predicted  measured  kernel")
    for row in measured["rows"]:
        n, m = row["n"], row["m"]
        l2 = l2_cache(gpu_spec("H200"))
        l2.flush(residue=True)
        l2.kernel = "gemm_qk"
        play_gemm_qk(l2, TileSchedule(n, m, n, m), 1, row["d"], 2)
        l2.end_kernel()
        compulsory = (n + m) * row["d"] * 2
        predicted = l2.traffic().by_kernel["gemm_qk"].dram_read_bytes - compulsory
        print(f"{n:8d} {m:7d}  {predicted / MiB:9.2f}  {(row['dram__bytes_read.sum'] - compulsory) / MiB:8.2f}"
              f"  {row['kernel'][:48]}")


if __name__ == "__main__":
    shapes_table()
