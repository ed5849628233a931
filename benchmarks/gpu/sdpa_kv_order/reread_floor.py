"""The evidence for SDPA's re-read floor (`simflash.model.physical.with_reread_floor`): on every causal row of the
eight regime sweeps up to N = 51,200, cold and warm, the DRAM MiB read beyond Q + K + V by simflash's FA-2 kernel
and by SDPA's, and for SDPA the share of its K and V re-reads that missed, measured, predicted by the reports at a
git revision (before the floor) and by the committed reports (with it), and its DRAM reads' error now. Then, with
the floor and before it, SDPA's causal rows whose DRAM reads are within 10% / 1 MiB: the calibration sweep's fit
rows, the eight regime sweeps' rows (with the range of their errors), and the tenth and eleventh sweeps' rows, by
head dimension.

    python benchmarks/gpu/sdpa_kv_order/reread_floor.py c4e8a01 > benchmarks/gpu/sdpa_kv_order/reread_floor.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

from miss_rates import ITEMSIZE, logical_reads

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unseen_counts import report

from simflash.model.calibration import REGIME_REPORTS, REPORTS, within

LARGEST_N = 51200
SMALL_KV_BYTES = 12 * 2**20  # one head's K + V up to which the L2 holds them: the summary's rows


def causal_rows(rev: str | None) -> dict[tuple, dict]:
    """{(d, N, heads, cache, implementation): report row} of the eight sweeps' causal FA-2 rows."""
    rows = {}
    for name in REGIME_REPORTS.values():
        for row in report(name, rev)["rows"]:
            c = row["config"]
            if c["causal"] and c["n"] <= LARGEST_N and row["implementation"] in ("fa2", "sdpa_flash"):
                rows[c["d"], c["n"], c["heads"], row["cache"], row["implementation"]] = row
    return rows


def main(rev: str) -> None:
    now, before = causal_rows(None), causal_rows(rev)
    print(f"causal rows up to N = {LARGEST_N:,}: DRAM MiB beyond Q + K + V; SDPA's K and V re-reads missed "
          f"(measured, predicted at {rev}, predicted now)")
    print("d    N       heads  cache  simflash MiB  SDPA MiB  missed: measured  before    now  SDPA reads' error now")
    beyond = {}
    for (d, n, heads, cache, implementation), row in sorted(now.items()):
        if implementation != "sdpa_flash" or (d, n, heads, cache, "fa2") not in now:
            continue
        compulsory = 3 * heads * n * d * ITEMSIZE
        rereads = logical_reads(n, d, heads, True) - compulsory
        fa2 = (now[d, n, heads, cache, "fa2"]["measured"]["dram_read_bytes"] - compulsory) / 2**20
        sdpa = (row["measured"]["dram_read_bytes"] - compulsory) / 2**20
        shares = [(r["dram_read_bytes"] - compulsory) / rereads
                  for r in (row["measured"], before[d, n, heads, cache, implementation]["predicted"], row["predicted"])]
        if 2 * n * d * ITEMSIZE <= SMALL_KV_BYTES:
            beyond.setdefault(d, []).append((fa2, sdpa, shares[0]))
        error = row["predicted"]["dram_read_bytes"] / row["measured"]["dram_read_bytes"] - 1
        print(f"{d:<4} {n:<7} {heads:<6} {cache:<6} {fa2:>12.1f}  {sdpa:>8.1f}  {shares[0]:>16.2%}  {shares[1]:>6.2%}"
              f"  {shares[2]:>6.2%}  {error:>+20.1%}")
    for d, rows in sorted(beyond.items()):
        print(f"d = {d}, one head's K + V up to 12 MiB: at most {max(r[0] for r in rows):.1f} MiB beyond Q + K + V "
              f"for simflash's kernel, {max(r[1] for r in rows):.1f} for SDPA's, whose re-reads missed "
              f"{min(r[2] for r in rows):.2%} to {max(r[2] for r in rows):.2%}")


def sdpa_causal_reads(sweeps: list[str], rev: str | None, subset: str | None = None) -> dict[tuple[int, str], list]:
    """{(d, cache): [rows within 10% / 1 MiB, rows, errors]} of SDPA's causal DRAM reads in `sweeps`' reports."""
    counts: dict[tuple[int, str], list] = {}
    for sweep in sweeps:
        for row in report(REPORTS[sweep], rev)["rows"]:
            c = row["config"]
            if row["implementation"] == "sdpa_flash" and c["causal"] and subset in (None, row["subset"]):
                predicted, measured = row["predicted"]["dram_read_bytes"], row["measured"]["dram_read_bytes"]
                cell = counts.setdefault((c["d"], row["cache"]), [0, 0, []])
                cell[0] += within(predicted, measured)
                cell[1] += 1
                cell[2].append(predicted / measured - 1)
    return counts


def tallies(rev: str) -> None:
    for label, sweeps, subset in (("calibration fit rows", ["calibration"], "fit"),
                                  ("eight regime sweeps", list(REGIME_REPORTS), None),
                                  ("later", ["later"], None), ("lead", ["lead"], None)):
        now, before = sdpa_causal_reads(sweeps, None, subset), sdpa_causal_reads(sweeps, rev, subset)
        for (d, cache), (ok, rows, errors) in sorted(now.items()):
            print(f"SDPA causal reads, {label}, d = {d}, {cache}: {ok} of {rows} within 10% / 1 MiB ({before[d, cache][0]} "
                  f"at {rev}); errors {min(errors):+.0%} to {max(errors):+.0%}")


if __name__ == "__main__":
    main(sys.argv[1])
    tallies(sys.argv[1])
