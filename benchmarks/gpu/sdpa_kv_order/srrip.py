"""The heads probe (heads.json) through an L2 with re-reference-interval replacement (SRRIP) in place of the
model's least-recently-used caches: does a policy that keeps data read again ahead of data read once give
SDPA's causal misses their dependence on the heads before? Not kept (docs/physical.md).

Each block holds a re-reference value 0 to 3: a fill enters at 2 (a cohort's fill, read again at once, at 0),
a hit or a write to a resident block sets 0; the victim is the oldest block at 3, and when none is at 3
every value ages by one. One capacity, no read-fill or cohort weights; the flush residue as in the model.

    python benchmarks/gpu/sdpa_kv_order/srrip.py benchmarks/gpu/sdpa_kv_order/heads.json [CAPACITY_MIB ...]

Printed per configuration and capacity: DRAM MiB read beyond Q + K + V per head, measured and predicted.
"""

import json
import sys
from collections import OrderedDict
from multiprocessing import Pool
from pathlib import Path

import attrs

import simflash.model.physical as physical
from simflash.config import MiB
from simflash.l2 import L2Cache
from simflash.model.calibration import KERNEL_OF

FILL_VALUE = 2


@attrs.define
class SRRIPCache(L2Cache):
    _levels: list = attrs.field(factory=lambda: [OrderedDict() for _ in range(4)])  # value -> blocks, oldest first
    _value: dict = attrs.field(factory=dict)

    def read(self, key, nbytes, count=1, shared=False):
        flow = self._flow(key[0])
        if key in self._blocks:
            flow[0] += nbytes * count
            self._set(key, 0)
            return
        flow[1] += nbytes
        flow[0] += nbytes * (count - 1)
        self._fill(key, nbytes, dirty=False, value=0 if count > 1 else FILL_VALUE)

    def write(self, key, nbytes):
        self._flow(key[0])[4] += nbytes
        if key in self._blocks:
            self._blocks[key][1] = True
            self._set(key, 0)
        else:
            self._fill(key, nbytes, dirty=True, value=FILL_VALUE)

    def flush(self, residue=False):
        super().flush(residue)
        self._levels = [OrderedDict() for _ in range(4)]
        self._value.clear()

    def _set(self, key, value):
        old = self._value.get(key)
        if old is not None:
            del self._levels[old][key]
        self._levels[value][key] = None
        self._value[key] = value

    def _fill(self, key, nbytes, dirty, value):
        self._blocks[key] = [nbytes, dirty, nbytes]
        self._resident_cost += nbytes
        self._filled += nbytes
        self._set(key, value)
        self._evict_residue()
        self._evict()

    def _evict(self):
        while self._resident_cost > self.capacity_bytes and self._blocks:
            if not self._levels[3]:  # age every block by one
                self._levels = [OrderedDict(), *self._levels[:3]]
                for value in (1, 2, 3):
                    self._value.update(dict.fromkeys(self._levels[value], value))
                continue
            key, _ = self._levels[3].popitem(last=False)
            del self._value[key]
            nbytes, dirty, cost = self._blocks.pop(key)
            self._resident_cost -= cost
            if dirty:
                self._flow(key[0])[2] += nbytes


def predicted_reads(job: tuple[float, dict]) -> int:
    capacity_mib, c = job

    def l2_cache(gpu):
        cal = gpu.calibration
        return SRRIPCache(capacity_mib * MiB, flush_residue_bytes=int(cal["l2_flush_residue_bytes"]),
                          residue_ramp_bytes=cal["l2_residue_ramp_bytes"])

    physical.l2_cache = l2_cache  # what predict() builds its L2 with
    return physical.predict("fa2", c["n"], c["d"], heads=c["heads"], causal=c["causal"], cache="cold",
                            kernel=KERNEL_OF[c["algorithm"]]).kernels[0].dram_read_bytes


def main(path: Path, capacities: list[float]) -> None:
    configs = json.loads(path.read_text())["configs"]
    jobs = [(capacity, entry["config"]) for capacity in capacities for entry in configs]
    with Pool(2) as pool:
        predicted = dict(zip(range(len(jobs)), pool.map(predicted_reads, jobs, chunksize=1)))
    print("algorithm   N       heads  measured  " + "  ".join(f"SRRIP {c:g} MiB" for c in capacities)
          + "   (DRAM MiB read beyond Q + K + V, per head)")
    for i, entry in enumerate(configs):
        c = entry["config"]
        compulsory, heads = 3 * c["n"] * c["d"] * 2 * c["heads"], c["heads"]
        measured = sum(k["dram_read_bytes"] for k in entry["kernels"]) - compulsory
        cells = [(predicted[j * len(configs) + i] - compulsory) / MiB / heads for j in range(len(capacities))]
        print(f"{c['algorithm']:11s} {c['n']:<7d} {heads:<6d} {measured / MiB / heads:8.1f}  "
              + "  ".join(f"{x:14.1f}" for x in cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [float(x) for x in sys.argv[2:]] or [28.5, 32.0, 35.0, 40.0])
