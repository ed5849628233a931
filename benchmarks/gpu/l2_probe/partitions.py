"""Does a line read from another SM take a second place in the L2? Read a buffer of X MiB from DRAM,
then read it again, each 16-byte chunk by the CTA `shift` places after the one that read it first (a
grid of 4 CTAs per SM: shift 0 and 264 on the same SM as CTAs go out round-robin, 1, 33 and 66 on
others, some of them across the chip), a read-only flush before each pair; Nsight Compute's DRAM bytes
of the second read.

    python benchmarks/gpu/l2_probe/partitions.py OUT_DIR     # runs ncu over itself: partitions.json, partitions_ncu.csv
"""

import json
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
SOURCE = r"""
extern "C" __global__ void probe_read(const float4* p, unsigned long long n, int shift, float* never) {
  const unsigned long long block = (blockIdx.x + shift) % gridDim.x;
  float s = 0.f;
  for (unsigned long long i = block * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;  // keeps the reads; never true for these buffers
}
extern "C" __global__ void flush_read(const float4* p, unsigned long long n, float* never) {
  float s = 0.f;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;
}
"""
SIZES = (8, 16, 20, 24, 28, 32, 40, 48, 64)
GRID, BLOCK = 132 * 4, 256
SHIFTS = (0, 1, 33, 66, 264)
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def target() -> None:
    import cupy

    module = cupy.RawModule(code=SOURCE)
    read, flush = module.get_function("probe_read"), module.get_function("flush_read")
    X, F = cupy.ones(128 * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never = cupy.zeros(1, dtype=cupy.float32)
    for shift in SHIFTS:
        for size in SIZES:
            n = cupy.uint64(size * MiB // 16)
            flush((GRID,), (BLOCK,), (F, cupy.uint64(512 * MiB // 16), never))
            read((GRID,), (BLOCK,), (X, n, cupy.int32(0), never))
            read((GRID,), (BLOCK,), (X, n, cupy.int32(shift), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from simflash.backends.profile import parse_ncu_csv

    command = ["ncu", "--clock-control", "none", "--cache-control", "none", "--replay-mode", "application",
               "--csv", "--print-units", "base", "--metrics", ",".join(METRICS), sys.executable, __file__, "--target"]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "partitions_ncu.csv").write_text(run.stdout)
    kernels = [k for k in parse_ncu_csv(run.stdout) if k["name"].startswith("probe_read")]
    rows = []
    for at, (shift, size) in enumerate((s, x) for s in SHIFTS for x in SIZES):
        first, second = kernels[2 * at], kernels[2 * at + 1]
        rows.append({"x_mib": size, "second_read_shift": shift,
                     "first_dram_read_bytes": first["metrics"]["dram__bytes_read.sum"],
                     "second_dram_read_bytes": second["metrics"]["dram__bytes_read.sum"]})
        print(f"X={size:3d} shift={shift:3d}  second read misses {rows[-1]['second_dram_read_bytes'] / MiB:6.1f} MiB")
    (out / "partitions.json").write_text(json.dumps({"command": " ".join(command), "rows": rows}, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--target"]:
        target()
    else:
        main(Path(sys.argv[1]))
