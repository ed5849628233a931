"""How much of a buffer that CTAs read one after another does the L2 keep, as the buffer outgrows it? Each of
528 CTAs (four an SM) reads the whole buffer of X MiB, starting at its own place and wrapping around (the
`rotated` readers of shared.py and rotated_timing.py, as SDPA's causal CTAs read a head's K and V), each
load followed by 256 dependent FP32 operations (a compute pace, as SDPA's CTAs go through K and V). Were
the readers spread evenly, a line's next reader would come after every other line had been read once and
a least-recently-used cache smaller than X would re-fetch every re-read (how far apart they really come:
rotated_distances.py). Beside them, for comparison, the same readers all starting
at the start (`together`: a line's readers all come within a moment, as a cohort reads K and V); and the
rotated readers split into 2, 4 or 8 heads in launch order, each head's CTAs reading its own share of the
buffer (X / heads) one after another, so that a line's re-read distance is still X (the other heads'
lines come between) while the CTAs of one head stay together, as SDPA's grid runs heads. Nsight Compute's
DRAM bytes, after a read-only flush each:

    python benchmarks/gpu/l2_probe/retention.py OUT_DIR     # ncu over itself: retention.json, retention_ncu.csv
    python benchmarks/gpu/l2_probe/retention.py --show benchmarks/gpu/l2_probe/retention.json

And one head's rotated readers stopped after 1/16, 1/8, 1/4 or 1/2 of the buffer (each line still read,
by 1/16 ... 1/2 of the CTAs): whether the misses come at a steady rate or early, before the L2 settles.
Printed: for each case, the DRAM reads beyond X as a share of the re-reads (a line's readers less one,
over X), and the share a re-read finds in the L2 (1 - that).
"""

import json
from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, profile_cases, read_kernel, run

SIZES = (32, 40, 48, 56, 60, 64, 72, 80, 96, 128)
PATTERNS = ("rotated", "together")
HEADS = (2, 4, 8)  # rotated readers split into heads, at these sizes
HEAD_SIZES = (48, 64, 96)
SPIN = 256
PARTS = (16, 8, 4, 2)  # one head's rotated readers stopped after 1 / parts of the buffer, at these sizes
PART_SIZES = (64, 96)
CASES = [(pattern, size, 1, 1) for pattern in PATTERNS for size in SIZES] + [
    ("rotated", size, heads, 1) for heads in HEADS for size in HEAD_SIZES] + [
    ("rotated", size, 1, parts) for size in PART_SIZES for parts in PARTS]
PACED = r"""
extern "C" __global__ void paced_read(const float4* p, unsigned long long n, int rotated, int heads, int parts,
                                      int spin, float* never) {
  const unsigned int head = blockIdx.x * heads / gridDim.x;  // CTAs in launch order, a head's together
  const unsigned int first = (head * gridDim.x + heads - 1) / heads, readers = ((head + 1) * gridDim.x + heads - 1) / heads - first;
  const unsigned long long m = n / heads;  // a head's share of the buffer, its own lines
  const unsigned long long start = rotated ? m * (blockIdx.x - first) / readers : 0;
  float s = 0.f;
  for (unsigned long long i = threadIdx.x; i < m / parts; i += blockDim.x) {
    const float4 v = p[head * m + (start + i) % m];
    s += v.x + v.y + v.z + v.w;
    for (int k = 0; k < spin; ++k) s = s * 0.999f + 1e-3f;
  }
  if (s == -1.f) never[0] = s;
}
"""


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("flush_read") + PACED)
    flush, paced = module.get_function("flush_read"), module.get_function("paced_read")
    X, F = cupy.ones(max(SIZES) * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for pattern, size, heads, parts in CASES:
        flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
        paced((GRID,), (BLOCK,), (X, chunks(size), cupy.int32(pattern == "rotated"), cupy.int32(heads),
                                  cupy.int32(parts), cupy.int32(SPIN), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    profile_cases(__file__, out, "retention", "paced_read",
                  [{"pattern": pattern, "x_mib": size, "heads": heads, "parts": parts, "spin": SPIN}
                   for pattern, size, heads, parts in CASES], show)


def show(path: Path) -> None:
    report = json.loads(path.read_text())
    ctas = report["ctas"]
    print(f"{ctas} CTAs each reading the whole buffer, {SPIN} dependent FP32 operations a load")
    print("pattern    heads  read  X MiB  time us  DRAM beyond X MiB  of re-reads  found again")
    for row in report["rows"]:
        beyond = row["dram_read_bytes"] - row["x_mib"] * MiB
        share = beyond / (row["x_mib"] * MiB * (ctas / row["heads"] / row["parts"] - 1))
        print(f"{row['pattern']:9s}  {row['heads']:5d}  1/{row['parts']:<2d}  {row['x_mib']:5d}  {row['time_ns'] / 1e3:7.0f}"
              f"  {beyond / MiB:17.1f}  {share:11.2%}  {1 - share:11.2%}")


if __name__ == "__main__":
    run(target, main, show)
