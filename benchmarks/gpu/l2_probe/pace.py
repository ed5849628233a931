"""Does the H200's L2 write dirty data back at a pace of its own, or only when something evicts it? The naive
P V GEMM, warm, writes back the P the softmax left dirty at 0.4 to 1.1 TB/s while it runs, whether its reads
hit or miss (benchmarks/gpu/naive_warm/pv_writes.txt), more than its fills evict in the model. Here, after a
read-only flush, a kernel writes X MiB (dirty, X up to about the L2's dirty capacity) and then either

- `reread`: a kernel reads them back, each load followed by `spin` dependent FP32 operations, so that the
  same hits take longer with more spin (no fills beyond X: what it writes back is not evicted by a fill); or
- `idle`: a kernel that touches no memory runs for about as long, then the buffer is read back at full
  speed: what the idle kernel writes is write-back with no access at all.

Application replay, no cache control, as the warm sweeps are measured.

    python benchmarks/gpu/l2_probe/pace.py OUT_DIR     # runs ncu over itself: pace.json, pace_ncu.csv
    python benchmarks/gpu/l2_probe/pace.py --show benchmarks/gpu/l2_probe/pace.json
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, SOURCE, chunks, kernel_row, profile, run

WRITTEN = (16, 24, 28, 32)  # MiB written, then read back
SPINS = (0, 256, 2048)  # dependent FP32 operations after each 16-byte load of the read back
PACE_SOURCE = SOURCE + r"""
extern "C" __global__ void pace_reread(const float4* p, unsigned long long n, int spin, float* never) {
  float s = 0.f;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
    for (int k = 0; k < spin; ++k) s = s * 0.999f + 1e-3f;
  }
  if (s == -1.f) never[0] = s;
}
extern "C" __global__ void pace_idle(unsigned long long n, int spin, float* never) {
  float s = threadIdx.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    for (int k = 0; k < spin; ++k) s = s * 0.999f + 1e-3f;
  if (s == -1.f) never[0] = s;
}
"""


def target() -> None:
    import cupy

    module = cupy.RawModule(code=PACE_SOURCE)
    write, flush = module.get_function("probe_write"), module.get_function("flush_read")
    reread, idle = module.get_function("pace_reread"), module.get_function("pace_idle")
    W, F = cupy.ones(64 * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    grid, block = (GRID,), (BLOCK,)
    for pattern in ("reread", "idle"):
        for x in WRITTEN:
            for spin in SPINS:
                flush(grid, block, (F, chunks(512), same, never))
                write(grid, block, (W, chunks(x)))
                if pattern == "reread":
                    reread(grid, block, (W, chunks(x), cupy.int32(spin), never))
                else:
                    idle(grid, block, (chunks(x), cupy.int32(spin), never))
                    reread(grid, block, (W, chunks(x), cupy.int32(0), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(__file__, out, "pace_ncu.csv")
    kernels = [k for k in parse_ncu_csv(csv_text) if k["name"].startswith(("probe_write", "pace_"))]
    rows, at = [], 0
    for pattern in ("reread", "idle"):
        for x in WRITTEN:
            for spin in SPINS:
                steps = 2 if pattern == "reread" else 3
                group = kernels[at:at + steps]
                at += steps
                rows.append({"pattern": pattern, "x_mib": x, "spin": spin, "kernels": [kernel_row(k) for k in group]})
    if at != len(kernels):
        raise RuntimeError(f"{len(kernels)} probe kernels profiled, {at} expected")
    (out / "pace.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    show(rows)


def show(rows: list[dict]) -> None:
    for r in rows:
        cells = "  ".join(f"{k['name']}: R {k['dram_read_bytes'] / MiB:6.2f} W {k['dram_write_bytes'] / MiB:6.2f} MiB"
                          f" in {k['time_ns'] / 1e3:7.1f} us" for k in r["kernels"])
        print(f"{r['pattern']:6s} X = {r['x_mib']:2d} MiB, spin {r['spin']:3d}:  {cells}")


if __name__ == "__main__":
    run(target, main, lambda path: show(json.loads(path.read_text())["rows"]))
