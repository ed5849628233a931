"""The goal's figures from the committed validation reports: over the eight regime sweeps' rows no figure
was fitted on (the calibration sweep's held-out rows and the seven sweeps after it), how many kernel rows
have their DRAM reads and writes within 10% / 1 MiB (and their time within 15%), by implementation and
cache mode, and the share over all three implementations. With a git revision, the reports as they were
committed there (e.g. before the L2 became hashed sets).

    python benchmarks/gpu/unseen_counts.py [REV] > benchmarks/gpu/unseen_counts.txt
"""

import json
import subprocess
import sys
from pathlib import Path

from simflash.model.calibration import REGIME_REPORTS, within

ROOT = Path(__file__).resolve().parent
KEYS = {"reads": "dram_read_bytes", "writes": "dram_write_bytes"}


def report(name: str, rev: str | None) -> dict:
    if rev is None:
        return json.loads((ROOT / name).read_text())
    shown = subprocess.run(["git", "show", f"{rev}:benchmarks/gpu/{name}"], capture_output=True, text=True,
                           check=True, cwd=ROOT)
    return json.loads(shown.stdout)


def counts(rev: str | None) -> dict[tuple[str, str, str], list[int]]:
    """{(implementation, cache, reads | writes | time): [rows within, rows]} over the unseen rows."""
    cells: dict[tuple[str, str, str], list[int]] = {}
    for name in REGIME_REPORTS.values():
        for row in report(name, rev)["rows"]:
            if row["subset"] == "fit":
                continue
            predicted, measured = row["predicted"], row["measured"]
            checks = {what: within(predicted[key], measured[key]) for what, key in KEYS.items()}
            checks["time"] = abs(predicted["time_s"] - measured["time_s"]) <= 0.15 * measured["time_s"]
            for what, ok in checks.items():
                cell = cells.setdefault((row["implementation"], row["cache"], what), [0, 0])
                cell[0] += ok
                cell[1] += 1
    return cells


def main(rev: str | None) -> None:
    cells = counts(rev)
    print(f"reports at {rev or 'the working tree'}: unseen rows of the eight regime sweeps")
    for key, (ok, n) in sorted(cells.items()):
        print(f"  {' '.join(key):28s} {ok:4d} of {n}")
    for cache in ("cold", "warm"):
        for what in ("reads", "writes"):
            ok = sum(c[0] for k, c in cells.items() if k[1:] == (cache, what))
            n = sum(c[1] for k, c in cells.items() if k[1:] == (cache, what))
            print(f"  all {cache} {what}: {ok} of {n} ({100 * ok / n:.1f}%)")
    dram = [c for k, c in cells.items() if k[2] != "time"]
    print(f"  DRAM reads and writes: {sum(c[0] for c in dram)} of {sum(c[1] for c in dram)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
