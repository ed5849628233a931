"""How far apart, in the model's lock-step schedule, are the reads of a K or V tile that SDPA's causal
kernel makes one CTA after another, for the configurations of heads.py?

A tile a CTA reads after another CTA read it (never a cohort at once: each CTA starts at its own diagonal)
is a re-read; its distance is the bytes the L2 served between the two reads. Per configuration: the
measured share of the K and V re-reads that reached DRAM (heads.json) and the 10th, 50th and 90th
percentiles of the distance, weighted by bytes. If the measured misses followed the distance, the same
distances would miss alike; at N = 65,536 they do not (2 heads against 12).

    python benchmarks/gpu/sdpa_kv_order/distances.py benchmarks/gpu/sdpa_kv_order/heads.json
"""

import json
import sys
from pathlib import Path

import attrs
import numpy as np
from floor import kv_rereads

import simflash.model.physical as physical
from simflash.config import MiB
from simflash.l2 import L2Cache


@attrs.define
class DistanceCache(L2Cache):
    """The model's LRU cache (one capacity) that also records each one-CTA re-read's distance and bytes."""

    served: int = 0
    last_read: dict = attrs.field(factory=dict)
    distances: list = attrs.field(factory=list)  # (distance, bytes)

    def read(self, key, nbytes, count=1, shared=False):
        self.served += nbytes
        last = self.last_read.get(key)
        self.last_read[key] = self.served
        block = self._blocks.get(key)
        if last is not None and count == 1 and (block is None or not block[1]):
            self.distances.append((self.served - last, nbytes))
        super().read(key, nbytes, count, shared)

    def write(self, key, nbytes):
        self.served += nbytes
        super().write(key, nbytes)


def distances(config: dict) -> np.ndarray:
    """(distance, bytes) of every one-CTA re-read of a configuration, SDPA's kernel, cold."""
    caches = []

    def l2_cache(gpu):
        cal = gpu.calibration
        caches.append(DistanceCache(cal["l2_effective_bytes"], cal["l2_read_fill_weight"],
                                    cohort_weight=cal["l2_cohort_weight"]))
        return caches[-1]

    physical.l2_cache = l2_cache  # what predict() builds its L2 with
    physical.predict("fa2", config["n"], config["d"], heads=config["heads"], causal=config["causal"],
                     kernel="sdpa_flash", cache="cold")
    return np.array(caches[0].distances, dtype=float)


def percentiles(pairs: np.ndarray, shares=(0.1, 0.5, 0.9)) -> list[float]:
    order = np.argsort(pairs[:, 0])
    weight = np.cumsum(pairs[order, 1])
    return [pairs[order[np.searchsorted(weight, s * weight[-1])], 0] for s in shares]


def main(path: Path) -> None:
    print("N       heads  measured miss share of K/V re-reads  re-read distance MiB: p10 / p50 / p90")
    for entry in json.loads(path.read_text())["configs"]:
        c = entry["config"]
        if c["algorithm"] != "sdpa_flash":
            continue
        beyond = sum(k["dram_read_bytes"] for k in entry["kernels"]) - 3 * c["n"] * c["d"] * 2 * c["heads"]
        p10, p50, p90 = (x / MiB for x in percentiles(distances(c)))
        print(f"{c['n']:<7d} {c['heads']:<6d} {100 * beyond / kv_rereads(c):34.2f}%  {p10:21.1f} / {p50:.1f} / {p90:.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
