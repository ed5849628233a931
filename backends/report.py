"""Tables from the GPU results (validate, profile, bench, kernel-profile, sdpa-check JSON): the rows the
CLI prints and the Markdown the docs carry. Pure Python: it reads results, it runs nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

from simflash.config import MiB
from simflash.model.decode_chip import predict_decode_dram
from simflash.model.measured import relative_error

Table = tuple[list[str], list[list[str]]]  # headers, rows
RESULT_FILES = {"validate": "validate.json", "profile": "profile.json", "bench": "bench.json",
                "sdpa": "sdpa_check.json", "validate_gqa": "validate_gqa.json", "validate_decode": "validate_decode.json",
                "decode_bench": "decode_bench.json", "validate_v2": "validate_v2.json", "versions": "bench_versions.json",
                "kernel_profile": "kernel_profile.json", "validate_v3": "validate_v3.json",
                "versions_v3": "bench_versions_v3.json", "kernel_profile_v3": "kernel_profile_v3.json",
                "backward_validate": "backward_validate.json",
                "backward_bench": "backward_bench.json", "backward_profile": "backward_profile.json"}


def _mib(nbytes) -> str:
    return "–" if nbytes is None else f"{nbytes / MiB:,.2f}"


def _ratio(value, logical) -> str:
    return "–" if value is None or not logical else f"{value / logical:.3f}"


def _mask(config: dict) -> str:
    return config["causal_variant"] if config["causal"] else "full"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _grouped_or_windowed(record: dict) -> bool:
    """A record of the grouped-query and window rows (they carry the max-abs rule)."""
    return "fa_rule" in record["error"]


def validate_table(result: dict) -> Table:
    """One row per (dtype, n_q, n_kv, d, tiles): worst errors over the masks, and whether every check held."""
    groups: dict[tuple, list[dict]] = {}
    for record in (r for r in result["records"] if not _grouped_or_windowed(r)):
        c = record["config"]
        groups.setdefault((c["dtype"], c["n_q"], c["n_kv"], c["d"], c["block_q"], c["block_kv"]), []).append(record)
    headers = ["dtype", "n_q", "n_kv", "d", "B_r x B_c", "masks", "max rel. error GPU", "max rel. error naive",
               "2x rule", "bytes = simulator = model", "m, l trace", "timed = instrumented", "naive GPU rel. error",
               "naive GPU bytes"]
    rows = []
    for (dtype, n_q, n_kv, d, block_q, block_kv), records in groups.items():
        naive = [r["naive_gpu"] for r in records if "naive_gpu" in r]
        rows.append([
            dtype, str(n_q), str(n_kv), str(d), f"{block_q}x{block_kv}",
            ",".join(_mask(r["config"]) for r in records),
            f"{max(r['error']['gpu'] for r in records):.2e}",
            f"{max(r['error']['naive_same_dtype'] for r in records):.2e}",
            _yes(all(r["error"]["within_fa_rule"] for r in records)),
            _yes(all(r["traffic"]["equals_simulator"] and r["traffic"]["equals_model"] for r in records)),
            _yes(all(r["trace"]["ok"] for r in records)),
            _yes(all(r["timed_equals_instrumented"] for r in records)),
            "–" if not naive else f"{max(n['error'] for n in naive):.2e}",
            "–" if not naive else _yes(all(_naive_bytes_ok(r) for r in records)),
        ])
    return headers, rows


def _window(config: dict) -> str:
    left, right = config["window"]
    mask = f"({left}, {right})" if (left, right) != (-1, -1) else "none"
    return mask + (f", causal {config['causal_variant']}" if config["causal"] else
                   f", {config['causal_variant']}" if (left, right) != (-1, -1) else "")


def gqa_window_table(result: dict) -> Table:
    """One row per grouped-query or windowed FA-2 configuration: the max-abs rule and every check."""
    headers = ["dtype", "batch", "H_q / H_kv", "packed", "n_q", "n_kv", "d", "window, mask", "max abs error GPU",
               "2 x naive + atol", "2x rule", "bytes = simulator = model", "m, l trace", "timed = instrumented"]
    rows = []
    for record in (r for r in result["records"] if _grouped_or_windowed(r)):
        c, rule = record["config"], record["error"]["fa_rule"]
        rows.append([c["dtype"], str(c["batch"]), f"{c['heads']} / {c['kv_heads'] or c['heads']}",
                     "yes" if c["pack_gqa"] else "no", str(c["n_q"]), str(c["n_kv"]), str(c["d"]), _window(c),
                     f"{rule['max_abs']:.2e}", f"{rule['bound']:.2e}", _yes(rule["passed"] and record["error"]["within_fa_rule"]),
                     _yes(record["traffic"]["equals_simulator"] and record["traffic"]["equals_model"]),
                     _yes(record["trace"]["ok"]), _yes(record["timed_equals_instrumented"])])
    return headers, rows


def decode_table(result: dict) -> Table:
    """One row per Flash-Decoding configuration."""
    headers = ["dtype", "batch", "H_q / H_kv", "packed", "n_q", "n_kv", "cache lengths", "d", "B_c", "mask", "splits",
               "max abs error GPU", "2 x naive + atol", "2x rule", "SDPA max abs diff", "bytes = simulator = model",
               "timed = instrumented"]
    rows = []
    for record in result["decode"]:
        c, error = record["config"], record["error"]
        lengths = "all" if c["cache_seqlens"] is None else ",".join(str(n) for n in c["cache_seqlens"])
        mask = ("causal" if c["causal"] else "full") + ("" if list(c["window"]) == [-1, -1] else f", window {tuple(c['window'])}")
        splits = f"{record['num_splits']}" + (" (heuristic)" if c["num_splits"] is None else "")
        sdpa = record["sdpa"]
        rows.append([c["dtype"], str(c["batch"]), f"{c['heads']} / {c['kv_heads']}", "yes" if c["pack_gqa"] else "no",
                     str(c["n_q"]), str(c["n_kv"]), lengths, str(c["d"]), str(record["block_kv"]), mask, splits,
                     f"{error['max_abs']:.2e}",
                     f"{error['bound']:.2e}", _yes(error["fa_rule"]),
                     sdpa.get("skipped") or f"{sdpa['max_abs_diff']:.2e}" + ("" if sdpa["within_bound"] else " (over)"),
                     _yes(record["traffic"]["equals_simulator"] and record["traffic"]["equals_model"]),
                     _yes(record["timed_equals_instrumented"])])
    return headers, rows


def _gbps(timing: dict) -> str:
    return timing["error"][:40] if "error" in timing else f"{timing['GBps']:,.0f} ({timing['pct_hbm_peak']:.0f}%)"


def _gbps_cold(timing: dict) -> str:
    return timing["error"][:40] if "error" in timing else _gbps(timing["cold"])


def decode_bench_table(result: dict) -> Table:
    """One row per (batch x K/V heads, cache length): K/V GB/s and % of HBM peak of each method, as a graph
    of back-to-back steps (and Flash-Decoding's and SDPA's as one cold call)."""
    headers = ["batch x H_kv", "n_kv", "K/V MiB", "FA-2 T_r=1 packed", "FA-2 T_r=1 unpacked",
               "Flash-Decoding (splits)", "its split kernel alone", "best of the split sweep (splits)",
               "with FA-2's KV tile (splits)", "SDPA", "Flash-Decoding, one cold call", "SDPA, one cold call"]
    rows = []
    for row in result["rows"]:
        c, fd = row["config"], row["flash_decoding"]
        sweep = max(row.get("flash_decoding_sweep", []), key=lambda t: t["GBps"], default=None)
        fa2_tile = row.get("flash_decoding_fa2_tile")
        split = row.get("flash_decoding_split_kernel")
        rows.append([f"{c['batch']} x {c['kv_heads']}", f"{c['n_kv'] // 1024}k", _mib(row["kv_bytes"]),
                     _gbps(row["fa2_packed"]), _gbps(row["fa2_unpacked"]), f"{_gbps(fd)} ({fd['num_splits']})",
                     "–" if split is None else _gbps(split),
                     "–" if sweep is None else f"{_gbps(sweep)} ({sweep['num_splits']})",
                     "–" if fa2_tile is None else f"{_gbps(fa2_tile)} ({fa2_tile['num_splits']})", _gbps(row["sdpa"]),
                     _gbps_cold(fd), _gbps_cold(row["sdpa"])])
    return headers, rows


def _error(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def decode_profile_table(result: dict) -> Table:
    """The split and combine kernels under Nsight Compute: counted bytes, DRAM bytes predicted by the
    whole-chip model (sf.model.predict_decode_dram, cold as ncu runs them) against those measured, L2
    bytes, duration."""
    headers = ["batch x H_kv", "n_kv", "splits", "kernel", "counted bytes (MiB)", "DRAM read predicted (MiB)",
               "DRAM read measured (MiB)", "read error", "DRAM written predicted (MiB)", "DRAM written measured (MiB)",
               "write error", "L2 bytes (MiB)", "time (us)", "DRAM read GB/s (% of peak)"]
    peak = result["hbm_peak_bytes_per_s"]
    rows = []
    for entry in result["profile"]["configs"]:
        c = entry["config"]
        predicted = predict_decode_dram(c["n_kv"], c["d"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"],
                                        num_splits=entry["num_splits"], gpu=result["gpu"], cache="cold")
        for row in entry["ncu"]:
            kernel = "split" if "flash_decoding_split" in row["kernel"] else "combine"
            flow = predicted.kernel(f"flash_decoding_{kernel}").flow
            counted = sum(read + write for name, _, read, write in entry["instrumented"] if name.endswith(kernel))
            read, written = row["dram__bytes_read.sum"], row["dram__bytes_write.sum"]
            seconds = row["gpu__time_duration.sum"] * 1e-9
            per_s = read / seconds
            rows.append([f"{c['batch']} x {c['kv_heads']}", f"{c['n_kv'] // 1024}k", str(entry["num_splits"]), kernel,
                         _mib(counted), _mib(flow.dram_read_bytes), _mib(read),
                         _error(relative_error(flow.dram_read_bytes, read)), _mib(flow.dram_write_bytes),
                         _mib(written), _error(relative_error(flow.dram_write_bytes, written)),
                         _mib(row["lts__t_bytes.sum"]), f"{seconds * 1e6:.1f}",
                         f"{per_s / 1e9:,.0f} ({100 * per_s / peak:.0f}%)"])
    return headers, rows


def _naive_bytes_ok(record: dict) -> bool:
    """The naive GPU path's ledger: the model's exactly without a mask; with one, the softmax's
    entries are the model's and the (dense) GEMMs' those of the unmasked model."""
    naive = record["naive_gpu"]
    exact = naive["equals_model"] if not record["config"]["causal"] else naive["softmax_equals_model"]
    return exact and naive["gemms_equal_dense_model"]


def resources_table(result: dict) -> Table:
    """What the compiler gave each FA-2 instantiation the validation ran."""
    seen = {r["resources"]["kernel"]: r["resources"] for r in result["records"]}
    headers = ["kernel", "threads", "registers", "local (spill) bytes", "shared bytes"]
    return headers, [[k["kernel"], str(k["threads"]), str(k["registers"]), str(k["local_bytes"]), str(k["shared_bytes"])]
                     for k in seen.values()]


def _config_label(config: dict) -> str:
    return f"N={config['n']} d={config['d']} H={config['heads']} {_mask(config)}"


def profile_table(result: dict) -> Table:
    """Per kernel: logical, instrumented, L2 and DRAM bytes (MiB), each DRAM/L2 figure over logical."""
    headers = ["config", "kernel", "logical MiB", "instrumented MiB", "L2 to SMs MiB (reads)", "L2 lookups from SMs MiB",
               "lookups/logical", "DRAM read MiB", "DRAM write MiB", "DRAM/logical", "time µs"]
    rows = []
    for entry in result["configs"]:
        for k in entry["kernels"]:
            rows.append([
                _config_label(entry["config"]), k["kernel"], _mib(k["logical_bytes"]), _mib(k["instrumented_bytes"]),
                _mib(k.get("l1_from_l2_bytes")), _mib(k.get("l2_sm_bytes")),
                _ratio(k.get("l2_sm_bytes"), k["logical_bytes"]), _mib(k["dram_read_bytes"]), _mib(k["dram_write_bytes"]),
                _ratio(k["dram_bytes"], k["logical_bytes"]), f"{k['time_ns'] / 1e3:,.1f}",
            ])
    return headers, rows


def sweep_table(result: dict) -> Table:
    """Per configuration, each path's DRAM and L2 traffic over its logical traffic."""
    headers = ["N", "H", "mask", "naive logical MiB", "naive DRAM/logical", "FA-2 logical MiB",
               "FA-2 L2 lookups/logical", "FA-2 DRAM/logical", "FA-2 DRAM / compulsory"]
    rows = []
    for entry in result["configs"]:
        c = entry["config"]
        kernels = {k["kernel"]: k for k in entry["kernels"]}
        flash = kernels["flash2_forward"]
        compulsory = 4 * c["heads"] * c["n"] * c["d"] * 2  # Q, K, V read once, O written once
        naive = [kernels[s] for s in ("gemm_qk", "softmax", "gemm_pv") if s in kernels]
        naive_logical = sum(k["logical_bytes"] for k in naive) if naive else None
        rows.append([
            str(c["n"]), str(c["heads"]), _mask(c), _mib(naive_logical),
            _ratio(sum(k["dram_bytes"] for k in naive), naive_logical) if naive else "–",
            _mib(flash["logical_bytes"]), _ratio(flash.get("l2_sm_bytes"), flash["logical_bytes"]),
            _ratio(flash["dram_bytes"], flash["logical_bytes"]), _ratio(flash["dram_bytes"], compulsory),
        ])
    return headers, rows


