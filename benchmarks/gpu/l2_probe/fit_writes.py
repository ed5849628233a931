"""The DRAM writes of simflash's FA-2 kernel on the calibration sweep's fit rows (cold and warm), with O written
holding each given share of its size in the L2 (variants.py's `flash-writes-W`): rows within 10% / 1 MiB, and
the error predicted less measured in MiB (median, sum of absolute values).

    python benchmarks/gpu/l2_probe/fit_writes.py 1.0 1.1 1.25 > benchmarks/gpu/l2_probe/fit_writes.txt
"""

import statistics
import sys

import simflash.model.physical as physical
from simflash.algorithms import flash2
from simflash.config import MiB
from simflash.model.calibration import compare, load
from variants import SWEEP_FOLDER, l2_of


def main(weights: list[float]) -> None:
    measurements = [load(SWEEP_FOLDER / f"calibration_{mode}.json") for mode in ("cold", "warm")]
    print("O's weight | fit rows within | error MiB: median, absolute sum")
    for weight in weights:
        physical.l2_cache = l2_of({"kernel_write_weights": {flash2.KERNEL: weight}})  # what compare() predicts with
        rows = [c for measurement in measurements
                for c in compare(measurement, implementations=("fa2",), sweep="calibration") if c.subset == "fit"]
        errors = [(c.predicted["dram_write_bytes"] - c.measured["dram_write_bytes"]) / MiB for c in rows]
        ok = sum(c.ok("dram_write_bytes") for c in rows)
        print(f"{weight:10.2f} | {ok:7d} of {len(rows):3d} | {statistics.median(errors):+6.2f} "
              f"{sum(map(abs, errors)):6.1f}", flush=True)


if __name__ == "__main__":
    main([float(w) for w in sys.argv[1:]])
