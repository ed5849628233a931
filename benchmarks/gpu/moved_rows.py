"""Which unseen kernel rows a change to the model moved: the committed validation reports of the eight regime
sweeps at a git revision against those in the working tree, every row whose DRAM reads or writes came within
10% / 1 MiB (IN) or went out (OUT), with its kernel, one head's K + V and the error before and after.

    python benchmarks/gpu/moved_rows.py REV > benchmarks/gpu/moved_rows.txt
    (the file holds each comparison the docs quote, the latest first)
"""

import sys

from unseen_counts import KEYS, report

from simflash.config import MiB
from simflash.model.calibration import REGIME_REPORTS, within


def main(rev: str) -> None:
    print(f"unseen rows moved between the reports at {rev} and the working tree")
    lines = []
    for name in REGIME_REPORTS.values():
        for before, after in zip(report(name, rev)["rows"], report(name, None)["rows"], strict=True):
            if after["subset"] == "fit":
                continue
            c = after["config"]
            for what, key in KEYS.items():
                measured = after["measured"][key]
                was, now = (within(row["predicted"][key], measured) for row in (before, after))
                if was != now:
                    errors = [100 * (row["predicted"][key] / measured - 1) for row in (before, after)]
                    lines.append(f"{'IN ' if now else 'OUT'} {after['implementation']:10s} {after['kernel']:14s} "
                                 f"{after['cache']} {what:6s} "
                                 f"n={c['n']:6d} heads={c['heads']:3d} d={c['d']:3d} causal={c['causal']!s:5s} "
                                 f"K+V a head {2 * c['n'] * c['d'] * 2 / MiB:4.0f} MiB: "
                                 f"{errors[0]:+6.1f}% -> {errors[1]:+6.1f}%")
    print("\n".join(sorted(lines)))


if __name__ == "__main__":
    main(sys.argv[1])
