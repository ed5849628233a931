"""What re-read distances did the timed rotated readers (rotated_timing.py) see, and what would a least-
recently-used cache of C MiB have missed at them? For a sample of re-reads (a 64 KiB piece read by one
reader after another: each piece's passing times in order), the distance is the distinct bytes all the
readers went through between the two reads: the union, around the buffer, of each reader's progress over
that time (its timestamps interpolated). A re-read misses in an LRU cache of C MiB when that distance is
over C. Beside ncu's measured share, for the whole run and its first and last fifths:

    python benchmarks/gpu/l2_probe/rotated_distances.py > benchmarks/gpu/l2_probe/rotated_distances.txt
"""

import json
from pathlib import Path

import numpy as np
from probe import MiB
from rotated_timing import SAMPLE_BYTES, passing_times

HERE = Path(__file__).resolve().parent
CAPACITIES = (28.5, 40, 50, 60)  # MiB
SAMPLED = 20000  # re-reads drawn per case (seeded)


def distances(stamps: np.ndarray, size_bytes: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """MiB of distinct pieces the readers went through between times `first` and `second` (one re-read each)."""
    ctas, samples = stamps.shape
    start = (size_bytes // 16 * np.arange(ctas) // ctas) * 16 / SAMPLE_BYTES  # each reader's start, in pieces
    ends = np.concatenate((stamps, 2 * stamps[:, -1:] - stamps[:, -2:-1]), axis=1).astype(float)
    pieces = np.arange(samples + 1)
    before = np.stack([np.interp(first, ends[r], pieces) for r in range(ctas)], axis=1)  # (re-reads, readers)
    after = np.stack([np.interp(second, ends[r], pieces) for r in range(ctas)], axis=1)
    lo = (start[None, :] + before) % samples
    hi = lo + np.minimum(after - before, samples)
    starts = np.concatenate((lo, np.zeros_like(lo)), axis=1)  # an arc past the end goes on from 0
    stops = np.concatenate((np.minimum(hi, samples), np.maximum(hi - samples, 0)), axis=1)
    order = np.argsort(starts, axis=1)
    starts, stops = np.take_along_axis(starts, order, 1), np.take_along_axis(stops, order, 1)
    reached = np.concatenate((np.full((len(first), 1), -1.0), np.maximum.accumulate(stops, axis=1)[:, :-1]), axis=1)
    return np.clip(stops - np.maximum(starts, reached), 0, None).sum(axis=1) * SAMPLE_BYTES / MiB


def main() -> None:
    report = json.loads((HERE / "rotated_timing.json").read_text())
    saved = np.load(HERE / "rotated_timing.npz")
    rng = np.random.default_rng(0)
    print("re-reads missed: measured (ncu), and an LRU cache of C MiB at the distances the timestamps give "
          "(whole run; first fifth / last fifth)")
    print("X MiB  spin  measured  median distance MiB  " + "  ".join(f"LRU {c} MiB" for c in CAPACITIES))
    for row in report["rows"]:
        size, spin = row["x_mib"], row["spin"]
        stamps = np.cumsum(saved[f"steps_{size}_{spin}"].astype(np.int64), axis=1)
        readers = np.sort(passing_times(stamps, size * MiB), axis=1)
        first, second = readers[:, :-1].ravel(), readers[:, 1:].ravel()
        pick = rng.choice(first.size, size=min(SAMPLED, first.size), replace=False)
        first, second = first[pick], second[pick]
        far = distances(stamps, size * MiB, first, second)
        span = float(stamps.max())
        early, late = second < 0.2 * span, second > 0.8 * span
        measured = (row["dram_read_bytes"] - size * MiB) / (size * MiB * (report["ctas"] - 1))
        cells = [f"{(far > c).mean():6.2%} ({(far[early] > c).mean():5.1%} / {(far[late] > c).mean():4.1%})"
                 for c in CAPACITIES]
        print(f"{size:5d}  {spin:4d}  {measured:8.2%}  {np.median(far):19.1f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
