"""Kernel v2 against SDPA flash, one call of each in turn, many times over: the ratio of each pair's
times, so that clock and thermal drift between the two kernels' timing blocks (which `simflash gpu
bench` times one after the other) cancels out. Each call is timed as `simflash gpu bench` times it
(CUDA events, the device held busy ahead of the start event so the host's launch time is left out).

    python benchmarks/gpu/v2_paired/paired.py OUT.json [pairs]

fp16, B = 1, H = 32, v2 at 128x64; N in {4096, 16384}, d in {64, 128}, causal and not. Per
configuration: the median time of each kernel and the median, quartiles and extremes of the per-pair
ratio SDPA time / v2 time (above 1: v2 faster)."""

import functools
import json
import statistics
import sys

import cupy
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from simflash.backends.bench import time_once
from simflash.backends.flash2 import kernel_version, launch, poisoned_output
from simflash.schedule import TileSchedule


def pair_ratios(n: int, d: int, causal: bool, pairs: int, seed: int) -> dict:
    heads = 32
    rng = cupy.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((heads, n, d), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    O = poisoned_output(Q.shape, "float16")
    kernel = kernel_version("v2")("float16", 128, 64, d)
    sched = TileSchedule(n, n, 128, 64, causal=causal)
    ours = functools.partial(launch, kernel, Q, K, V, O, sched, 1.0 / float(np.sqrt(d)))
    q, k, v = (torch.from_dlpack(x).view(1, heads, n, d) for x in (Q, K, V))
    theirs = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(3):
            ours(), theirs()
        times = [(time_once(ours), time_once(theirs)) for _ in range(pairs)]
    ratios = sorted(t_sdpa / t_v2 for t_v2, t_sdpa in times)
    flops = 4 * heads * n * n * d // (2 if causal else 1)
    med_v2, med_sdpa = statistics.median(t for t, _ in times), statistics.median(t for _, t in times)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {"n": n, "d": d, "causal": causal, "pairs": pairs, "seed": seed,
            "v2_ms": med_v2, "sdpa_flash_ms": med_sdpa,
            "v2_tflops": flops / med_v2 / 1e9, "sdpa_flash_tflops": flops / med_sdpa / 1e9,
            "ratio_median": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
            "ratio_min": ratios[0], "ratio_max": ratios[-1]}


def main() -> None:
    out, pairs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rows = []
    for n in (4096, 16384):
        for d in (64, 128):
            for causal in (False, True):
                row = pair_ratios(n, d, causal, pairs if n == 4096 else pairs // 4, seed=len(rows))
                rows.append(row)
                print(f"N={n} d={d} causal={causal}: v2 {row['v2_tflops']:.1f} TFLOP/s, SDPA flash "
                      f"{row['sdpa_flash_tflops']:.1f}; SDPA/v2 time per pair median {row['ratio_median']:.4f} "
                      f"(quartiles {row['ratio_q1']:.4f}-{row['ratio_q3']:.4f}, {row['ratio_min']:.3f}-"
                      f"{row['ratio_max']:.3f})", flush=True)
    with open(out, "w") as f:
        json.dump({"command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
