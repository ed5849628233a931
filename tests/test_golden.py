"""The golden traces in traces/: they match what the code produces, and they show what they claim to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash import golden, perfetto
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.cli import app

TRACES = Path(__file__).resolve().parents[1] / "traces"


def test_committed_golden_traces_match_the_code():
    problems = golden.check_golden(TRACES)
    assert problems == [], "\n".join(problems) + "\nregenerate with `simflash golden` if the change is intended"


def test_every_case_has_a_trace_and_a_timeline_per_variant():
    names = {path.name for path in TRACES.glob("*.json")}
    for case in golden.GOLDEN_CASES:
        for variant in FLASH_ALGORITHMS:
            assert {f"{case}.{variant}.json", f"{case}.{variant}.perfetto.json"} <= names
    assert {f"{case}.fa2_backward.json" for case in golden.GOLDEN_BACKWARD_CASES} <= names
    assert not any(name.endswith("fa2_backward.perfetto.json") for name in names)  # the backward records no events


def test_backward_trace_steps_through_the_ragged_causal_case():
    trace = sf.BackwardTrace.load(TRACES / "ragged_lower_right.fa2_backward.json")
    config = trace.config
    assert (config["n_q"], config["n_kv"], config["block_q"], config["block_kv"]) == (10, 7, 4, 3)
    assert config["causal"] and config["causal_variant"] == "lower_right" and trace.level == "full"
    schedule = sf.TileSchedule(10, 7, 4, 3, causal=True, causal_variant="lower_right")
    assert [(s.j, s.i) for s in trace] == [(j, i) for j in range(3) for i in schedule.q_tiles(j)]
    assert sorted({(s.i, s.L.size) for s in trace}) == [(0, 4), (1, 4), (2, 2)]  # ragged query tiles
    assert sorted({(s.j, s.dk_norm.size) for s in trace}) == [(0, 3), (1, 3), (2, 1)]  # and KV tiles
    first = trace.of_kv_tile(0)[0]
    assert np.isposinf(first.L[:3]).all() and np.isfinite(first.L[3])  # rows 0-2 see no key ...
    assert (first.P[:3] == 0).all() and (first.dS[:3] == 0).all()  # ... so their P is exp(-inf) = 0
    share = np.zeros(10)
    for step in trace:
        share[step.rows] += step.p_rowsum
        np.testing.assert_allclose(step.p_rowsum, step.P.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(share, [0, 0, 0] + [1] * 7, rtol=1e-6)  # P recomputed from L: each row's softmax
    # The last step of every KV tile holds dK_j and dV_j as the run wrote them.
    case = golden.GOLDEN_CASES["ragged_lower_right"]()
    run = sf.flash_attention_backward(case.q, case.k, case.v, case.do, **case.options)
    for j in range(3):
        last = trace.of_kv_tile(j)[-1]
        np.testing.assert_allclose(last.dK, run.dk[last.cols], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(last.dV, run.dv[last.cols], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("variant", list(FLASH_ALGORITHMS))
def test_two_tile_trace_is_the_worked_example(variant):
    case = golden.GOLDEN_CASES["two_tile"]()
    trace = sf.Trace.load(TRACES / f"two_tile.{variant}.json")
    assert [(s.i, s.j) for s in trace] == [(0, 0), (0, 1)]
    # Independent float64 reference: scores and the full-row softmax.
    scores = (case.k @ case.q[0]).astype(np.float64)  # (4,)
    assert scores.tolist() == [8.0, 6.0, 10.0, 7.0]
    # By hand, from the definitions (not the online update): m = max score seen so far; l = sum of
    # exp(score - m) over the keys seen so far; alpha = exp(m_old - m_new).
    m1, m2 = 8.0, 10.0
    l1 = 1 + np.exp(-2.0)  # scores 8, 6 against m = 8
    l2 = np.exp(-2.0) + np.exp(-4.0) + 1 + np.exp(-3.0)  # scores 8, 6, 10, 7 against m = 10
    first, second = trace
    np.testing.assert_allclose([first.m[0], second.m[0]], [m1, m2], rtol=1e-7)
    np.testing.assert_allclose(second.alpha[0], np.exp(-2.0), rtol=1e-6)
    np.testing.assert_allclose([first.l[0], second.l[0]], [l1, l2], rtol=1e-6)
    weights = np.exp(scores - m2) / np.exp(scores - m2).sum()
    expected_out = weights @ case.v
    run = sf.flash_attention(case.q, case.k, case.v, variant=variant, **case.options)
    np.testing.assert_allclose(run.out[0], expected_out, rtol=1e-6)
    # The lesson's rounded values.
    np.testing.assert_allclose(np.round(expected_out, 4), [4.6025, 5.6025])
    np.testing.assert_allclose(round(float(second.l[0]), 4), 1.2034)


def test_fa2_two_tile_accumulator_is_unnormalised_until_the_end():
    case = golden.GOLDEN_CASES["two_tile"]()
    trace = sf.Trace.load(TRACES / "two_tile.fa2.json")
    scores = case.k @ case.q[0]
    a1 = np.exp(scores[:2] - 8.0) @ case.v[:2]
    np.testing.assert_allclose(trace[0].a[0], a1, rtol=1e-6)
    np.testing.assert_allclose(np.round(trace[0].a[0], 4), [1.4060, 2.5413])
    np.testing.assert_allclose(np.round(trace[1].a[0], 4), [5.5388, 6.7422])


@pytest.mark.parametrize("variant", list(FLASH_ALGORITHMS))
def test_causal_case_shows_skipped_masked_and_full_tiles(variant):
    trace = sf.Trace.load(TRACES / f"causal16.{variant}.json")
    config = trace.config
    schedule = sf.TileSchedule(config["n_q"], config["n_kv"], config["block_q"], config["block_kv"], causal=True)
    kinds = schedule.kind_map()
    assert {"full", "masked", "skipped"} <= set(kinds.ravel())
    visited = {(s.i, s.j): s.masked for s in trace}
    expected = {(i, j): kinds[i, j] == "masked" for i, j in np.ndindex(kinds.shape) if kinds[i, j] != "skipped"}
    assert visited == expected


@pytest.mark.parametrize("variant", list(FLASH_ALGORITHMS))
def test_ragged_cases_have_short_edge_tiles(variant):
    trace = sf.Trace.load(TRACES / f"ragged.{variant}.json")
    assert sorted({(s.i, s.m.size) for s in trace}) == [(0, 4), (1, 4), (2, 2)]
    assert trace.config["n_q"] == 10 and trace.config["n_kv"] == 7
    lower_right = sf.Trace.load(TRACES / f"ragged_lower_right.{variant}.json")
    first = lower_right.of_tile(0)[-1]
    assert np.isneginf(first.m[:3]).all() and np.isfinite(first.m[3])  # rows 0-2 see no key
    assert (first.l[:3] == 0).all()


def test_golden_perfetto_files_are_timelines_of_the_runs():
    for run in golden.golden_runs(["two_tile"]):
        committed = json.loads((TRACES / f"{run.stem}.perfetto.json").read_text())
        totals = [r["args"]["total"] for r in committed["traceEvents"] if r["name"] == perfetto.HBM_TOTAL_COUNTER]
        assert totals[-1] == sum(e.nbytes for e in run.events if e.op in ("read", "write"))


@pytest.fixture
def golden_copy(tmp_path):
    shutil.copytree(TRACES, tmp_path / "traces")
    return tmp_path / "traces"


def test_check_catches_a_changed_value(golden_copy):
    path = golden_copy / "causal16.fa2.json"
    doc = json.loads(path.read_text())
    doc["steps"][3]["l"][1] *= 1 + 1e-4
    path.write_text(json.dumps(doc))
    assert golden.check_golden(golden_copy) == [f"{path}: step 3 (head 0, i 1, j 1): l differs"]


def test_check_catches_a_changed_backward_value(golden_copy):
    path = golden_copy / "ragged_lower_right.fa2_backward.json"
    doc = json.loads(path.read_text())
    doc["steps"][2]["dV"][0][1] *= 1 + 1e-4
    path.write_text(json.dumps(doc))
    step = doc["steps"][2]
    assert golden.check_golden(golden_copy) == [f"{path}: step 2 (head 0, i {step['i']}, j {step['j']}): dV differs"]
    doc["format"] = "simflash.trace"
    path.write_text(json.dumps(doc))
    assert golden.check_golden(golden_copy) == [f"{path}: a forward trace (format 'simflash.trace'), not a backward "
                                                "trace; load it with simflash.Trace.load"]


def test_check_tolerates_rounding_but_not_structure(golden_copy):
    path = golden_copy / "ragged.fa2.json"
    doc = json.loads(path.read_text())
    value = np.float32(doc["steps"][0]["a"][0][0])
    doc["steps"][0]["a"][0][0] = float(np.nextafter(value, np.float32(np.inf)))  # one ulp: within tolerance
    path.write_text(json.dumps(doc))
    assert golden.check_golden(golden_copy) == []
    doc["steps"][0]["masked"] = not doc["steps"][0]["masked"]
    path.write_text(json.dumps(doc))
    assert golden.check_golden(golden_copy) == [f"{path}: step 0 (head 0, i 0, j 0): masked differs"]


def test_check_catches_missing_stale_damaged_and_changed_timelines(golden_copy):
    (golden_copy / "ragged.fa2.json").unlink()
    (golden_copy / "old_case.fa2.json").write_text("{}")
    (golden_copy / "causal16.fa2.json").write_text('{"format": "simflash.trace", "schema_')
    timeline = golden_copy / "two_tile.fa2.perfetto.json"
    timeline.write_text(timeline.read_text().replace('"bytes":16', '"bytes":17', 1))
    problems = golden.check_golden(golden_copy)
    assert any("ragged.fa2.json: missing" in p for p in problems)
    assert any("old_case.fa2.json: not produced by any golden case" in p for p in problems)
    assert any("causal16.fa2.json: not a complete JSON document" in p for p in problems)
    assert any("two_tile.fa2.perfetto.json: the timeline differs" in p for p in problems)
    assert len(problems) == 4


def test_golden_command_writes_then_checks(tmp_path):
    runner = CliRunner()
    directory = tmp_path / "fresh"
    written = runner.invoke(app, ["golden", "--dir", str(directory)])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in directory.iterdir()) == sorted(p.name for p in TRACES.glob("*.json"))
    checked = runner.invoke(app, ["golden", "--check", "--dir", str(directory)])
    assert checked.exit_code == 0 and "match the code" in checked.output
    (directory / "two_tile.fa2.json").unlink()
    failed = runner.invoke(app, ["golden", "--check", "--dir", str(directory)])
    assert failed.exit_code == 1 and "missing" in failed.output
