"""In what order does the H200 start the CTAs of a grid with heads in blockIdx.z, as PyTorch's FA-2 forward
launches them (grid = (query tiles, batch, heads))? The whole-chip model launches them in blockIdx order, x
fastest: every CTA of head h before any of head h + 1, so at most two heads' CTAs are resident at once
when a head has more CTAs than the chip has slots.

A kernel of 128 threads and 100 KiB of dynamic shared memory (two CTAs an SM, as SDPA's kernel at d = 128)
records per CTA its SM and its start and end (%globaltimer), spinning for x + 1 units (ascending, a causal
grid shortest first). Grid (256, 1, 12): 12 heads of 256 query tiles.

    python benchmarks/gpu/sm_placement/grid3d.py OUT_DIR   # on the GPU machine: OUT_DIR/grid3d.json
    python benchmarks/gpu/sm_placement/grid3d.py --show benchmarks/gpu/sm_placement/grid3d.json

Printed: how many CTAs start before a CTA of lower linear index (beyond 2 µs), the first CTA of each head
against the last start of the head before it, and the most heads with CTAs resident at once, measured and
in the model's lock-step schedule.
"""

import json
import sys
from pathlib import Path

from placement import SOURCE as PLACED

# placement.py's kernel, each CTA spinning for blockIdx.x + 1 units and recording at its linear index
SOURCE = (PLACED.replace("void placed(const int* units, int spin,", "void placed3d(int spin,")
          .replace("units[blockIdx.x] * spin", "(blockIdx.x + 1) * spin")
          .replace("out[3 * blockIdx.x] = sm; out[3 * blockIdx.x + 1] = start; out[3 * blockIdx.x + 2] = end;",
                   "const unsigned long long id = blockIdx.x + (unsigned long long)gridDim.x * blockIdx.z;\n"
                   "    out[3 * id] = sm; out[3 * id + 1] = start; out[3 * id + 2] = end;"))
TILES, HEADS = 256, 12
SHARED = 100 * 1024
SPIN = 2000


def run() -> dict:
    import cupy

    kernel = cupy.RawKernel(SOURCE, "placed3d")
    kernel.max_dynamic_shared_size_bytes = SHARED
    out = cupy.zeros(3 * TILES * HEADS, dtype=cupy.uint64)
    sink = cupy.zeros(1, dtype=cupy.float32)
    for _ in range(2):  # the second launch is the one kept
        kernel((TILES, 1, HEADS), (128,), (cupy.int32(SPIN), out, sink), shared_mem=SHARED)
    cupy.cuda.Device().synchronize()
    sm, start, end = out.get().reshape(TILES * HEADS, 3).T
    return {"tiles": TILES, "heads": HEADS, "sm": sm.tolist(), "start_ns": start.tolist(), "end_ns": end.tolist(),
            "sm_count": cupy.cuda.Device().attributes["MultiProcessorCount"]}


def most_heads_resident(intervals: list[tuple[float, float, int]]) -> int:
    """The most distinct heads with a CTA running at once, over (start, end, head) intervals."""
    events = sorted([(s, 1, h) for s, _, h in intervals] + [(e, -1, h) for _, e, h in intervals])
    running: dict[int, int] = {}
    most = 0
    for _, change, head in events:
        running[head] = running.get(head, 0) + change
        most = max(most, sum(1 for v in running.values() if v > 0))
    return most


def model_intervals(tiles: int, heads: int, slots: int) -> list[tuple[float, float, int]]:
    """(start, end, head) of every CTA in the model's lock-step schedule, CTA x of a head taking x + 1 steps."""
    from simflash.grid import CTA, lockstep

    ctas = [CTA((h, x), x + 1, (h, x)) for h in range(heads) for x in range(tiles)]
    started: dict[CTA, int] = {}
    for time, cohorts in lockstep(ctas, slots):
        for _, members, _ in cohorts:
            for cta in members:
                started.setdefault(cta, time)
    return [(started[c], started[c] + c.n_steps, c.index[0]) for c in ctas]


def summary(result: dict) -> str:
    tiles, heads, start, end = result["tiles"], result["heads"], result["start_ns"], result["end_ns"]
    t0 = min(start)
    earlier = sum(any(start[k] < start[j] - 2_000 for j in range(max(0, k - 300), k)) for k in range(len(start)))
    firsts = [min(start[h * tiles:(h + 1) * tiles]) for h in range(heads)]
    lasts = [max(start[h * tiles:(h + 1) * tiles]) for h in range(heads)]
    overlap = [f"{(firsts[h] - lasts[h - 1]) / 1e3:+.0f}" for h in range(1, heads)]
    measured = most_heads_resident([(start[k], end[k], k // tiles) for k in range(len(start))])
    model = most_heads_resident(model_intervals(tiles, heads, 2 * result["sm_count"]))
    return (f"{len(start)} CTAs ({tiles} x {heads} heads): {earlier} start more than 2 µs before a CTA of lower index "
            f"(of the 300 before it); head h's first start less head h - 1's last start, µs: {' '.join(overlap)}; "
            f"most heads resident at once: {measured} measured, {model} in the lock-step schedule; "
            f"makespan {(max(end) - t0) / 1e3:.0f} µs")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result = run()
    (out / "grid3d.json").write_text(json.dumps({"command": "python benchmarks/gpu/sm_placement/grid3d.py $OUT",
                                                 **result}))
    print(summary(result))


if __name__ == "__main__":
    if sys.argv[1] == "--show":
        print(summary(json.loads(Path(sys.argv[2]).read_text())))
    else:
        main(Path(sys.argv[1]))
