"""SDPA's causal K and V re-reads under a schedule in which CTAs that hit move faster (convoys), tried
and not kept.

The whole-chip model plays resident CTAs in lock-step. The rotated-reader probe (docs/physical.md)
suggests that on the chip a CTA whose reads hit catches up with the one ahead that waits on DRAM, and
the two then walk the same tiles together, the leader missing and the follower hitting. Here every
cohort of CTAs keeps its own clock: a step costs `hit_cost` when all its bytes hit the L2 and up to 1
(a step that misses all of them) in proportion to the bytes that missed; the cohort with the earliest
clock plays next, and a freed slot takes the next CTA at the clock its predecessor ended. The L2, the
programs and the launch order are the model's own. Compared with ncu's DRAM reads of every committed
sweep's SDPA causal rows, cold L2, against the lock-step predictions the reports hold:

    python benchmarks/gpu/sdpa_kv_order/convoys.py 0.85 0.6 > benchmarks/gpu/sdpa_kv_order/convoys.txt

(convoys.txt was made with the model's L2 as it was then, a mixture of two LRU caches.)
"""

from __future__ import annotations

import heapq
import itertools
import json
import sys
from pathlib import Path

import simflash.model.physical as physical
from simflash.config import MiB
from simflash.grid import CTAProgram, lockstep
from simflash.l2 import L2, L2Sets
from simflash.model.calibration import REGIME_REPORTS, within

ROOT = Path(__file__).resolve().parents[1]


class MissCounter:
    """Passes transfers to an L2 and counts the bytes of reads that missed: the stripes not resident in
    their sets (hashed sets), or the mean over a mixture's caches (as its DRAM bytes are)."""

    def __init__(self, l2: L2):
        self.l2 = l2
        self.caches = getattr(l2, "caches", (l2,))
        self.missed = 0.0

    def read(self, key, nbytes: int, count: int = 1, shared: bool = False) -> None:
        if isinstance(self.l2, L2Sets):
            self.missed += sum(size for cache, stripe, size in self.l2._stripes(key, nbytes)
                               if stripe not in cache._blocks)
        else:
            self.missed += sum(key not in cache._blocks for cache in self.caches) * nbytes / len(self.caches)
        self.l2.read(key, nbytes, count, shared)

    def write(self, key, nbytes: int) -> None:
        self.l2.write(key, nbytes)


def play(programs: list[CTAProgram], step: int, l2: MissCounter) -> int:
    """One step of a cohort, as the lock-step runner plays it; returns the bytes it moved."""
    moved = 0
    streaming = step > 0 and all(step < p.cta.n_steps for p in programs)
    for program in programs[:1] if streaming else programs:
        accesses = list(program.stream(step)) if step < program.cta.n_steps else []
        if not streaming:
            accesses = list(program.prologue if step == 0 else ()) + accesses
            accesses += list(program.epilogue if step == program.cta.n_steps else ())
        for access in accesses:
            moved += access.nbytes
            if access.write:
                l2.write(access.key, access.nbytes)
            else:
                l2.read(access.key, access.nbytes, count=len(programs) if streaming else 1)
    return moved


def run_convoys(programs, slots: int, l2: L2, hit_cost: float) -> list[int]:
    """Play the programs with a clock per cohort; returns the lock-step schedule's residency (the time
    model's input, left as the model computes it)."""
    programs = list(programs)
    resident = [sum(len(m) for _, m, _ in c) for _, c in lockstep(programs, slots, lambda p: p.cta)]
    counter = MissCounter(l2)
    pending = iter(programs)
    order = itertools.count()
    clocks: list = []  # (clock, launch order, [step, members])
    free = slots

    def launch(clock: float) -> None:
        nonlocal free
        starting: dict = {}
        while free:
            program = next(pending, None)
            if program is None:
                return
            if program.cta.cohort not in starting:
                starting[program.cta.cohort] = [0, []]
                heapq.heappush(clocks, (clock, next(order), starting[program.cta.cohort]))
            starting[program.cta.cohort][1].append(program)
            free -= 1

    launch(0.0)
    while clocks:
        clock, _, cohort = heapq.heappop(clocks)
        step, members = cohort
        before = counter.missed
        moved = play(members, step, counter)
        clock += hit_cost + (1 - hit_cost) * min(1.0, (counter.missed - before) / moved if moved else 0.0)
        cohort[0], cohort[1] = step + 1, [p for p in members if p.cta.n_steps > step]
        if cohort[1]:
            heapq.heappush(clocks, (clock, next(order), cohort))
        if len(cohort[1]) < len(members):
            free += len(members) - len(cohort[1])
            launch(clock)
    return resident


def main(hit_costs: list[float]) -> None:
    rows = []
    for name in REGIME_REPORTS.values():
        for row in json.loads((ROOT / name).read_text())["rows"]:
            c = row["config"]
            if row["implementation"] == "sdpa_flash" and row["cache"] == "cold" and c["causal"]:
                rows.append(row)
    predictions = {}
    for hit_cost in hit_costs:
        physical.run_programs = lambda programs, slots, l2, h=hit_cost: run_convoys(programs, slots, l2, h)
        predictions[hit_cost] = [physical.predict("fa2", r["config"]["n"], r["config"]["d"], heads=r["config"]["heads"],
                                                  causal=True, kernel="sdpa_flash").kernels[0].dram_read_bytes
                                 for r in rows]
    print("SDPA causal rows, cold: DRAM MiB read, measured / lock-step (the model) / convoys at each hit cost")
    print("d    N        heads  K+V/head MiB  measured  lock-step  " + "  ".join(f"h={h:<6}" for h in hit_costs))
    for i, row in enumerate(rows):
        c = row["config"]
        print(f"{c['d']:<4} {c['n']:<8} {c['heads']:<6} {c['n'] * c['d'] * 4 / MiB:12.1f}  "
              f"{row['measured']['dram_read_bytes'] / MiB:8.1f}  {row['predicted']['dram_read_bytes'] / MiB:9.1f}  "
              + "  ".join(f"{predictions[h][i] / MiB:8.1f}" for h in hit_costs))
    scores = [("lock-step", [r["predicted"]["dram_read_bytes"] for r in rows])]
    scores += [(f"h={h}", predictions[h]) for h in hit_costs]
    for label, predicted in scores:
        ok = sum(within(p, r["measured"]["dram_read_bytes"]) for p, r in zip(predicted, rows))
        print(f"{label}: {ok} of {len(rows)} rows within 10% / 1 MiB")
        for low, high in ((2, 20), (31, 64)):  # one head's K + V, MiB
            ratios = sorted(p / r["measured"]["dram_read_bytes"] for p, r in zip(predicted, rows)
                            if r["config"]["d"] == 128 and low <= r["config"]["n"] * 512 / MiB <= high)
            print(f"  d = 128, K + V {low} to {high} MiB: predicted / measured {ratios[0]:.2f} to {ratios[-1]:.2f},"
                  f" median {ratios[len(ratios) // 2]:.2f} ({len(ratios)} rows)")


if __name__ == "__main__":
    main([float(h) for h in sys.argv[1:]])
