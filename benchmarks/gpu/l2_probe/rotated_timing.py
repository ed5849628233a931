"""Do rotated readers close into groups? The shared probe's `rotated` pattern (each of 528 CTAs, four an
SM, reads the whole buffer of X MiB starting at its own place, b / 528 of the way, and wrapping around,
as SDPA's causal CTAs read a head's K and V one after another) re-fetches only 0.3% of its re-reads from
DRAM at 32 MiB and 9.2% at 64 MiB, where a least-recently-used cache of any size below X would re-fetch
them all were the readers spread evenly (a line's next reader would come after every other line had been
read once). If the readers bunch up (one that misses waits on DRAM while those behind it, hitting, catch up), a line's
readers come in groups, the first missing and the rest hitting. This probe records when each CTA passes
each 64 KiB of the buffer (thread 0 reads %globaltimer) and its SM, with ncu's DRAM bytes of the same
launches, after a read-only flush each; the readers bare (their pace the L2's and DRAM's: one that hits
goes faster) or each load followed by 256 dependent FP32 operations (a compute pace, about 2 GB/s a CTA,
as SDPA's CTAs go through K and V):

    python benchmarks/gpu/l2_probe/rotated_timing.py OUT_DIR     # ncu over itself: rotated_timing.json,
                                                                  # rotated_timing_ncu.csv, rotated_timing.npz
    python benchmarks/gpu/l2_probe/rotated_timing.py --show benchmarks/gpu/l2_probe/rotated_timing.json

For each X and pace: the kernel's time and DRAM reads beyond X (as a share of the 527 X of re-reads); for every
64 KiB piece of the buffer, its 528 readers' passing times in order (each CTA's timestamps
interpolated to the piece's start), and the gaps between consecutive
readers: spread evenly, every gap is near the mean (the kernel's time / 528); in groups, most gaps are a
small fraction of it and a few are many times it. Printed: the share of gaps under a tenth of the mean,
the share of the time between readers that falls in gaps over twice the mean, and the size of the group a
reader is in, on average over readers (a group: readers each within a tenth of the mean gap of the one
before), over the first and the last fifth of the kernel apart.
"""

import json
import os
from pathlib import Path

import numpy as np
from probe import BLOCK, GRID, MiB, chunks, profile, read_kernel, run