def bench_table(rows_in: list[dict]) -> Table:
    headers = ["N", "d", "causal", "FA-2 TFLOP/s", "% peak", "SDPA flash TFLOP/s", "FA-2 / SDPA flash",
               "naive TFLOP/s", "FA-2 logical GB/s (% HBM)", "naive logical GB/s (% HBM)", "FA-2 DRAM GB/s",
               "naive DRAM GB/s", "max abs diff FA-2 vs math", "max abs diff naive vs math"]
    rows = []
    for row in rows_in:
        c = row["config"]
        fa2 = next(iter(row["fa2"].values()))
        naive = row.get("naive")
        sdpa = row.get("sdpa_flash")
        diffs = row.get("max_abs_vs_sdpa_math", {})

        def bw(timing, key):
            return "–" if not timing or key not in timing else (
                f"{timing[key]['GBps']:,.0f} ({timing[key]['pct_hbm_peak']:.0f}%)")

        rows.append([
            str(c["n"]), str(c["d"]), "yes" if c["causal"] else "no", f"{fa2['tflops']:.1f}", f"{fa2['pct_peak']:.1f}",
            "–" if not sdpa else f"{sdpa['tflops']:.1f}",
            "–" if "ratio_vs_sdpa_flash" not in row else f"{row['ratio_vs_sdpa_flash']:.2f}",
            "–" if not naive else f"{naive['tflops']:.1f}",
            bw(fa2, "logical_bandwidth"), bw(naive, "logical_bandwidth"), bw(fa2, "dram_bandwidth"),
            bw(naive, "dram_bandwidth"),
            f"{diffs['fa2']:.2e}" if "fa2" in diffs else "–", f"{diffs['naive']:.2e}" if "naive" in diffs else "–",
        ])
    return headers, rows


