"""The window after which a dirty block a kernel reads is written back (simflash.l2.L2Cache.dirty_read_window_bytes,
the machine file's `l2_dirty_read_window_bytes`), chosen on the calibration sweep's fit rows of the naive path (the
only kernels that read what another wrote: the softmax S, the P V GEMM P), reads and writes, cold and warm, 192 in
all: per window, those rows within 10% / 1 MiB, the P V GEMM's warm writes among them, and the hints probe replayed
(hints.json: 24 MiB of W written, then read beside a fresh R of 8, 16, 32 MiB; MiB of W written back, measured
1.11 / 5.67 / 13.69). `none`: no window (the model before). With --unseen, the naive rows of the eight regime
sweeps less the fit set instead, by kernel, cold and warm. With --fills, the window counted in bytes brought in
(read misses and writes, at full size) rather than bytes read (tried, not kept).

    python benchmarks/gpu/l2_probe/fit_window.py none 16 18 20 22 24 28 32 > benchmarks/gpu/l2_probe/fit_window.txt
    python benchmarks/gpu/l2_probe/fit_window.py --unseen none 20 22 24 28 >> benchmarks/gpu/l2_probe/fit_window.txt
    python benchmarks/gpu/l2_probe/fit_window.py --fills none 4 6 8 10 12 14 16 20 24 >> ...
    python benchmarks/gpu/l2_probe/fit_window.py --fills --unseen 12 >> ...
"""

import sys
from multiprocessing import Pool

import attrs

import hints
import simflash.chip as chip
import simflash.model.physical as physical
from simflash.config import MiB
from simflash.l2 import L2Cache
from simflash.model.calibration import REGIME_SWEEPS, compare, load, without_figures
from variants import SWEEP_FOLDER, show, summed, tally, unseen_rows

WINDOW = "l2_dirty_read_window_bytes"


class FillWindowL2(L2Cache):
    """The window counted in bytes brought in (read misses and writes) since the dirty block was read."""

    def _through_window(self, window, key, nbytes, dirty):
        if dirty:
            self._dirty_reads.append((self._filled, key))

    def _insert(self, key, nbytes, dirty, cost):
        super()._insert(key, nbytes, dirty, cost)
        self._clean_behind(self._filled - self.dirty_read_window_bytes)


def windowed(window_mib: float | None, fills: bool = False):
    """simflash.chip.l2_cache with the machine file's window replaced (None: no window), counted in bytes read or,
    with `fills`, brought in."""

    def make(gpu):
        bare = without_figures(gpu, WINDOW)
        window = {} if window_mib is None else {WINDOW: window_mib * MiB}
        chip.L2Cache = FillWindowL2 if fills else L2Cache  # what chip.l2_cache builds its sets of
        return chip.l2_cache(attrs.evolve(bare, calibration={**bare.calibration, **window}))

    return make


def use(window_mib: float | None, fills: bool) -> None:
    physical.l2_cache = windowed(window_mib, fills)  # what compare() predicts with


def fit_rows(mode: str) -> dict:
    rows = compare(load(SWEEP_FOLDER / f"calibration_{mode}.json"), implementations=("naive",), sweep="calibration")
    return tally((c for c in rows if c.subset == "fit"), lambda c: c.kernel)


def main(windows: list[float | None], unseen: bool, fills: bool) -> None:
    for window in windows:
        label = ("none" if window is None else f"{window:g} MiB") + (" of fills" if fills else "")
        with Pool(2, initializer=use, initargs=(window, fills)) as pool:
            if unseen:
                parts = pool.starmap(unseen_rows, [(s, m, ("naive",)) for s in REGIME_SWEEPS for m in ("cold", "warm")])
                print(f"window {label}: naive unseen rows: {show(summed([t for t, _ in parts]))}", flush=True)
                continue
            table = summed(pool.map(fit_rows, ["cold", "warm"]))
        replay = " / ".join(f"{hints.predicted_write_bytes(24, y, windowed(window, fills)) / MiB:.2f}" for y in (8, 16, 32))
        ok, n = table["gemm_pv", "warm", "writes"]
        print(f"window {label}: fit rows {sum(c[0] for c in table.values())} of {sum(c[1] for c in table.values())}, "
              f"P V GEMM warm writes {ok} of {n}; hints probe W written back {replay}", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main([None if a == "none" else float(a) for a in args], "--unseen" in sys.argv[1:], "--fills" in sys.argv[1:])
