"""Does data every SM reads keep less of the L2 than data one SM reads? FA-2's K and V (every CTA of a
head reads every tile) behave as if the L2 held about 30 MiB; a kernel's own stream, as the first probes
measured, 40 to 50. Here a buffer of X MiB is read, after a read-only flush, in one of three ways:
- `one`: probe_read, each 16-byte chunk by one of 528 CTAs (four an SM);
- `all`: each of the 528 CTAs reads the whole buffer in address order, all starting together, as a
  cohort reads K and V (a line's readers all come within a moment);
- `rotated`: each CTA reads the whole buffer starting at its own place (CTA b at b / 528 of the way)
  and wrapping around, as SDPA's causal CTAs read K and V tiles one after another (a line's readers
  come spread over the whole kernel, the next one after every other line has been read once);
then read once more by one CTA a chunk. Nsight Compute's DRAM bytes of both kernels: the first says
how much a pattern re-fetches while it reads, the second how much of the buffer stayed.

    python benchmarks/gpu/l2_probe/shared.py OUT_DIR     # runs ncu over itself: shared.json, shared_ncu.csv
"""

from pathlib import Path

from probe import BLOCK, GRID, MiB, chunks, read_kernel, read_pairs, run

SIZES = (8, 16, 20, 24, 28, 32, 36, 40, 48, 64)
FIRST_READS = ("one", "all", "rotated")
ALL_READ = r"""
extern "C" __global__ void all_read(const float4* p, unsigned long long n, float* never) {
  float s = 0.f;
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;
}

extern "C" __global__ void rotated_read(const float4* p, unsigned long long n, float* never) {
  const unsigned long long start = n * blockIdx.x / gridDim.x;
  float s = 0.f;
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
    const float4 v = p[(start + i) % n];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;
}
"""


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("probe_read") + read_kernel("flush_read") + ALL_READ)
    read, flush, read_all, read_rotated = (module.get_function(name) for name in
                                           ("probe_read", "flush_read", "all_read", "rotated_read"))
    X, F = cupy.ones(64 * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for first in FIRST_READS:
        for size in SIZES:
            flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
            if first == "one":
                read((GRID,), (BLOCK,), (X, chunks(size), same, never))
            else:
                (read_all if first == "all" else read_rotated)((GRID,), (BLOCK,), (X, chunks(size), never))
            read((GRID,), (BLOCK,), (X, chunks(size), same, never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    read_pairs(__file__, out, "shared", ("probe_read", "all_read", "rotated_read"),
               [{"first_read": first, "x_mib": size} for first in FIRST_READS for size in SIZES])


if __name__ == "__main__":
    run(target, main)
