"""Does the warm sweeps' read-only flush leave dirty lines behind, as ncu's cache control does (the cold
flush residue, 2.3 MiB: benchmarks/gpu/write_sources.json)? The warm calibration groups start after
`flush_buffer.sum()`, CuPy's reduction over 512 MiB (simflash.backends.calibrate_target); the model
starts them with a clean L2. Here a kernel writes X MiB (the dirty lines a previous group leaves), the
same reduction runs, and a read-only kernel streams 256 MiB: any DRAM write it shows is dirty data the
flush left. Application replay, no cache control, as the warm sweeps are measured.

    python benchmarks/gpu/l2_probe/warm_flush.py OUT_DIR     # runs ncu over itself: warm_flush.json, warm_flush_ncu.csv
    python benchmarks/gpu/l2_probe/warm_flush.py --show benchmarks/gpu/l2_probe/warm_flush.json
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, SOURCE, chunks, profile, run

WRITTEN = (8, 16, 32, 48, 96)  # MiB the kernel before the flush writes
REPEATS = 2


def target() -> None:
    import cupy

    module = cupy.RawModule(code=SOURCE)
    write, read = module.get_function("probe_write"), module.get_function("probe_read")
    W, R = cupy.ones(128 * MiB // 4, dtype=cupy.float32), cupy.ones(256 * MiB // 4, dtype=cupy.float32)
    flush_buffer = cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for _ in range(REPEATS):
        for x in WRITTEN:
            write((GRID,), (BLOCK,), (W, chunks(x)))
            float(flush_buffer.sum())  # the warm sweeps' flush
            read((GRID,), (BLOCK,), (R, chunks(256), same, never))
    cupy.cuda.Device().synchronize()


def mib(kernels: list[dict], metric: str) -> float:
    return sum(k["metrics"].get(metric, 0.0) for k in kernels) / MiB


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(__file__, out, "warm_flush_ncu.csv")
    kernels = parse_ncu_csv(csv_text)
    starts = [i for i, k in enumerate(kernels) if k["name"].startswith("probe_write")]
    if len(starts) != REPEATS * len(WRITTEN):
        raise RuntimeError(f"{len(starts)} write kernels profiled, {REPEATS * len(WRITTEN)} expected")
    rows = []
    for case, (start, end) in enumerate(zip(starts, [*starts[1:], len(kernels)])):
        group = kernels[start:end]
        written, flush, streamed = group[0], group[1:-1], group[-1]
        rows.append({"x_mib": WRITTEN[case % len(WRITTEN)], "repeat": case // len(WRITTEN),
                     "write_kernel_dram_write_mib": mib([written], "dram__bytes_write.sum"),
                     "flush_dram_write_mib": mib(flush, "dram__bytes_write.sum"),
                     "flush_kernels": [k["name"][:60] for k in flush],
                     "read_dram_read_mib": mib([streamed], "dram__bytes_read.sum"),
                     "read_dram_write_mib": mib([streamed], "dram__bytes_write.sum")})
    (out / "warm_flush.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    show(rows)


def show(rows: list[dict]) -> None:
    for r in rows:
        print(f"X = {r['x_mib']:3d} MiB (repeat {r['repeat']}): written back while writing {r['write_kernel_dram_write_mib']:6.2f},"
              f" by the flush {r['flush_dram_write_mib']:6.2f}, by the 256 MiB read after it {r['read_dram_write_mib']:5.2f} MiB")


if __name__ == "__main__":
    run(target, main, lambda path: show(json.loads(path.read_text())["rows"]))
