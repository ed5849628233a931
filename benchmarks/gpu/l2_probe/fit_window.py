"""The window after which a dirty block a kernel reads is written back (simflash.l2.L2Cache.dirty_read_window_bytes,
the machine file's `l2_dirty_read_window_bytes`), chosen on the calibration sweep's fit rows of the naive path (the
only kernels that read what another wrote: the softmax S, the P V GEMM P), reads and writes, cold and warm, 192 in
all: per window, those rows within 10% / 1 MiB, the P V GEMM's warm writes among them, and the hints probe replayed
(hints.json: 24 MiB of W written, then read beside a fresh R of 8, 16, 32 MiB; MiB of W written back, measured
1.11 / 5.67 / 13.69). `none`: no window (the model before). With --unseen, the naive rows of the eight regime
sweeps less the fit set instead, by kernel, cold and warm.

    python benchmarks/gpu/l2_probe/fit_window.py none 16 18 20 22 24 28 32 > benchmarks/gpu/l2_probe/fit_window.txt
    python benchmarks/gpu/l2_probe/fit_window.py --unseen none 20 22 24 >> benchmarks/gpu/l2_probe/fit_window.txt
"""

import sys
from multiprocessing import Pool

import attrs

import hints
import simflash.model.physical as physical
from simflash.chip import l2_cache
from simflash.config import MiB
from simflash.model.calibration import REGIME_SWEEPS, compare, load
from variants import SWEEP_FOLDER, show, summed, tally, unseen_rows

WINDOW = "l2_dirty_read_window_bytes"


def windowed(window_mib: float | None):
    """simflash.chip.l2_cache with the machine file's window replaced (None: no window)."""

    def make(gpu):
        calibration = {k: v for k, v in gpu.calibration.items() if k != WINDOW}
        if window_mib is not None:
            calibration[WINDOW] = window_mib * MiB
        return l2_cache(attrs.evolve(gpu, calibration=calibration))

    return make


def use(window_mib: float | None) -> None:
    physical.l2_cache = windowed(window_mib)  # what compare() predicts with


def fit_rows(mode: str) -> dict:
    rows = compare(load(SWEEP_FOLDER / f"calibration_{mode}.json"), implementations=("naive",), sweep="calibration")
    return tally((c for c in rows if c.subset == "fit"), lambda c: c.kernel)


def main(windows: list[float | None], unseen: bool) -> None:
    for window in windows:
        label = "none" if window is None else f"{window:g} MiB"
        with Pool(2, initializer=use, initargs=(window,)) as pool:
            if unseen:
                parts = pool.starmap(unseen_rows, [(s, m, ("naive",)) for s in REGIME_SWEEPS for m in ("cold", "warm")])
                print(f"window {label}: naive unseen rows: {show(summed([t for t, _ in parts]))}", flush=True)
                continue
            table = summed(pool.map(fit_rows, ["cold", "warm"]))
        replay = " / ".join(f"{hints.predicted_write_bytes(24, y, windowed(window)) / MiB:.2f}" for y in (8, 16, 32))
        ok, n = table["gemm_pv", "warm", "writes"]
        print(f"window {label}: fit rows {sum(c[0] for c in table.values())} of {sum(c[1] for c in table.values())}, "
              f"P V GEMM warm writes {ok} of {n}; hints probe W written back {replay}", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--unseen"]
    main([None if a == "none" else float(a) for a in args], "--unseen" in sys.argv[1:])
