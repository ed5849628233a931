"""The committed H200 results (benchmarks/gpu/*.json) still agree with the simulator and its closed
forms, cover what they claim to cover, and are what docs/gpu.md shows. CPU only: nothing runs on a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import simflash as sf
from simflash.backends import report, validate, validate_decode
from simflash.backends.kernels import DECODE_BLOCK_KV
from simflash.memory import Flow, Traffic

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "gpu"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _traffic(rows: list[list]) -> Traffic:
    return Traffic({(kernel, tensor): Flow(read, write) for kernel, tensor, read, write in rows})


@pytest.fixture(scope="module")
def validation() -> dict:
    return _load("validate.json")


def test_every_validation_record_passes_today_s_checks(validation):
    assert validation["device"]["name"] == "NVIDIA H200"
    assert validation["all_ok"] and all(validate.passed(record) for record in validation["records"])
    assert all(case["refused"] and case["case"].split("=")[0] in case["message"] for case in validation["refusals"])


def test_counted_bytes_equal_the_closed_form_recomputed_now(validation):
    for record in validation["records"]:
        c = record["config"]
        model = sf.model.flash_traffic(c["n_q"], c["d"], c["block_q"], c["block_kv"], c["dtype"], c["causal"],
                                       n_kv=c["n_kv"], heads=c["heads"], causal_variant=c["causal_variant"])
        assert _traffic(record["traffic"]["instrumented"]) == model, c


def test_counted_bytes_equal_a_fresh_simulation_for_the_small_configurations(validation):
    rng = np.random.default_rng()
    small = [r for r in validation["records"] if r["config"]["n_q"] * r["config"]["n_kv"] <= 300 * 300]
    assert len(small) >= 20
    for record in small:
        c = record["config"]
        q = rng.standard_normal((c["heads"], c["n_q"], c["d"]))
        k, v = (rng.standard_normal((c["heads"], c["n_kv"], c["d"])) for _ in range(2))
        sim = sf.flash_attention(q, k, v, c["block_q"], c["block_kv"], causal=c["causal"],
                                 causal_variant=c["causal_variant"], dtype=c["dtype"], trace="none")
        assert _traffic(record["traffic"]["instrumented"]) == sim.traffic, c


def test_the_naive_gpu_ledger_matches_the_model_where_it_should(validation):
    for record in validation["records"]:
        c = record["config"]
        ledger = _traffic(record["naive_gpu"]["ledger"])
        model = sf.model.naive_traffic(c["n_q"], c["d"], c["dtype"], c["causal"], n_kv=c["n_kv"], heads=c["heads"],
                                       causal_variant=c["causal_variant"])
        assert ledger.by_kernel["softmax"] == model.by_kernel["softmax"]  # counted on the device
        if not c["causal"]:
            assert ledger == model


def test_the_validation_covers_the_promised_grid(validation):
    configs = [r["config"] for r in validation["records"]]
    square = {(c["n_q"], c["d"], c["causal"], c["causal_variant"], c["dtype"]) for c in configs if c["n_q"] == c["n_kv"]}
    for n in (1, 17, 128, 1000, 4096):
        for d in (64, 128):
            for mask in validate.MASKS:
                for dtype in ("float16", "bfloat16"):
                    assert (n, d, *mask, dtype) in square
    assert any(c["n_q"] < c["n_kv"] for c in configs) and any(c["n_q"] > c["n_kv"] for c in configs)


def test_profile_counts_are_the_model_s_and_the_sweep_spans_heads_and_lengths():
    result = _load("profile.json")
    assert result["ncu_command"].startswith("ncu --clock-control none --cache-control all")
    assert result["command"].startswith("simflash gpu profile")
    heads, lengths = set(), set()
    for entry in result["configs"]:
        c = entry["config"]
        heads.add(c["heads"]), lengths.add(c["n"])
        rows = {row["kernel"]: row for row in entry["kernels"]}
        flash = sf.model.flash_traffic(c["n"], c["d"], c["block_q"], c["block_kv"], "float16", c["causal"],
                                       heads=c["heads"], causal_variant=c["causal_variant"])
        assert rows["flash2_forward"]["logical_bytes"] == rows["flash2_forward"]["instrumented_bytes"] == flash.total_bytes
        # The crossbar delivers to the SMs exactly the bytes the kernel's copies asked for.
        assert rows["flash2_forward"]["l1_from_l2_bytes"] == flash.read_bytes
        # Compulsory traffic reaches DRAM: Q, K and V are read from it at least once.
        assert rows["flash2_forward"]["dram_read_bytes"] >= 3 * c["heads"] * c["n"] * c["d"] * 2
        if "softmax" in rows:
            naive = sf.model.naive_traffic(c["n"], c["d"], "float16", c["causal"], heads=c["heads"],
                                           causal_variant=c["causal_variant"])
            assert rows["softmax"]["instrumented_bytes"] == naive.by_kernel["softmax"].total_bytes
    assert heads >= {1, 2, 4, 8, 16, 32, 64} and lengths >= {1024, 4096, 16384}


# FLOPs of one forward pass, derived by hand: two matmuls (S = QK^T, O = PV) of 2 N^2 d each per head,
# 32 heads; causal counts half (FlashAttention's convention). N = 1024 = 2^10, 4096 = 2^12, 16384 = 2^14,
# d = 64 = 2^6, 128 = 2^7: 4 * 32 * N^2 * d = 2^7 * N^2 * d.
HAND_FLOPS = {(1024, 64): 2**33, (4096, 64): 2**37, (16384, 64): 2**41,
              (1024, 128): 2**34, (4096, 128): 2**38, (16384, 128): 2**42}
H200_DENSE_FP16 = 989e12  # datasheet: 1,979 TFLOP/s with sparsity, halved for dense


def test_bench_rows_are_consistent_and_meet_the_target():
    result = _load("bench.json")
    assert sf.GPUS["H200"].peak_flops["float16"] == H200_DENSE_FP16
    for row in result["rows"]:
        c = row["config"]
        assert c["heads"] == 32
        flops = HAND_FLOPS[c["n"], c["d"]] // (2 if c["causal"] else 1)
        assert row["flops"] == flops
        for timing in (*row["fa2"].values(), row["naive"], row["sdpa_flash"]):
            # The definition: FLOPs / seconds, in units of 10^12 FLOP/s, and a percentage of the datasheet peak.
            assert timing["tflops"] == pytest.approx(float(flops) / (timing["ms"] / 1000.0) * 1e-12, rel=1e-9)
            assert timing["pct_peak"] == pytest.approx(timing["tflops"] / 989.0 * 100.0, rel=1e-9)
            assert timing["min_ms"] <= timing["ms"] <= timing["max_ms"]
    grid = {(r["config"]["n"], r["config"]["d"], r["config"]["causal"]) for r in result["rows"]}
    assert grid == {(n, d, causal) for n in (1024, 4096, 16384) for d in (64, 128) for causal in (False, True)}
    headline = next(r for r in result["rows"] if (r["config"]["n"], r["config"]["d"], r["config"]["causal"]) == (4096, 128, False))
    assert headline["ratio_vs_sdpa_flash"] >= 0.5


def test_sdpa_check_saw_fused_kernels_and_the_sanitizers_came_back_clean():
    checks = _load("sdpa_check.json")["checks"]
    for check in checks:
        verdicts = {e["backend"]: e["verdict"] for e in check["backends"]}
        assert verdicts["FLASH_ATTENTION"] == "fused" and verdicts["MATH"] == "math"
        assert "FALLBACK TO MATH" not in verdicts.values()
    text = (RESULTS / "sanitizer.txt").read_text()
    assert "--tool memcheck" in text and "ERROR SUMMARY: 0 errors" in text
    assert "--tool racecheck" in text and "0 hazards displayed (0 errors, 0 warnings)" in text


def test_docs_show_the_tables_of_the_committed_results():
    page = (REPO / "docs" / "gpu.md").read_text()
    for name, table in report.tables(report.load(RESULTS)).items():
        assert report.markdown(table) in page, f"docs/gpu.md lacks the current {name} table: run simflash gpu report"


def test_bench_counts_the_naive_path_s_bytes_as_the_closed_form():
    """The naive path's logical bytes in the bench come from its instrumented build: S read and P
    written by the softmax included (the timed build counts nothing). Causal: the softmax touches the
    permitted entries only, while cuBLAS's GEMMs write and read S and P whole."""
    rows = _load("bench.json")["rows"]
    checked = {False: 0, True: 0}
    for row in rows:
        c = row["config"]
        if "naive" not in row:
            continue
        dense = sf.model.naive_traffic(c["n"], c["d"], "float16", heads=c["heads"]).by_kernel
        softmax = sf.model.naive_traffic(c["n"], c["d"], "float16", c["causal"], heads=c["heads"]).by_kernel["softmax"]
        expected = dense["gemm_qk"].total_bytes + softmax.total_bytes + dense["gemm_pv"].total_bytes
        assert row["naive"]["logical_bandwidth"]["bytes"] == expected
        checked[c["causal"]] += 1
    assert checked[False] >= 4 and checked[True] >= 4


