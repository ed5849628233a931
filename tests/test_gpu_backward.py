"""The GPU backward's CPU side: the float64 gradients it is held to, the naive same-dtype backward that
sets the 2x rule, the ledger's definition its counters must equal, the Nsight Compute split between our
kernels and SDPA's, and the tables. No GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np
import pytest

import simflash as sf
from simflash.backends import profile, profile_backward, report_backward, validate_backward
from simflash.backends.bench_backward import BackwardBenchConfig
from simflash.backends.validate_backward import (
    MASKS,
    BackwardConfig,
    defined_traffic,
    gradient_atol,
    model_traffic,
    naive_backward,
    reference_backward,
)
from simflash.config import MiB
from simflash.memory import Flow, Traffic
from simflash.numerics import max_abs_error


def _inputs(rng, heads, n_q, n_kv, d):
    return (rng.standard_normal((heads, n_q, d)), rng.standard_normal((heads, n_kv, d)),
            rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_q, d)))


@pytest.mark.parametrize(("causal", "variant"), MASKS)
@pytest.mark.parametrize(("n_q", "n_kv"), [(23, 23), (9, 31), (31, 9)])
def test_the_float64_gradients_are_those_of_central_differences(causal, variant, n_q, n_kv):
    rng = np.random.default_rng(7)
    q, k, v, do = (x.astype(np.float32).astype(np.float64) for x in _inputs(rng, 2, n_q, n_kv, 8))

    def loss(q_, k_, v_):  # <O, dO>: its gradient in (q, k, v) is (dq, dk, dv)
        return float((reference_backward(q_, k_, v_, do, causal, variant, dtype="float32")[0] * do).sum())

    _, _, *grads = reference_backward(q, k, v, do, causal, variant, dtype="float32")
    eps = 2.0**-10  # float32 holds x + eps exactly for these x: the reference rounds its inputs to float32
    for which, grad in enumerate(grads):
        for index in [(0, 0, 0), (1, min(grad.shape[1], 5) - 1, 3), (1, grad.shape[1] - 1, 7)]:
            args = [q, k, v]
            plus, minus = args[which].copy(), args[which].copy()
            plus[index] += eps
            minus[index] -= eps
            numeric = (loss(*args[:which], plus, *args[which + 1:]) - loss(*args[:which], minus, *args[which + 1:]))
            assert numeric / (2 * eps) == pytest.approx(grad[index], abs=1e-5)


def test_rows_that_see_no_key_get_zero_gradients_and_no_nan():
    rng = np.random.default_rng(1)
    q, k, v, do = _inputs(rng, 1, 40, 10, 16)  # lower-right: rows 0..29 see no key
    O, L, dq, dk, dv = reference_backward(q, k, v, do, True, "lower_right", dtype="float32")
    assert not np.isnan(dq).any() and not np.isnan(dk).any() and not np.isnan(dv).any()
    assert np.array_equal(O[0, :30], np.zeros((30, 16))) and np.array_equal(dq[0, :30], np.zeros((30, 16)))
    assert np.isposinf(L[0, :30]).all() and np.isfinite(L[0, 30:]).all()
    naive = naive_backward(q, k, v, do, True, "lower_right", dtype="float16")
    assert np.array_equal(naive[0][0, :30], np.zeros((30, 16), dtype=np.float32))


def test_the_float64_logsumexp_is_the_simulator_s_forward_s():
    rng = np.random.default_rng(2)
    q, k, v, do = (x.astype(np.float32) for x in _inputs(rng, 2, 150, 70, 64))
    for causal, variant in MASKS:
        _, L, *_ = reference_backward(q, k, v, do, causal, variant, dtype="bfloat16")
        sim = sf.flash_attention(q, k, v, 128, 64, causal=causal, causal_variant=variant, dtype="bfloat16",
                                 write_logsumexp=True, trace="none")
        np.testing.assert_allclose(sim.logsumexp, L, rtol=1e-5)  # +inf in the same rows


@pytest.mark.parametrize(("dtype", "worst"), [("float16", 2e-2), ("bfloat16", 2e-1)])
def test_the_naive_backward_errs_by_its_dtype_s_rounding(dtype, worst):
    rng = np.random.default_rng(3)
    q, k, v, do = _inputs(rng, 2, 200, 150, 64)
    _, _, *ref = reference_backward(q, k, v, do, True, "upper_left", dtype=dtype)
    for naive, exact in zip(naive_backward(q, k, v, do, True, "upper_left", dtype=dtype), ref):
        error = max_abs_error(naive, exact)
        assert 0 < error < worst * np.abs(exact).max()
    # the rule's slack is a few float32 roundoffs of max|dO| max|V|: far below what naive errs by
    assert gradient_atol(v, do) == pytest.approx(16 * 2.0**-24 * np.abs(v).max() * np.abs(do).max())


def test_the_ledger_definition_for_the_lesson_s_shapes_by_hand():
    # N = 4096, d = 128, fp16, B_r = 64, B_c = 128, one head: T_r = 64 query tiles, T_c = 32 KV tiles.
    t = defined_traffic(4096, 4096, 128)
    tile = 4096 * 128 * 2  # one pass over Q (or K, V, O, dO, dQ, dK, dV): 1 MiB
    assert t.ledger[("flash2_backward_preprocess", "O")] == Flow(read_bytes=tile)
    assert t.ledger[("flash2_backward_preprocess", "D")] == Flow(write_bytes=4096 * 4)
    assert t.ledger[("flash2_backward_preprocess", "dQ_accum")] == Flow(write_bytes=2 * tile)  # float32
    assert t.ledger[("flash2_backward", "K")] == Flow(read_bytes=tile)  # each KV tile once
    assert t.ledger[("flash2_backward", "Q")] == Flow(read_bytes=32 * tile)  # all of Q per KV tile
    assert t.ledger[("flash2_backward", "L")] == Flow(read_bytes=32 * 4096 * 4)
    assert t.ledger[("flash2_backward", "dQ_accum")] == Flow(write_bytes=32 * 2 * tile)  # 64 MiB of atomic adds
    assert t.ledger[("flash2_backward", "dK")] == Flow(write_bytes=tile)
    assert t.ledger[("flash2_backward_convert", "dQ")] == Flow(write_bytes=tile)
    assert t.total_bytes == (2 * tile + 4096 * 4 + 2 * tile) + (2 * tile + 64 * tile + 2 * 32 * 4096 * 4
                                                                 + 64 * tile + 2 * tile) + (2 * tile + tile)
    # causal: KV tile j (columns 128 j..) is seen from query tile 2j on: 64 - 2j tiles, 1056 in all
    causal = defined_traffic(4096, 4096, 128, causal=True)
    assert causal.ledger[("flash2_backward", "Q")] == Flow(read_bytes=1056 * 64 * 128 * 2)
    assert causal.ledger[("flash2_backward", "K")] == Flow(read_bytes=tile)
    assert defined_traffic(4096, 4096, 128, heads=32) == t.times(32)


def test_kv_tiles_no_query_tile_sees_are_written_without_being_read():
    # upper-left, n_q = 100 < n_kv = 333: columns 100.. are nobody's; KV tiles 1 and 2 (128..332) unvisited
    t = defined_traffic(100, 333, 64, causal=True)
    assert t.ledger[("flash2_backward", "K")] == Flow(read_bytes=128 * 64 * 2)
    assert t.ledger[("flash2_backward", "dK")] == Flow(write_bytes=333 * 64 * 2)
    assert t.ledger[("flash2_backward", "Q")] == Flow(read_bytes=100 * 64 * 2)  # both query tiles, ragged
    assert t.ledger[("flash2_backward", "dQ_accum")] == Flow(write_bytes=100 * 64 * 4)


def test_backward_flops_by_hand():
    # five products of 2 N^2 d per head, 32 heads: 10 * 2^5 * 2^24 * 2^7 = 5 * 2^37
    assert BackwardBenchConfig(4096, 128).flops == 5 * 2**37
    assert BackwardBenchConfig(4096, 128, causal=True).flops == 5 * 2**36


NCU_CSV = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","void flash2_backward_preprocess<0, 64, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(64, 32, 1)","0","9.0","m","dram__bytes_read.sum","byte","2,097,152"
"0","1","python3","h","void flash2_backward_preprocess<0, 64, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(64, 32, 1)","0","9.0","m","gpu__time_duration.sum","nsecond","1000"
"1","1","python3","h","void flash2_backward<0, 64, 128, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(32, 32, 1)","0","9.0","m","dram__bytes_read.sum","byte","10"
"2","1","python3","h","void flash2_backward_convert<0, 0>(const float *)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","20"
"3","1","python3","h","void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::half_t>>(Flash_bwd_params)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","30"
"4","1","python3","h","void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::half_t>>(Flash_bwd_params)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","40"
"5","1","python3","h","void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::half_t>>(Flash_bwd_params, int)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","50"
"6","1","python3","h","void flash2_backward_preprocess<0, 64, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(64, 32, 1)","0","9.0","m","dram__bytes_read.sum","byte","60"
"7","1","python3","h","void flash2_backward<0, 64, 128, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(32, 32, 1)","0","9.0","m","dram__bytes_read.sum","byte","70"
"8","1","python3","h","void flash2_backward_convert<0, 0>(const float *)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","80"
"9","1","python3","h","void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>()","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","m","dram__bytes_read.sum","byte","90"
==PROF== Disconnected from process 1
'''


def test_the_profile_splits_ours_from_sdpa_s_kernels_and_reads_fa2_s_tiles_off_their_names():
    kernels = profile.parse_ncu_csv(NCU_CSV)
    configs = [profile_backward.BackwardProfileConfig(4096, 128, 32), profile_backward.BackwardProfileConfig(4096, 128, 32, True)]
    (ours, theirs), (ours2, theirs2) = profile_backward.split_kernels(kernels, configs)
    assert [k["metrics"]["dram__bytes_read.sum"] for k in ours] == [2097152, 10, 20]
    assert [k["metrics"]["dram__bytes_read.sum"] for k in theirs] == [30, 40, 50]
    assert [k["metrics"]["dram__bytes_read.sum"] for k in theirs2] == [90] and len(ours2) == 3
    counted = {"instrumented": [[kernel, tensor, flow.read_bytes, flow.write_bytes]
                                for (kernel, tensor), flow in defined_traffic(4096, 4096, 128, heads=32).ledger.items()]}
    rows = profile_backward.kernel_rows(configs[0], ours, theirs, counted)
    logical = defined_traffic(4096, 4096, 128, heads=32).by_kernel
    assert [(r["side"], r["kernel"], r["tiles"]) for r in rows] == [
        ("ours", "flash2_backward_preprocess", "64x128"), ("ours", "flash2_backward", "64x128"),
        ("ours", "flash2_backward_convert", "64x128"), ("sdpa_flash", "flash2_backward_preprocess", "64x128"),
        ("sdpa_flash", "flash2_backward", "64x128"), ("sdpa_flash", "flash2_backward_convert", "64x128")]
    assert all(r["logical_bytes"] == logical[r["kernel"]].total_bytes for r in rows)
    assert all(r["instrumented_bytes"] == logical[r["kernel"]].total_bytes for r in rows[:3])
    assert rows[0]["dram_read_bytes"] == 2097152 and rows[0]["time_ns"] == 1000
    table = report_backward.profile_table({"configs": [{"config": {"n": 4096, "d": 128, "heads": 32, "causal": False},
                                                        "kernels": rows}]})
    assert table[1][0][:5] == ["N=4096 d=128 H=32 full", "ours", "flash2_backward_preprocess",
                               "flash2_backward_preprocess", "64x128"]
    assert table[1][0][5] == f"{logical['flash2_backward_preprocess'].total_bytes / MiB:,.2f}"
    assert table[1][4][2:5] == ["flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "flash2_backward", "64x128"]
    with pytest.raises(RuntimeError, match="expected 1 runs of flash2_backward_preprocess"):
        profile_backward.split_kernels(kernels, configs[:1])


def test_backward_profile_configurations_are_checked():
    with pytest.raises(ValueError, match="d must be one of"):
        profile_backward.BackwardProfileConfig(4096, d=256)
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        profile_backward.BackwardProfileConfig(4096, heads=0)


def _record(config: BackwardConfig, error: float) -> dict:
    """A validation record as validate_backward.check writes it, every check held, errors as given."""
    gradient = {"gpu": error, "naive_same_dtype": 2 * error, "atol": 0.0, "relative_gpu": error, "within_fa_rule": True}
    return {"config": attrs.asdict(config), "gradients": {g: dict(gradient) for g in ("dq", "dk", "dv")},
            "traffic": {"equals_definition": True, "equals_model": None},
            "forward": {"traffic_equals_model": True, "logsumexp_same_infinities": True},
            "timed": {"dk_dv_equal_instrumented": True, "dq_within_fa_rule": True},
            "resources": [{"kernel": "flash2_backward<0, 64, 128, 64, true>", "threads": 256, "registers": 228,
                           "local_bytes": 0, "shared_bytes": 98432}]}


def test_a_gradient_outside_the_2x_rule_passes_only_when_sdpa_flash_misses_it_as_far():
    naive, atol = 1e-3, 1e-6
    inside = validate_backward._gradient_record(np.full(4, 1.9e-3), np.full(4, 1e-3), np.zeros(4), atol, "bfloat16")
    assert inside["within_fa_rule"] is True and validate_backward.within_rule(inside)
    gpu = np.full(4, 2.5 * naive)
    for sdpa_error, holds in ((2.5 * naive, True), (2.6 * naive, True), (2.2 * naive, False)):
        record = validate_backward._gradient_record(gpu, np.full(4, naive), np.zeros(4), atol, "bfloat16",
                                                    sdpa=np.full(4, sdpa_error))
        assert record["within_fa_rule"] is False and validate_backward.within_rule(record) is holds
    without_sdpa = validate_backward._gradient_record(gpu, np.full(4, naive), np.zeros(4), atol, "bfloat16")
    assert validate_backward.within_rule(without_sdpa) is False


def test_the_validation_table_groups_masks_and_says_what_held():
    records = [_record(BackwardConfig(17, 17, 64, 2, causal, variant, "float16"), 1e-3 if causal else 2e-3)
               for causal, variant in MASKS]
    headers, rows = report_backward.validate_table({"records": records})
    assert len(rows) == 1 and rows[0][5] == "full,upper_left,lower_right"
    assert rows[0][6] == "2.00e-03 / 4.00e-03 / –"  # worst over the masks; SDPA never ran here
    assert rows[0][headers.index("2x rule")] == "yes" and rows[0][headers.index("bytes = model")] == "–"
    assert report_backward.resources_table({"records": records})[1] == [
        ["flash2_backward<0, 64, 128, 64, true>", "256", "228", "0", "98432"]]


# -- the committed H200 results (benchmarks/gpu/backward_*.json) against today's checks and definitions

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_every_backward_validation_record_passes_today_s_checks_and_covers_the_grid():
    result = _load("backward_validate.json")
    assert result["device"]["name"] == "NVIDIA H200" and result["command"].startswith("simflash gpu validate --backward")
    assert result["all_ok"] and all(validate_backward.passed(r) for r in result["records"])
    assert all(case["refused"] and case["case"].split("=")[0] in case["message"] for case in result["refusals"])
    configs = [r["config"] for r in result["records"]]
    square = {(c["n_q"], c["d"], c["causal"], c["causal_variant"], c["dtype"]) for c in configs if c["n_q"] == c["n_kv"]}
    assert square >= {(n, d, *mask, dtype) for n in (1, 17, 128, 1000) for d in (64, 128) for mask in MASKS
                      for dtype in ("float16", "bfloat16")}
    assert any(c["n_q"] < c["n_kv"] for c in configs) and any(c["n_q"] > c["n_kv"] for c in configs)
    assert {(c["block_q"], c["block_kv"]) for c in configs} == {(64, 128), (128, 128)}
    assert sum(r["sdpa"] == "ran" for r in result["records"]) >= 40
    # no spills at 64 x 128 and d = 64; with 128-wide S_ij rows per warp pair (d = 128, or B_r = 128) the fp32
    # P_ij held through dP_ij (dS_ij from the unrounded P, as FA-2) costs at most 16 bytes of stack per thread
    assert all(k["local_bytes"] == 0 or (k["local_bytes"] <= 16 and ", 128, 128, " in k["kernel"])
               for r in result["records"] for k in r["resources"])


def test_backward_counted_bytes_equal_the_definition_recomputed_now():
    for record in _load("backward_validate.json")["records"]:
        c = record["config"]
        counted = Traffic({(kernel, tensor): Flow(read, write) for kernel, tensor, read, write in record["traffic"]["instrumented"]})
        assert counted == defined_traffic(c["n_q"], c["n_kv"], c["d"], c["block_q"], c["block_kv"], c["dtype"], c["causal"],
                                          c["causal_variant"], c["heads"]), c
        model = model_traffic(BackwardConfig(**c))
        assert model is None or counted == model, c


def test_backward_bench_rows_are_consistent_and_meet_half_of_sdpa_s_speed():
    result = _load("backward_bench.json")
    grid = set()
    for row in result["rows"]:
        c = row["config"]
        grid.add((c["n"], c["d"], c["causal"]))
        assert row["flops"] == 10 * 32 * c["n"] ** 2 * c["d"] // (2 if c["causal"] else 1)
        for timing in (row["ours"]["64x128"], row["sdpa_flash"]):
            assert timing["tflops"] == pytest.approx(row["flops"] / (timing["ms"] / 1e3) / 1e12, rel=1e-9)
            assert timing["min_ms"] <= timing["ms"] <= timing["max_ms"]
        assert row["ratio_vs_sdpa_flash"] >= 0.5
        logical = defined_traffic(c["n"], c["n"], c["d"], 64, 128, "float16", c["causal"], heads=32).total_bytes
        assert row["ours"]["64x128"]["logical_bandwidth"]["bytes"] == logical
    assert grid == {(n, d, causal) for n in (1024, 2048, 4096, 8192, 16384) for d in (64, 128) for causal in (False, True)}


def test_backward_profile_counts_are_the_ledger_s_at_each_side_s_tiles():
    result = _load("backward_profile.json")
    assert result["ncu_command"].startswith("ncu --clock-control none --cache-control all")
    assert (RESULTS / "backward_profile_ncu.csv").read_text().count("flash_bwd_dq_dk_dv") >= 2 * 4  # 4 metrics each
    for entry in result["configs"]:
        c = entry["config"]
        logical = defined_traffic(c["n"], c["n"], c["d"], c["block_q"], c["block_kv"], "float16", c["causal"],
                                  heads=c["heads"]).by_kernel
        rows = entry["kernels"]
        assert [r["kernel"] for r in rows if r["side"] == "ours"] == list(profile_backward.OURS)
        assert {r["kernel"] for r in rows if r["side"] == "sdpa_flash"} >= set(profile_backward.OURS)
        for r in rows:
            if r["kernel"] is not None:
                assert r["logical_bytes"] == logical[r["kernel"]].total_bytes  # FA-2 at d = 128 uses 64 x 128 too
            if r["side"] == "ours":
                assert r["instrumented_bytes"] == r["logical_bytes"]
        main = next(r for r in rows if r["side"] == "ours" and r["kernel"] == "flash2_backward")
        # compulsory: Q, K, V and dO read from DRAM at least once each
        assert main["dram_read_bytes"] >= 4 * c["heads"] * c["n"] * c["d"] * 2


def test_backward_configurations_take_their_tiles_by_keyword_and_refuse_impossible_head_groups():
    assert {(c.block_q, c.block_kv, c.batch) for c in validate_backward.default_configs()} == {(64, 128, 1),
                                                                                               (128, 128, 1)}
    with pytest.raises(TypeError):
        BackwardConfig(1000, 777, 64, 2, False, "upper_left", "float16", 1, None, (-1, -1), False, 128)
    with pytest.raises(ValueError, match="kv_heads must divide heads = 2, got 128"):
        BackwardConfig(1000, 777, 64, 2, False, "upper_left", "float16", 128, 128)
