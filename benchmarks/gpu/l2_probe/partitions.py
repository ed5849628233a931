"""Does a line read from another SM take a second place in the L2? Read a buffer of X MiB from DRAM,
then read it again, each 16-byte chunk by the CTA `shift` places after the one that read it first (a
grid of 4 CTAs per SM: shift 0 and 264 on the same SM as CTAs go out round-robin, 1, 33 and 66 on
others, some of them across the chip), a read-only flush before each pair; Nsight Compute's DRAM bytes
of the second read.

    python benchmarks/gpu/l2_probe/partitions.py OUT_DIR     # runs ncu over itself: partitions.json, partitions_ncu.csv
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, profile, read_kernel, run

SIZES = (8, 16, 20, 24, 28, 32, 40, 48, 64)
SHIFTS = (0, 1, 33, 66, 264)


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("probe_read") + read_kernel("flush_read"))
    read, flush = module.get_function("probe_read"), module.get_function("flush_read")
    X, F = cupy.ones(128 * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never = cupy.zeros(1, dtype=cupy.float32)
    for shift in SHIFTS:
        for size in SIZES:
            flush((GRID,), (BLOCK,), (F, chunks(512), cupy.int32(0), never))
            read((GRID,), (BLOCK,), (X, chunks(size), cupy.int32(0), never))
            read((GRID,), (BLOCK,), (X, chunks(size), cupy.int32(shift), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(__file__, out, "partitions_ncu.csv")
    kernels = [k for k in parse_ncu_csv(csv_text) if k["name"].startswith("probe_read")]
    rows = []
    for at, (shift, size) in enumerate((s, x) for s in SHIFTS for x in SIZES):
        first, second = kernels[2 * at], kernels[2 * at + 1]
        rows.append({"x_mib": size, "second_read_shift": shift,
                     "first_dram_read_bytes": first["metrics"]["dram__bytes_read.sum"],
                     "second_dram_read_bytes": second["metrics"]["dram__bytes_read.sum"]})
        print(f"X={size:3d} shift={shift:3d}  second read misses {rows[-1]['second_dram_read_bytes'] / MiB:6.1f} MiB")
    (out / "partitions.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))


if __name__ == "__main__":
    run(target, main)