def tiles_table(rows_in: list[dict]) -> Table:
    """FA-2 TFLOP/s by tile shape, where a bench timed more than one."""
    shapes = list(dict.fromkeys(shape for row in rows_in for shape in row["fa2"]))
    headers = ["N", "d", "causal", *[f"{shape} TFLOP/s" for shape in shapes]]
    rows = [[str(r["config"]["n"]), str(r["config"]["d"]), "yes" if r["config"]["causal"] else "no",
             *[f"{r['fa2'][s]['tflops']:.1f}" if s in r["fa2"] else "–" for s in shapes]] for r in rows_in]
    return headers, rows


def _tflops(timing) -> str:
    return f"{timing['tflops']:.1f}" if isinstance(timing, dict) else "–"


def versions_table(rows_in: list[dict]) -> Table:
    """Each FA-2 kernel version's TFLOP/s by tile shape, its best over SDPA flash, and SDPA's fused
    backends, all timed in the same process on the same inputs."""
    shapes = list(dict.fromkeys(shape for row in rows_in for timings in row.get("versions", {}).values()
                                for shape in timings))
    headers = ["N", "d", "causal", "kernel", *[f"{shape} TFLOP/s" for shape in shapes], "best / SDPA flash",
               "SDPA flash TFLOP/s", "SDPA cuDNN TFLOP/s", "SDPA efficient TFLOP/s"]
    rows = []
    for row in rows_in:
        c = row["config"]
        for version, timings in row.get("versions", {}).items():
            best = max(timing["tflops"] for timing in timings.values())
            flash = row.get("sdpa_flash")
            rows.append([str(c["n"]), str(c["d"]), "yes" if c["causal"] else "no", version,
                         *[_tflops(timings.get(shape)) for shape in shapes],
                         f"{best / flash['tflops']:.2f}" if isinstance(flash, dict) else "–",
                         _tflops(flash), _tflops(row.get("sdpa_cudnn")), _tflops(row.get("sdpa_efficient"))])
    return headers, rows


