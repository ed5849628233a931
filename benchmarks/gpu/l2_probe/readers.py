"""How much L2 room does a line take as the number of SMs reading it grows? A buffer of X MiB is read,
after a read-only flush, by 528 CTAs (four an SM) in groups of k: the CTAs of a group start together and
read the same chunks, each group its own share of the buffer (k = 1: one CTA a chunk; k = 528: every
CTA the whole buffer, shared.py's `all`); then read once more by one CTA a chunk. Nsight Compute's DRAM
bytes of the second read say how much of the buffer stayed.

    python benchmarks/gpu/l2_probe/readers.py OUT_DIR     # runs ncu over itself: readers.json, readers_ncu.csv
"""

from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, read_kernel, read_pairs, run

SIZES = (32, 36, 40)
READERS = (1, 2, 4, 16, 66, 132, 528)  # divisors of GRID
GROUP_READ = r"""
extern "C" __global__ void group_read(const float4* p, unsigned long long n, int readers, float* never) {
  const unsigned long long groups = gridDim.x / readers, group = blockIdx.x % groups;
  float s = 0.f;
  for (unsigned long long i = group * blockDim.x + threadIdx.x; i < n; i += groups * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;
}
"""


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("probe_read") + read_kernel("flush_read") + GROUP_READ)
    read, flush, group_read = (module.get_function(name) for name in ("probe_read", "flush_read", "group_read"))
    X, F = cupy.ones(64 * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for readers in READERS:
        for size in SIZES:
            flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
            group_read((GRID,), (BLOCK,), (X, chunks(size), cupy.int32(readers), never))
            read((GRID,), (BLOCK,), (X, chunks(size), same, never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    read_pairs(__file__, out, "readers", ("probe_read", "group_read"),
               [{"readers": readers, "x_mib": size} for readers in READERS for size in SIZES])


if __name__ == "__main__":
    run(target, main)
