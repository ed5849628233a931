"""Is what the L2 learns about rotated readers (retention.py: their misses fall over the run) a property of
each line, or a mode the whole cache switches into? Compute-paced rotated readers (retention.py's kernel)
go round a buffer A of X MiB, then, with no flush between, either round A again or round another buffer B
of the same size; and B alone after a flush, for comparison. If each line earns its place by its reads, A
again starts with what A kept and B starts over, missing like B alone; if the cache switched into a mode
that keeps part of any stream, B after A misses less than B alone from the start. Nsight Compute's DRAM
bytes of each kernel:

    python benchmarks/gpu/l2_probe/retention_phases.py OUT_DIR   # ncu over itself: retention_phases.json, _ncu.csv
    python benchmarks/gpu/l2_probe/retention_phases.py --show benchmarks/gpu/l2_probe/retention_phases.json

Printed: each kernel's DRAM reads, in MiB and as a share of all it reads (528 X), for the whole run and
for readers stopped after 1/16 of the buffer (where a fresh buffer misses most).
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, profile_cases, read_kernel, run
from retention import PACED, SPIN

SIZES = (64, 96)
PARTS = (1, 16)  # readers going all the way round, or stopped after 1/16 of the buffer
SEQUENCES = {"A, A again": ("A", "A"), "A, then B": ("A", "B"), "B alone": ("B",)}


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("flush_read") + PACED)
    flush, paced = module.get_function("flush_read"), module.get_function("paced_read")
    buffers = {name: cupy.ones(max(SIZES) * MiB // 4, dtype=cupy.float32) for name in ("A", "B")}
    F = cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for size, parts, reads in cases():
        flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
        for name in reads:
            paced((GRID,), (BLOCK,), (buffers[name], chunks(size), cupy.int32(1), cupy.int32(1), cupy.int32(parts),
                                      cupy.int32(SPIN), never))
    cupy.cuda.Device().synchronize()


def cases() -> list[tuple[int, int, tuple[str, ...]]]:
    return [(size, parts, reads) for size in SIZES for parts in PARTS for reads in SEQUENCES.values()]


def main(out: Path) -> None:
    profile_cases(__file__, out, "retention_phases", "paced_read",
                  [{"x_mib": size, "parts": parts, "sequence": ", ".join(reads), "kernel": at, "buffer": name}
                   for size, parts, reads in cases() for at, name in enumerate(reads)], show)


def show(path: Path) -> None:
    report = json.loads(path.read_text())
    ctas = report["ctas"]
    print(f"{ctas} compute-paced rotated readers; each kernel's DRAM reads, MiB and share of what it reads")
    print("X MiB  read  sequence     kernel  DRAM MiB  share")
    for row in report["rows"]:
        reads = row["x_mib"] * MiB * ctas / row["parts"]
        print(f"{row['x_mib']:5d}  1/{row['parts']:<2d}  {row['sequence']:11s}  {row['buffer']:>6s}  "
              f"{row['dram_read_bytes'] / MiB:8.1f}  {row['dram_read_bytes'] / reads:5.1%}")


if __name__ == "__main__":
    run(target, main, show)
