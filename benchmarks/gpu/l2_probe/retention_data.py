"""Do the retention probe's figures depend on what the buffer holds? retention.py's buffers are all ones;
an L2 that stored such lines compressed would keep more of them than of K and V. The same compute-paced
rotated readers (retention.py's kernel, one head, the whole buffer) over a buffer of ones and over one of
random floats, X = 32 to 96 MiB, after a read-only flush each; Nsight Compute's DRAM bytes:

    python benchmarks/gpu/l2_probe/retention_data.py OUT_DIR    # ncu over itself: retention_data.json, _ncu.csv
    python benchmarks/gpu/l2_probe/retention_data.py --show benchmarks/gpu/l2_probe/retention_data.json

Printed: per buffer and X, the DRAM reads beyond X as a share of the 527 X of re-reads.
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, profile_cases, read_kernel, run
from retention import PACED, SPIN

SIZES = (32, 48, 64, 96)
FILLS = ("ones", "random")


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("flush_read") + PACED)
    flush, paced = module.get_function("flush_read"), module.get_function("paced_read")
    buffers = {"ones": cupy.ones(max(SIZES) * MiB // 4, dtype=cupy.float32),
               "random": cupy.random.default_rng(0).standard_normal(max(SIZES) * MiB // 4, dtype=cupy.float32)}
    F = cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for fill in FILLS:
        for size in SIZES:
            flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
            paced((GRID,), (BLOCK,), (buffers[fill], chunks(size), cupy.int32(1), cupy.int32(1), cupy.int32(1),
                                      cupy.int32(SPIN), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    profile_cases(__file__, out, "retention_data", "paced_read",
                  [{"fill": fill, "x_mib": size} for fill in FILLS for size in SIZES], show)


def show(path: Path) -> None:
    report = json.loads(path.read_text())
    ctas = report["ctas"]
    print(f"{ctas} compute-paced rotated readers over a buffer of ones or of random floats")
    print("fill    X MiB  DRAM beyond X MiB  of re-reads")
    for row in report["rows"]:
        beyond = row["dram_read_bytes"] - row["x_mib"] * MiB
        print(f"{row['fill']:6s}  {row['x_mib']:5d}  {beyond / MiB:17.1f}  {beyond / (row['x_mib'] * MiB * (ctas - 1)):11.2%}")


if __name__ == "__main__":
    run(target, main, show)