def test_the_validation_covers_d_256(validation):
    configs = [r["config"] for r in validation["records"] if r["config"]["d"] == 256]
    assert {c["dtype"] for c in configs} == {"float16", "bfloat16"} and any(c["causal"] for c in configs)
    assert all(r["ok"] for r in validation["records"] if r["config"]["d"] == 256)
    assert any(r["case"].startswith("d=256") and r["refused"] for r in validation["refusals"])


def test_grouped_query_and_window_records_pass_and_equal_the_closed_form_recomputed_now():
    result = _load("validate_gqa.json")
    assert result["device"]["name"] == "NVIDIA H200" and result["all_ok"]
    seen = set()
    for record in result["records"]:
        c = record["config"]
        assert validate.passed(record) and record["error"]["fa_rule"]["passed"]
        model = sf.model.flash_traffic(c["n_q"], c["d"], c["block_q"], c["block_kv"], c["dtype"], c["causal"],
                                       n_kv=c["n_kv"], heads=c["batch"] * c["heads"], causal_variant=c["causal_variant"],
                                       window=tuple(c["window"]), kv_heads=c["batch"] * c["kv_heads"],
                                       pack_gqa=c["pack_gqa"])
        assert _traffic(record["traffic"]["instrumented"]) == model, c
        seen.add((c["heads"] // c["kv_heads"], c["pack_gqa"], tuple(c["window"]), c["d"], c["dtype"], c["n_q"] < c["n_kv"]))
    assert {group for group, *_ in seen} == {1, 4, 8} and {(g, pack) for g, pack, *_ in seen} >= {(4, True), (8, True)}
    assert {window for _, _, window, *_ in seen} >= {(256, 0), (128, 128), (-1, 0), (-1, -1)}
    assert {(d, dtype) for *_, d, dtype, _ in seen} == {(d, t) for d in (64, 128) for t in ("float16", "bfloat16")}
    assert {shorter for *_, shorter in seen} == {True, False}


def test_flash_decoding_records_pass_and_equal_the_closed_form_recomputed_now():
    result = _load("validate_decode.json")
    assert result["device"]["name"] == "NVIDIA H200" and result["all_ok"]
    for record in result["decode"]:
        c = record["config"]
        assert validate_decode.passed(record) and record["sdpa"]["within_bound"]
        model = sf.model.flash_decoding_traffic(
            c["n_kv"], c["d"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"], n_q=c["n_q"],
            num_splits=record["num_splits"], block_kv=record["block_kv"], pack_gqa=c["pack_gqa"],
            cache_seqlens=c["cache_seqlens"], causal=c["causal"], window=tuple(c["window"]), dtype=c["dtype"])
        assert validate.equal_bytes(_traffic(record["traffic"]["instrumented"]), model), c
    configs = [(r["config"], r) for r in result["decode"]]
    assert {c["heads"] // c["kv_heads"] for c, _ in configs} == {1, 2, 4, 8} and {c["pack_gqa"] for c, _ in configs} == {True, False}
    assert {r["num_splits"] == 1 for _, r in configs} == {True, False} and any(c["num_splits"] is None for c, _ in configs)
    assert any(c["cache_seqlens"] for c, _ in configs) and any(c["causal"] for c, _ in configs)
    assert any(list(c["window"]) != [-1, -1] for c, _ in configs)
    assert {(c["d"], r["block_kv"]) for c, r in configs} == {(64, 128), (64, 256), (128, 64), (128, 128)}
    assert {c["dtype"] for c, _ in configs} == {"float16", "bfloat16"}


def _timed_consistently(timing: dict, kv_bytes: int, peak: float) -> None:
    assert timing["GBps"] == pytest.approx(kv_bytes / (timing["ms"] * 1e-3) / 1e9, rel=1e-9)
    assert timing["pct_hbm_peak"] == pytest.approx(timing["GBps"] * 1e9 / peak * 100, rel=1e-9)
    assert timing["min_ms"] <= timing["ms"] <= timing["max_ms"]


def test_decode_bench_spans_the_grid_and_flash_decoding_streams_the_cache_where_fa2_cannot():
    result = _load("decode_bench.json")
    peak = sf.GPUS["H200"].hbm_bytes_per_s
    l2 = result["device"]["l2_bytes"]
    assert result["hbm_peak_bytes_per_s"] == peak
    grid = {(r["config"]["batch"] * r["config"]["kv_heads"], r["config"]["n_kv"]) for r in result["rows"]}
    assert grid == {(bk, n) for bk in (1, 8, 32, 128, 256) for n in (1024, 4096, 16384, 32768, 65536, 131072)}
    for row in result["rows"]:
        c = row["config"]
        assert row["kv_bytes"] == 2 * c["batch"] * c["kv_heads"] * c["n_kv"] * c["d"] * 2
        # a graph's steps rotate through inputs spanning four L2s, in whole rounds (one copy when it alone does)
        assert row["copies"] * row["kv_bytes"] >= 4 * l2 or row["copies"] > 1
        assert row["copies"] == 1 or (row["copies"] - 1) * row["kv_bytes"] < 4 * l2
        for timing in (row["fa2_packed"], row["fa2_unpacked"], row["flash_decoding"], row["sdpa"],
                       *row.get("flash_decoding_sweep", [])):
            assert timing["steps"] % row["copies"] == 0 and timing["steps"] >= 4
            _timed_consistently(timing, row["kv_bytes"], peak)
            _timed_consistently(timing["cold"], row["kv_bytes"], peak)
        assert max(row["max_abs_vs_sdpa"].values()) < 1e-3
    batch1 = {r["config"]["n_kv"]: r for r in result["rows"] if r["config"]["batch"] * r["config"]["kv_heads"] == 8}
    for n in (32768, 65536, 131072):
        assert batch1[n]["flash_decoding"]["pct_hbm_peak"] >= 70  # FA-2's heuristic split count
        assert batch1[n]["fa2_packed"]["pct_hbm_peak"] < 10 and batch1[n]["fa2_unpacked"]["pct_hbm_peak"] < 10
        assert max(t["pct_hbm_peak"] for t in batch1[n]["flash_decoding_sweep"]) >= 70
        # the split kernel alone streams faster than the step: the combine costs a few percent of it
        alone, step = batch1[n]["flash_decoding_split_kernel"], batch1[n]["flash_decoding"]
        assert step["ms"] > alone["ms"] > 0.85 * step["ms"]


def test_decode_diagnosis_shows_the_combine_s_share_and_the_carveout_s():
    rows = _load("decode_diagnose.json")["rows"]
    time = {(r["n_kv"], r["carveout"], r["kernels"]): r for r in rows}
    for n in (32768, 65536, 131072):
        for carveout in ("driver's choice", "largest"):
            split, step = time[n, carveout, "split"], time[n, carveout, "split + combine"]
            assert split["graph_us"] < step["graph_us"] < split["graph_us"] + 4  # the combine: a few µs
            assert step["graph_us"] < step["cold_us"]  # one cold call also counts the first kernel's start
        # the largest carve-out measures as the driver's choice, within 2%
        ours, theirs = time[n, "largest", "split"]["graph_us"], time[n, "driver's choice", "split"]["graph_us"]
        assert ours == pytest.approx(theirs, rel=0.02)


def test_decode_profile_reads_the_cache_from_dram_once_and_counts_the_closed_form():
    profile = _load("decode_bench.json")["profile"]
    assert profile["ncu_command"].startswith("ncu --clock-control none --cache-control all")
    for entry in profile["configs"]:
        c = entry["config"]
        model = sf.model.flash_decoding_traffic(c["n_kv"], c["d"], batch=c["batch"], heads=c["heads"],
                                                kv_heads=c["kv_heads"], num_splits=entry["num_splits"],
                                                block_kv=DECODE_BLOCK_KV[c["d"]][0])
        assert _traffic(entry["instrumented"]) == model
        split, combine = entry["ncu"]
        assert "flash_decoding_split" in split["kernel"] and "flash_decoding_combine" in combine["kernel"]
        # K and V come from DRAM once; the rest (Q, the partials) is a fraction of a percent
        kv = model.by_tensor["K"].read_bytes + model.by_tensor["V"].read_bytes
        assert kv <= split["dram__bytes_read.sum"] <= 1.01 * kv
        assert combine["dram__bytes_read.sum"] <= 1.1 * model.by_kernel["flash_decoding_combine"].read_bytes
        # the whole-chip model of the same launch, cold as ncu runs it: within 0.1% on the split kernel's
        # reads (K and V once, Q_i once per query tile) and 5% on the combine's (every partial)
        predicted = sf.model.predict_decode_dram(c["n_kv"], c["d"], batch=c["batch"], heads=c["heads"],
                                                 kv_heads=c["kv_heads"], num_splits=entry["num_splits"])
        assert predicted.kernel("flash_decoding_split").flow.dram_read_bytes == kv + c["batch"] * c["heads"] * c["d"] * 2
        for measured in (split, combine):
            kernel = "flash_decoding_split" if measured is split else "flash_decoding_combine"
            assert predicted.kernel(kernel).flow.dram_read_bytes == pytest.approx(
                measured["dram__bytes_read.sum"], rel=1e-3 if measured is split else 0.05)


def test_every_kernel_source_went_through_memcheck_and_racecheck():
    """benchmarks/gpu/sanitizer_all.json (`simflash gpu sanitize`, check_run.sh): one line per (tool, kernel)
    over every backends/*.cu. Racecheck over version 3 hit the run's time limit there; its racecheck ran
    clean over the same configurations in sanitizer_v3.txt."""
    from simflash.backends.sanitize import PLAN

    result = json.loads((RESULTS / "sanitizer_all.json").read_text())
    assert result["complete"] and result["tools"] == ["memcheck", "racecheck"]
    pairs = {(k["tool"], k["kernel"]): k for k in result["kernels"]}
    assert set(pairs) == {(tool, source.kernel) for tool in result["tools"] for source in PLAN}
    unclean = {pair for pair, k in pairs.items() if not k["clean"]}
    assert unclean == {("racecheck", "flash2_forward_v3")}
    assert all(k["errors"] == 0 and k["launches"] > 0 for pair, k in pairs.items() if pair not in unclean)
    timed_out = [r for r in result["runs"] if r["tool"] == "racecheck" and r["group"] == "forward-v3"]
    assert len(timed_out) == 1 and not timed_out[0]["clean"] and "hazard" not in timed_out[0]["output"].lower()
    v3 = (RESULTS / "sanitizer_v3.txt").read_text().split("--tool racecheck")[1].split("$ compute-sanitizer")[0]
    assert "flash2_forward v3, timed build" in v3 and "flash2_forward v3-nopp, timed build" in v3
    assert "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in v3