def _shown(row: dict, key: str, fmt: str, divide: float = 1.0) -> str:
    return "–" if row.get(key) is None else format(row[key] / divide, fmt)


def kernel_profile_table(result: dict) -> Table:
    """Per configuration and kernel, what Nsight Compute measured (a metric ncu lacked shows as –)."""
    headers = ["N", "d", "causal", "kernel", "time µs", "TFLOP/s (under ncu)", "tensor pipe active %",
               "shared wavefronts (M)", "shared wavefronts per MFLOP", "warps active %", "DRAM read MiB"]
    rows = []
    for row in result["rows"]:
        c = row["config"]
        time_ns = row.get("time_ns")
        rows.append([str(c["n"]), str(c["d"]), "yes" if c["causal"] else "no", row["kernel"],
                     _shown(row, "time_ns", ",.1f", 1e3), "–" if not time_ns else f"{row['flops'] / time_ns / 1e3:.1f}",
                     _shown(row, "tensor_active_pct", ".1f"), _shown(row, "shared_wavefronts", ",.1f", 1e6),
                     _shown(row, "shared_wavefronts", ".1f", row["flops"] / 1e6), _shown(row, "warps_active_pct", ".1f"),
                     _shown(row, "dram_read_bytes", ",.1f", MiB)])
    return headers, rows


