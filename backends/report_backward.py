"""Tables from the GPU backward's results (validate --backward, bench --backward, profile --backward JSON),
as the CLI prints them and docs/gpu.md carries them. Pure Python: it reads results, it runs nothing."""

from __future__ import annotations

import re

from simflash.backends.report import Table, _mask, _mib, _ratio, _yes
from simflash.backends import validate_backward

GRADIENTS = ("dq", "dk", "dv")


def _worst(records: list[dict], gradient: str, key: str) -> str:
    values = [r["gradients"][gradient][key] for r in records if key in r["gradients"][gradient]]
    return f"{max(values):.2e}" if values else "–"


def validate_table(result: dict) -> Table:
    """One row per (dtype, n_q, n_kv, d, tiles): worst max errors over the masks per gradient (ours,
    naive in the same dtype, SDPA flash), and whether every check held."""
    groups: dict[tuple, list[dict]] = {}
    for record in result["records"]:
        c = record["config"]
        groups.setdefault((c["dtype"], c["n_q"], c["n_kv"], c["d"], c["block_q"], c["block_kv"]), []).append(record)
    headers = ["dtype", "n_q", "n_kv", "d", "B_r x B_c", "masks",
               *(f"max err {g}: GPU / naive / SDPA" for g in GRADIENTS),
               "2x rule", "bytes = definition", "bytes = model", "L, forward bytes", "timed build"]
    rows = []
    for (dtype, n_q, n_kv, d, block_q, block_kv), records in groups.items():
        models = [r["traffic"]["equals_model"] for r in records]
        rows.append([
            dtype, str(n_q), str(n_kv), str(d), f"{block_q}x{block_kv}",
            ",".join(_mask(r["config"]) for r in records),
            *(" / ".join(_worst(records, g, key) for key in ("gpu", "naive_same_dtype", "sdpa")) for g in GRADIENTS),
            _rule([g for r in records for g in r["gradients"].values()]),
            _yes(all(r["traffic"]["equals_definition"] for r in records)),
            "–" if all(m is None for m in models) else _yes(all(m is True for m in models)),
            _yes(all(r["forward"]["traffic_equals_model"] and r["forward"]["logsumexp_same_infinities"]
                     for r in records)),
            _yes(all(r["timed"]["dk_dv_equal_instrumented"] and r["timed"]["dq_within_fa_rule"] for r in records)),
        ])
    return headers, rows


def _rule(gradients: list[dict]) -> str:
    if all(g["within_fa_rule"] for g in gradients):
        return "yes"
    return "as SDPA flash" if all(validate_backward.within_rule(g) for g in gradients) else "NO"


def resources_table(result: dict) -> Table:
    """What the compiler gave each backward kernel the validation ran."""
    seen = {k["kernel"]: k for r in result["records"] for k in r["resources"]}
    headers = ["kernel", "threads", "registers", "local (spill) bytes", "shared bytes"]
    return headers, [[k["kernel"], str(k["threads"]), str(k["registers"]), str(k["local_bytes"]), str(k["shared_bytes"])]
                     for k in seen.values()]


def bench_table(rows_in: list[dict]) -> Table:
    """Our three kernels against SDPA's flash backward: time, TFLOP/s, share of peak, ratio."""
    tiles = list(rows_in[0]["ours"]) if rows_in else []
    headers = ["N", "d", "causal", f"ours {tiles[0] if tiles else ''} ms", "ours TFLOP/s", "% peak",
               "SDPA flash ms", "SDPA flash TFLOP/s", "ours / SDPA flash", *(f"ours {t} TFLOP/s" for t in tiles[1:]),
               "max abs diff vs SDPA (dq, dk, dv)"]
    rows = []
    for row in rows_in:
        c, ours, sdpa = row["config"], row["ours"][tiles[0]], row["sdpa_flash"]
        diff = row.get("max_abs_vs_sdpa")
        rows.append([
            str(c["n"]), str(c["d"]), "yes" if c["causal"] else "no", f"{ours['ms']:.3f}", f"{ours['tflops']:.1f}",
            f"{ours['pct_peak']:.1f}", f"{sdpa['ms']:.3f}", f"{sdpa['tflops']:.1f}", f"{row['ratio_vs_sdpa_flash']:.2f}",
            *("refused" if "refused" in row["ours"][t] else f"{row['ours'][t]['tflops']:.1f}" for t in tiles[1:]),
            "–" if diff is None else ", ".join(f"{diff[g]:.1e}" for g in GRADIENTS),
        ])
    return headers, rows


def profile_table(result: dict) -> Table:
    """Per kernel: the ledger at its tiles, what it counted, what DRAM and L2 did, its time."""
    headers = ["config", "who", "kernel", "ledger kernel", "tiles", "logical MiB", "instrumented MiB", "DRAM read MiB",
               "DRAM write MiB", "DRAM/logical", "L2 (all units) MiB", "time µs"]
    rows = []
    for entry in result["configs"]:
        c = entry["config"]
        label = f"N={c['n']} d={c['d']} H={c['heads']} {'causal' if c['causal'] else 'full'}"
        for k in entry["kernels"]:
            dram = k.get("dram_read_bytes", 0) + k.get("dram_write_bytes", 0)
            short = re.sub(r"^void\s+", "", k["name"]).split("<")[0].split("::")[-1]  # no namespace, no template
            rows.append([label, "ours" if k["side"] == "ours" else "SDPA FA-2", short, k["kernel"] or "–",
                         k["tiles"] if k["kernel"] else "–", _mib(k["logical_bytes"]), _mib(k["instrumented_bytes"]),
                         _mib(k.get("dram_read_bytes")), _mib(k.get("dram_write_bytes")),
                         _ratio(dram, k["logical_bytes"]), _mib(k.get("l2_all_bytes")),
                         f"{k['time_ns'] / 1e3:,.1f}" if "time_ns" in k else "–"])
    return headers, rows
