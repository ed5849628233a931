"""SDPA's stack frames as L2 capacity its data cannot use: tried on every sweep's SDPA rows, not kept.

PyTorch's FA-2 kernel spills: its threads store to local memory all the time and those stores reach the
L2 (benchmarks/gpu/write_sources.json), so the resident threads' frames stay there. This takes them off
the capacity of both of the model's LRU caches (stack bytes a thread, from the compiled kernel's resource
usage in the machine file's comment, x 128 threads x the resident CTAs: 3.6 MiB at d = 64 without the
mask, 4.4 to 4.6 MiB otherwise), refits the spill-write figures on the calibration sweep's fit set with
the frames in place, as the model's own were fitted, and counts the SDPA rows of all eight sweeps within
10% / 1 MiB, with the read errors' 90th percentile and worst case (by absolute value), against the model:

    python benchmarks/gpu/sdpa_kv_order/frames.py > benchmarks/gpu/sdpa_kv_order/frames.txt

(frames.txt was made when the model's L2 was the mixture of two LRU caches; with hashed sets each set
gives up its share of the frames.)
"""

from __future__ import annotations

import json
from multiprocessing import Pool
from pathlib import Path

import attrs

import simflash.model.calibration as calibration
import simflash.model.physical as physical
from simflash.chip import kernel_profile, resident_ctas
from simflash.config import gpu_spec
from simflash.l2 import L2Sets
from simflash.model.calibration import REGIME_REPORTS, REGIME_SWEEPS, compare, fit_spill_writes

ROOT = Path(__file__).resolve().parents[1]
STACK_BYTES = {(64, False): 112, (64, True): 136, (128, False): 144, (128, True): 136}  # a thread, sm_90 fp16
MODEL_PREDICT = physical.predict
MODEL_L2 = physical.l2_cache


def predict_with_frames(algorithm, n, d, *, kernel="simflash", causal=False, **options):
    """The model's prediction, SDPA's L2 caches smaller by its resident threads' frames."""
    profile = kernel_profile(kernel)
    frames = 0
    if kernel == "sdpa_flash":
        block_q, block_kv = profile.tiles(d)
        slots = resident_ctas(gpu_spec("H200"), profile, block_q, block_kv, d, 2)
        frames = slots * profile.threads(block_q, block_kv, d) * STACK_BYTES[d, causal]

    def smaller(spec):
        l2 = MODEL_L2(spec)
        share = 1 / len(l2.caches) if isinstance(l2, L2Sets) else 1  # a set holds its share of the capacity
        for cache in l2.caches:
            cache.capacity_bytes -= frames * share
        return l2

    physical.l2_cache = smaller
    try:
        return MODEL_PREDICT(algorithm, n, d, kernel=kernel, causal=causal, **options)
    finally:
        physical.l2_cache = MODEL_L2


def sweep_rows(job: tuple[str, str, dict]) -> list[tuple[str, float, float]]:
    """(cache, predicted, measured) DRAM reads and writes of one sweep file's SDPA rows, with the frames."""
    sweep, mode, spec_calibration = job
    calibration.predict = predict_with_frames
    spec = attrs.evolve(gpu_spec("H200"), calibration=spec_calibration)
    measurement = json.loads((ROOT / f"{sweep}_{mode}.json").read_text())
    return [(mode, key, c.predicted[key], c.measured[key])
            for c in compare(measurement, gpu=spec, implementations=("sdpa_flash",), sweep=sweep)
            for key in ("dram_read_bytes", "dram_write_bytes")]


def show(label: str, rows: list[tuple[str, str, float, float]]) -> None:
    for mode in ("cold", "warm"):
        for key in ("dram_read_bytes", "dram_write_bytes"):
            cell = [(p, m) for cache, k, p, m in rows if cache == mode and k == key]
            ok = sum(calibration.within(p, m) for p, m in cell)
            errors = sorted(((p - m) / m for p, m in cell), key=abs)
            print(f"{label}: {mode} {key[5:-6]}s {ok} of {len(cell)} within 10% / 1 MiB, error p90 "
                  f"{errors[int(0.9 * len(errors))]:+.0%}, worst {errors[-1]:+.0%}")


def main() -> None:
    model = [(r["cache"], key, r["predicted"][key], r["measured"][key])
             for name in REGIME_REPORTS.values() for r in json.loads((ROOT / name).read_text())["rows"]
             if r["implementation"] == "sdpa_flash" for key in ("dram_read_bytes", "dram_write_bytes")]
    show("model (the committed reports)", model)
    calibration.predict = predict_with_frames
    fitted = fit_spill_writes([json.loads((ROOT / f"calibration_{mode}.json").read_text()) for mode in ("cold", "warm")])
    print("spill figures refitted with the frames: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(fitted.items())))
    spec_calibration = {**gpu_spec("H200").calibration, **fitted}
    with Pool(2) as pool:
        rows = pool.map(sweep_rows, [(sweep, mode, spec_calibration) for sweep in REGIME_SWEEPS for mode in ("cold", "warm")])
    show("frames", [row for part in rows for row in part])


if __name__ == "__main__":
    main()