# (X MiB, dependent FP32 operations per 16-byte load): bare readers, whose pace is the L2's and DRAM's, and
# readers held to a compute pace (about 2 GB/s a CTA, as SDPA's CTAs go through K and V)
CASES = [(24, 0), (32, 0), (48, 0), (64, 0), (32, 256), (48, 256), (64, 256)]
SAMPLE_BYTES = 64 * 1024  # a CTA's progress between two timestamps
EVERY = SAMPLE_BYTES // (BLOCK * 16)  # loop iterations between two timestamps (each reads BLOCK chunks of 16 bytes)
STAMPS_ENV = "ROTATED_TIMING_STAMPS"  # where the target saves its timestamps (OUT_DIR/rotated_timing.npz)
TIMED = r"""
extern "C" __global__ void rotated_timed(const float4* p, unsigned long long n, float* never,
                                         unsigned long long* stamps, unsigned int* sm, unsigned int samples,
                                         int spin) {
  const unsigned long long start = n * blockIdx.x / gridDim.x;
  float s = 0.f;
  unsigned long long step = 0;
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x, ++step) {
    if (threadIdx.x == 0 && step % EVERY == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      stamps[(unsigned long long)blockIdx.x * samples + step / EVERY] = t;
    }
    const float4 v = p[(start + i) % n];
    s += v.x + v.y + v.z + v.w;
    for (int k = 0; k < spin; ++k) s = s * 0.999f + 1e-3f;
  }
  if (threadIdx.x == 0) {
    unsigned int id;
    asm("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = id;
  }
  if (s == -1.f) never[0] = s;
}
""".replace("EVERY", str(EVERY))


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("flush_read") + TIMED)
    flush, timed = module.get_function("flush_read"), module.get_function("rotated_timed")
    X, F = cupy.ones(max(size for size, _ in CASES) * MiB // 4, dtype=cupy.float32), cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    saved = {}
    for size, spin in CASES:
        samples = size * MiB // SAMPLE_BYTES
        stamps = cupy.zeros((GRID, samples), dtype=cupy.uint64)
        sm = cupy.zeros(GRID, dtype=cupy.uint32)
        flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
        timed((GRID,), (BLOCK,), (X, chunks(size), never, stamps, sm, cupy.uint32(samples), cupy.int32(spin)))
        cupy.cuda.Device().synchronize()
        # ns from the kernel's first stamp, as each CTA's first and then the steps between (they pack small)
        relative = (stamps - stamps.min()).get().astype(np.int64)
        saved[f"steps_{size}_{spin}"] = np.diff(relative, axis=1, prepend=0).astype(np.uint32)
        saved[f"sm_{size}_{spin}"] = sm.get()
    np.savez_compressed(os.environ[STAMPS_ENV], **saved)


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    out.mkdir(parents=True, exist_ok=True)
    os.environ[STAMPS_ENV] = str(out / "rotated_timing.npz")
    command, csv_text = profile(__file__, out, "rotated_timing_ncu.csv")
    kernels = [k["metrics"] for k in parse_ncu_csv(csv_text) if k["name"].startswith("rotated_timed")]
    if len(kernels) != len(CASES):
        raise RuntimeError(f"{len(kernels)} timed kernels profiled, {len(CASES)} expected")
    rows = [{"x_mib": size, "spin": spin, "dram_read_bytes": k["dram__bytes_read.sum"],
             "time_ns": k["gpu__time_duration.sum"]} for (size, spin), k in zip(CASES, kernels)]
    (out / "rotated_timing.json").write_text(json.dumps({"command": command, "ctas": GRID, "threads": BLOCK,
                                                          "sample_bytes": SAMPLE_BYTES, "rows": rows}, indent=1))
    show(out / "rotated_timing.json")


def passing_times(stamps: np.ndarray, size_bytes: int) -> np.ndarray:
    """(pieces, readers): when each CTA passed the start of each 64 KiB piece of the buffer, in buffer order.
    CTA b starts at 16-byte chunk n * b / grid and stamps every SAMPLE_BYTES from there, wrapping around; its
    passing time at a piece's start is interpolated between the stamps either side."""
    ctas, samples = stamps.shape
    start = (size_bytes // 16 * np.arange(ctas) // ctas) * 16  # bytes
    offset = (np.arange(samples)[None, :] * SAMPLE_BYTES - start[:, None]) % size_bytes / SAMPLE_BYTES
    before = offset.astype(np.int64)  # (ctas, pieces): the stamp just before the piece's start
    rows = np.arange(ctas)[:, None]
    last_step = stamps[:, -1:] - stamps[:, -2:-1]
    after = np.concatenate((stamps[:, 1:], stamps[:, -1:] + last_step), axis=1)  # the stamp after each one
    times = stamps[rows, before] + (offset - before) * (after[rows, before] - stamps[rows, before])
    return times.T


def gap_figures(times: np.ndarray, mean_gap: float, window: tuple[float, float]) -> dict:
    """The gaps between each piece's consecutive readers that begin within `window` (ns): the share under a
    tenth of the mean gap, the share of their time in gaps over twice it, and the size of the group a reader
    is in, on average over readers (a group: readers each within a tenth of the mean gap of the one before)."""
    short, total, long, groups = 0, 0, 0.0, []
    for readers in np.sort(times, axis=1):
        gaps = np.diff(readers)[(readers[:-1] >= window[0]) & (readers[:-1] < window[1])]
        close = gaps < 0.1 * mean_gap
        short += int(close.sum())
        total += gaps.size
        long += float(gaps[gaps > 2 * mean_gap].sum()) / max(float(gaps.sum()), 1.0) * gaps.size
        edges = np.flatnonzero(np.diff(np.concatenate(([0], close.astype(np.int8), [0]))))
        runs = list(edges[1::2] - edges[::2] + 1)  # each run of short gaps joins that many + 1 readers
        groups += runs + [1] * (gaps.size + 1 - sum(runs))  # and the readers with no close neighbour
    sizes = np.array(groups or [1], dtype=float)
    return {"short": short / max(total, 1), "time_in_long": long / max(total, 1),
            "group": float((sizes**2).sum() / sizes.sum())}


def show(path: Path) -> None:
    report = json.loads(path.read_text())
    saved = np.load(path.with_suffix(".npz"))
    ctas = report["ctas"]
    print(f"{ctas} CTAs each reading the whole buffer from its own place; gaps between a 64 KiB piece's "
          "consecutive readers, against the mean gap (the kernel's span / CTAs)")
    print("X MiB  spin  time us  tick ns  DRAM beyond X MiB  of re-reads  | first fifth: short  in long  group"
          "  | last fifth: short  in long  group")
    for row in report["rows"]:
        size, spin = row["x_mib"], row["spin"]
        stamps = np.cumsum(saved[f"steps_{size}_{spin}"].astype(np.int64), axis=1)
        ticks = np.diff(np.unique(stamps))
        times = passing_times(stamps, size * MiB)
        span = float(stamps.max() - stamps.min())
        mean_gap = span / ctas
        beyond = row["dram_read_bytes"] - size * MiB
        cells = []
        for lo, hi in ((0.0, 0.2), (0.8, 1.0)):
            figures = gap_figures(times, mean_gap, (lo * span, hi * span))
            cells.append(f"{figures['short']:18.2f}  {figures['time_in_long']:7.2f}  {figures['group']:5.1f}")
        print(f"{size:5d}  {spin:4d}  {row['time_ns'] / 1e3:7.0f}  {int(ticks.min()) if ticks.size else 0:7d}  "
              f"{beyond / MiB:17.1f}  {beyond / (size * MiB * (ctas - 1)):11.2%}  | {cells[0]}  | {cells[1]}")


if __name__ == "__main__":
    run(target, main, show)