def sdpa_table(results: list[dict]) -> Table:
    headers = ["N", "d", "causal", "backend", "verdict", "kernels"]
    rows = []
    for result in results:
        for entry in result["backends"]:
            kernels = "; ".join(name[:60] for name in entry["kernels"]) or entry.get("error", "")
            rows.append([str(result["n"]), str(result["d"]), "yes" if result["causal"] else "no", entry["backend"],
                         entry["verdict"], kernels])
    return headers, rows


def markdown(table: Table) -> str:
    headers, rows = table
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def load(folder: Path) -> dict:
    """The results saved in `folder` (any of RESULT_FILES)."""
    return {key: json.loads((Path(folder) / name).read_text()) for key, name in RESULT_FILES.items()
            if (Path(folder) / name).exists()}


def tables(results: dict) -> dict[str, Table]:
    """Every table the results support, by name, in the order the docs show them."""
    out: dict[str, Table] = {}
    if "validate" in results:
        out["validate"] = validate_table(results["validate"])
        out["resources"] = resources_table(results["validate"])
    if "profile" in results:
        out["profile"] = profile_table(results["profile"])
        out["sweep"] = sweep_table(results["profile"])
    if "bench" in results:
        out["bench"] = bench_table(results["bench"]["rows"])
        out["tiles"] = tiles_table(results["bench"]["rows"])
    if "sdpa" in results:
        out["sdpa"] = sdpa_table(results["sdpa"]["checks"])
    if "validate_gqa" in results:
        out["gqa_window"] = gqa_window_table(results["validate_gqa"])
    if "validate_decode" in results:
        out["decode"] = decode_table(results["validate_decode"])
    if "decode_bench" in results:
        out["decode_bench"] = decode_bench_table(results["decode_bench"])
        if "profile" in results["decode_bench"]:
            out["decode_profile"] = decode_profile_table(results["decode_bench"])
    for version, suffix in (("v2", ""), ("v3", "_v3")):  # each version's files (v2's bench and profile unsuffixed)
        if f"validate_{version}" in results:
            out[f"validate_{version}"] = validate_table(results[f"validate_{version}"])
            out[f"resources_{version}"] = resources_table(results[f"validate_{version}"])
        if f"versions{suffix}" in results:
            out[f"versions{suffix}"] = versions_table(results[f"versions{suffix}"]["rows"])
        if f"kernel_profile{suffix}" in results:
            out[f"kernel_profile{suffix}"] = kernel_profile_table(results[f"kernel_profile{suffix}"])
    from simflash.backends import report_backward  # it builds on this module's helpers

    if "backward_validate" in results:
        out["backward_validate"] = report_backward.validate_table(results["backward_validate"])
        out["backward_resources"] = report_backward.resources_table(results["backward_validate"])
    if "backward_bench" in results:
        out["backward_bench"] = report_backward.bench_table(results["backward_bench"]["rows"])
    if "backward_profile" in results:
        out["backward_profile"] = report_backward.profile_table(results["backward_profile"])
    return out


TABLE_BLOCK = re.compile(r"(<!-- gpu-table: (?P<name>\w+) -->\n)(?:[^\n]*\n)*?(<!-- /gpu-table -->)")


def update_page(text: str, tables_by_name: dict[str, Table]) -> str:
    """A docs page with each `<!-- gpu-table: NAME -->` ... `<!-- /gpu-table -->` block refilled."""
    unknown = [m["name"] for m in TABLE_BLOCK.finditer(text) if m["name"] not in tables_by_name]
    if unknown:
        raise ValueError(f"the page names tables the results do not have: {unknown}")
    return TABLE_BLOCK.sub(lambda m: m[1] + markdown(tables_by_name[m["name"]]) + "\n" + m[3], text)
