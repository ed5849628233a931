"""Backward trace files: lossless JSON and NPZ round trips carrying the run's config, a forward file is
not a backward one (nor the reverse), every damaged or inconsistent file refused naming the field, and
`simflash export --backward`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_trace_file_errors import edit_json, edit_npz, set_config
from typer.testing import CliRunner

import simflash as sf
from simflash import trace_diff, trace_schema
from simflash.api import RunConfig
from simflash.cli import app
from simflash.config import STORAGE_DTYPES
from simflash.trace_backward_files import BACKWARD_CONFIG_TYPES, FULL_FIELDS, STEP_FIELDS
from simflash.trace_schema import TraceFileError

SUFFIXES = (".json", ".npz")


def backward_run(seed=0, n_q=10, n_kv=7, d=4, heads=2, kv_heads=None, block_q=4, block_kv=3, level="full",
                 dtype="float32", **options) -> sf.BackwardRun:
    rng = np.random.default_rng(seed)
    q, do = rng.standard_normal((2, heads, n_q, d))
    k, v = rng.standard_normal((2, kv_heads or heads, n_kv, d))
    return sf.flash_attention_backward(q, k, v, do, block_q, block_kv, dtype=dtype, trace=level, **options)


def assert_identical(expected: sf.BackwardTrace, actual: sf.BackwardTrace) -> None:
    """Exact equality: level, config, every index and every array (dtype, shape, bits, sign of zero)."""
    assert type(actual) is sf.BackwardTrace
    assert actual.level == expected.level and dict(actual.config) == dict(expected.config)
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        for field in attrs.fields(sf.BackwardStep):
            x, y = getattr(want, field.name), getattr(got, field.name)
            if isinstance(x, np.ndarray):
                assert y.dtype == x.dtype == np.float32 and y.shape == x.shape, field.name
                assert np.array_equal(y.view(np.uint32), x.view(np.uint32)), field.name
            else:
                assert y == x and type(y) is type(x), field.name


def refused(path: Path, message: str) -> None:
    with pytest.raises(TraceFileError, match=message):
        sf.BackwardTrace.load(path)


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("level", ["full", "stats"])
def test_round_trip_is_lossless_and_self_describing(tmp_path, suffix, level):
    # lower_right with n_q > n_kv: rows 0-2 see no key, so L holds +inf; grouped heads; ragged tiles.
    run = backward_run(seed=3, heads=4, kv_heads=2, level=level, causal=True, causal_variant="lower_right",
                       window=(5, 0), forward_block_q=8, forward_block_kv=4)
    assert any(np.isposinf(step.L).any() for step in run.trace)
    back = sf.BackwardTrace.load(run.trace.save(tmp_path / f"trace{suffix}"))
    assert_identical(run.trace, back)
    assert trace_diff.trace_differences(run.trace, back) == []
    assert (back[0].P is None) == (level == "stats")
    config = back.config
    assert (config["n_q"], config["n_kv"], config["d"], config["heads"], config["kv_heads"]) == (10, 7, 4, 4, 2)
    tiles = (config["block_q"], config["block_kv"], config["forward_block_q"], config["forward_block_kv"])
    assert tiles == (4, 3, 8, 4)
    assert (config["dtype"], config["causal"], config["causal_variant"], config["window"]) == (
        "float32", True, "lower_right", (5, 0))
    assert config["algorithm"] == "fa2_backward" and back.level == level


@given(n_q=st.integers(1, 9), n_kv=st.integers(1, 9), d=st.integers(1, 5), block_q=st.integers(1, 5),
       block_kv=st.integers(1, 5), group=st.integers(1, 2), causal=st.booleans(), lower_right=st.booleans(),
       level=st.sampled_from(["stats", "full"]), dtype=st.sampled_from(sorted(STORAGE_DTYPES)),
       seed=st.integers(0, 2**16))
def test_round_trip_property(tmp_path_factory, n_q, n_kv, d, block_q, block_kv, group, causal, lower_right, level,
                             dtype, seed):
    run = backward_run(seed, n_q, n_kv, d, group, 1, block_q, block_kv, level, dtype, causal=causal,
                       causal_variant="lower_right" if lower_right else "upper_left")
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal, "lower_right" if lower_right else "upper_left")
    assert len(run.trace) == group * sum(len(sched.q_tiles(j)) for j in range(sched.n_kv_tiles))
    directory = tmp_path_factory.mktemp("round")
    for suffix in SUFFIXES:
        assert_identical(run.trace, sf.BackwardTrace.load(run.trace.save(directory / f"t{suffix}")))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_traces_without_steps_keep_their_config(tmp_path, suffix):
    rng = np.random.default_rng(5)
    q, k, v, do = rng.standard_normal((4, 8, 4))
    for run in (sf.naive_attention_backward(q, k, v, do, causal=True), sf.flash_attention_backward(q, k, v, do)):
        back = sf.BackwardTrace.load(run.trace.save(tmp_path / f"empty{suffix}"))
        assert_identical(run.trace, back)
        assert back.level == "none" and len(back) == 0 and back.config["n_q"] == 8
    assert back.config["algorithm"] == "fa2_backward"


def test_json_is_readable_and_strict(tmp_path):
    run = backward_run(causal=True, causal_variant="lower_right")
    text = run.trace.save(tmp_path / "t.json").read_text()
    doc = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert doc["format"] == "simflash.backward_trace" and doc["schema_version"] == 1 and doc["level"] == "full"
    assert doc["config"]["algorithm"] == "fa2_backward" and doc["config"]["n_kv"] == 7
    assert doc["steps"][0]["L"][:3] == ["inf", "inf", "inf"]  # rows 0-2 see no key
    assert tuple(doc["steps"][0]) == STEP_FIELDS
    assert sum(1 for line in text.splitlines() if line.startswith('    {"head"')) == len(run.trace)


def test_a_backward_trace_has_no_timeline(tmp_path):
    trace = backward_run().trace
    with pytest.raises(ValueError, match="a backward trace has no Perfetto timeline"):
        trace.save(tmp_path / "t.perfetto.json")
    with pytest.raises(ValueError, match="format must be one of"):
        trace.save(tmp_path / "t.json", format="yaml")
    assert not list(tmp_path.iterdir())
    path = trace.save(tmp_path / "no_suffix", format="npz")
    assert_identical(trace, sf.BackwardTrace.load(path, format="npz"))


def test_trace_differences_compare_backward_traces():
    run, again = backward_run(causal=True), backward_run(causal=True)
    assert trace_diff.trace_differences(run.trace, again.trace) == []
    nudged = again.trace[2].dK
    nudged[1, 0] = np.nextafter(nudged[1, 0], np.float32(np.inf))
    step = run.trace[2]
    assert trace_diff.trace_differences(run.trace, again.trace) == [
        f"step 2 (head 0, i {step.i}, j {step.j}): dK differs"]
    assert trace_diff.trace_differences(run.trace, again.trace, rtol=1e-6) == []
    forward = sf.flash_attention(*np.ones((3, 4, 2)), 2, 2).trace
    assert trace_diff.trace_differences(forward, run.trace) == ["a BackwardTrace is not a Trace"]


# ------------------------------------------------------------------- forward and backward files apart


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_forward_file_is_not_a_backward_trace_nor_the_reverse(tmp_path, suffix):
    backward = backward_run().trace.save(tmp_path / f"backward{suffix}")
    rng = np.random.default_rng(0)
    forward = sf.flash_attention(*rng.standard_normal((3, 8, 4)), 4, 4, trace="full").trace.save(
        tmp_path / f"forward{suffix}")
    with pytest.raises(TraceFileError, match=r"a forward trace \(format 'simflash.trace'\), not a backward trace; "
                                             "load it with simflash.Trace.load"):
        sf.BackwardTrace.load(forward)
    with pytest.raises(TraceFileError, match=r"a backward trace \(format 'simflash.backward_trace'\), not a forward "
                                             "trace; load it with simflash.BackwardTrace.load"):
        sf.Trace.load(backward)


def test_a_perfetto_file_is_not_a_backward_trace(tmp_path):
    rng = np.random.default_rng(0)
    run = sf.flash_attention(*rng.standard_normal((3, 8, 4)), 4, 4, record_events=True)
    path = run.trace.save(tmp_path / "run.perfetto.json", events=run.events)
    refused(path, "holds no tile state")
    with pytest.raises(TraceFileError, match="Perfetto timeline, not a simflash trace"):
        sf.BackwardTrace.load(path, format="json")


# ------------------------------------------------------------------------------------- damaged files


@pytest.fixture
def files(tmp_path):
    """A 'full' backward trace as JSON and NPZ: two heads, n_q = 10, n_kv = 7, d = 4, tiles 4 x 3, causal
    lower_right."""
    trace = backward_run(causal=True, causal_variant="lower_right").trace
    return trace.save(tmp_path / "t.json"), trace.save(tmp_path / "t.npz")


def set_entry(key, n, value):
    def edit(arrays):
        arrays[key] = arrays[key].copy()
        arrays[key][n] = value
    return edit


def step(doc, n=1):
    return doc["steps"][n]


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc.pop("format"), "not a simflash trace"),
    (lambda doc: doc.update(format="simflash.other"),
     r"not a simflash trace \(expected format 'simflash.backward_trace'"),
    (lambda doc: doc.update(schema_version=2), "schema version 2 is not supported; this simflash reads version 1 of a "
                                               "backward trace"),
    (lambda doc: doc.update(schema_version=True), "schema_version must be an integer"),
    (lambda doc: doc.update(schema_version="1"), "schema_version must be an integer"),
    (lambda doc: doc.update(level="everything"), "level must be one of"),
    (lambda doc: doc.update(level="none"), r"level 'none' holds no steps, found steps\[0\]"),
    (lambda doc: doc.update(config=[1, 2]), "config must be an object"),
    (lambda doc: doc.update(steps={}), "steps must be a list"),
    (lambda doc: step(doc).pop("dq_norm"), r"steps\[1\] must be an object with the fields \('head', 'j'"),
    (lambda doc: step(doc).update(extra=1), r"steps\[1\] must be an object with the fields"),
    (lambda doc: doc["steps"].__setitem__(0, [1]), r"steps\[0\] must be an object"),
    (lambda doc: step(doc).update(masked="yes"), r"steps\[1\]\.masked must be true or false"),
    (lambda doc: step(doc).update(i=-1), r"steps\[1\]\.i must be a non-negative integer"),
    (lambda doc: step(doc).update(col_start=1.0), r"steps\[1\]\.col_start must be a non-negative integer"),
    (lambda doc: step(doc).update(head=True), r"steps\[1\]\.head must be a non-negative integer"),
    (lambda doc: step(doc).update(D="high"), r"steps\[1\]\.D must be a list of numbers"),
    (lambda doc: step(doc).update(D=["1.5"] * 4), r"steps\[1\]\.D must hold numbers"),
    (lambda doc: step(doc).update(D=[None] * 4), r"steps\[1\]\.D must hold numbers"),
    (lambda doc: step(doc).update(p_rowsum=step(doc)["p_rowsum"][:-1]), r"steps\[1\]\.p_rowsum must have shape \(4,\)"),
    (lambda doc: step(doc).update(dv_norm=step(doc)["dv_norm"] + [0.0]), r"steps\[1\]\.dv_norm must have shape \(3,\)"),
    (lambda doc: step(doc).update(L=[], D=[], p_rowsum=[], dq_norm=[]), r"steps\[1\]: L and dk_norm must be "
                                                                        r"non-empty .* got 0 and 3 entries"),
    (lambda doc: step(doc).update(dK=[[], [], []]), r"steps\[1\]\.dK must be a \(B_c, d\) matrix with d > 0, got "
                                                   r"shape \(3, 0\)"),
    (lambda doc: step(doc).update(P=None), r"steps\[1\]: a 'full' trace needs P"),
    (lambda doc: step(doc).update(dV=[]), r"steps\[1\]\.dV must have shape \(3, 4\)"),
    (lambda doc: step(doc).update(dS="rows"), r"steps\[1\]\.dS must be a list of rows"),
    (lambda doc: step(doc)["P"][0].pop(), r"steps\[1\]\.P has rows of different lengths"),
    (lambda doc: step(doc).update(P=step(doc)["P"][:-1]), r"steps\[1\]\.P must have shape \(4, 3\)"),
    (lambda doc: step(doc).update(dK=[row[:-1] for row in step(doc)["dK"]], dV=[row[:-1] for row in step(doc)["dV"]]),
     r"steps\[1\]\.dK has 3 columns; the config's d = 4"),
    (lambda doc: step(doc)["D"].__setitem__(2, "nan"), r"steps\[1\]\.D\[2\] = nan must be finite"),
    (lambda doc: step(doc)["dS"][1].__setitem__(2, "-inf"), r"steps\[1\]\.dS\[1, 2\] = -inf must be finite"),
    (lambda doc: step(doc)["L"].__setitem__(0, "-inf"), r"steps\[1\]\.L\[0\] = -inf must be finite or \+inf"),
    (lambda doc: step(doc)["L"].__setitem__(0, "nan"), r"steps\[1\]\.L\[0\] = nan must be finite or \+inf"),
    (lambda doc: step(doc).update(head=2), r"steps\[1\]\.head = 2 is outside the config's heads = 2"),
    (lambda doc: step(doc).update(i=3), r"steps\[1\]\.i = 3 is outside the config's 3 query tiles"),
    (lambda doc: step(doc).update(j=3), r"steps\[1\]\.j = 3 is outside the config's 3 KV tiles \(n_kv = 7, "
                                        r"block_kv = 3\)"),
    (lambda doc: step(doc).update(row_start=5), r"steps\[1\]\.row_start = 5 disagrees with the config"),
    (lambda doc: step(doc).update(col_start=1), r"steps\[1\]: col_start = 1 and 3 columns \(dk_norm\) disagree with "
                                                r"the config: KV tile j = 0 is columns 0 to 2"),
    (lambda doc: doc["config"].update(block_q=5), r"steps\[0\]\.L holds 4 rows; the config's query tile 0 has 5"),
    (lambda doc: doc["config"].update(n_kv=8), r"steps\[\d+\]: col_start = 6 and 1 columns \(dk_norm\) disagree"),
    (lambda doc: doc["config"].update(d=5), r"steps\[0\]\.dK has 4 columns; the config's d = 5"),
    (lambda doc: doc["config"].pop("block_kv"), "config.block_kv is missing; a trace with steps needs it"),
    (lambda doc: doc["config"].update(forward_block_q="128"), "config.forward_block_q must be a positive int"),
    (lambda doc: doc["config"].update(n_q=0), "config.n_q must be a positive int, got 0"),
    (lambda doc: doc["config"].update(window=[3]), r"config.window must be a window, got \[3\]"),
])
def test_malformed_json_is_refused_with_the_reason(files, edit, message):
    path, _ = files
    edit_json(path, edit)
    refused(path, message)


def test_a_stats_trace_holds_no_matrices(tmp_path):
    path = backward_run(level="stats").trace.save(tmp_path / "t.json")
    edit_json(path, lambda doc: doc["steps"][0].update(dK=[[0.0] * 4] * 3))
    refused(path, r"steps\[0\]: a 'stats' trace has no dK")


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1" + "0" * 400, "1e39"])
def test_a_number_float32_cannot_hold_is_refused(files, number):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][1]["dV"][2][1] = 123.5
    path.write_text(json.dumps(doc).replace("123.5", number, 1))
    refused(path, r"steps\[1\]\.dV\[2\]\[1\] = .* outside float32's range")


@pytest.mark.parametrize("text, message", [
    ("NaN", "non-standard JSON constant NaN"),
    ("Infinity", "non-standard JSON constant Infinity"),
    ("9" * 5000, "not a valid trace"),
])
def test_non_standard_numbers_are_refused(files, text, message):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][0]["D"][0] = 123.5
    path.write_text(json.dumps(doc).replace("123.5", text, 1))
    refused(path, message)


def test_deep_truncated_and_binary_json_are_refused(files, tmp_path):
    path, _ = files
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    refused(path, "truncated or corrupted")
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "simflash.backward_trace", "schema_version": 1, "level": "full", "config": '
                    + "[" * 200_000 + "]" * 200_000 + ', "steps": []}')
    refused(deep, "nested too deeply")
    path.write_bytes(bytes(range(256)))
    refused(path, "not a text file|not a complete JSON")


@pytest.mark.parametrize("edit, message", [
    (lambda arrays: arrays.pop("dq_norm"), "missing array 'dq_norm'"),
    (lambda arrays: arrays.pop("cols"), "missing array 'cols'"),
    (lambda arrays: arrays.update(format=np.array("simflash.trace")), "a forward trace .* not a backward trace"),
    (lambda arrays: arrays.update(schema_version=np.array(2)), "schema version 2 is not supported"),
    (lambda arrays: arrays.update(schema_version=np.array(1.0)), "array 'schema_version' has dtype"),
    (lambda arrays: arrays.update(config_json=np.array("{not json")), "config_json is not valid JSON"),
    (lambda arrays: arrays.update(config_json=np.array("[1]")), "config_json must hold an object"),
    (lambda arrays: arrays.update(config_json=np.array("[" * 200_000 + "]" * 200_000)), "nested too deeply"),
    (lambda arrays: set_config(arrays, d=5), r"steps\[0\]\.dK has 4 columns; the config's d = 5"),
    (lambda arrays: set_config(arrays, heads="two"), "config.heads must be a positive int"),
    (lambda arrays: arrays.update(rows=arrays["rows"][:-1]), "per-step arrays must all hold 12 entries"),
    (set_entry("cols", 3, 0), "array 'cols' must hold positive integers, got 0 at step 3"),
    (set_entry("j", 2, -1), "array 'j' must hold non-negative integers, got -1 at step 2"),
    (set_entry("col_start", 4, 2), r"steps\[4\]: col_start = 2 and 3 columns"),
    (set_entry("head", 5, 2**40), r"steps\[5\]\.head = 1099511627776 is outside the config's heads = 2"),
    (lambda arrays: arrays.update(head=arrays["head"].astype(float)), "array 'head' has dtype float64"),
    (lambda arrays: arrays.update(L=arrays["L"][:-1]), r"must hold 36 rows \(the sum of 'rows'\); 'L' holds 35"),
    (lambda arrays: arrays.update(dk_norm=arrays["dk_norm"][:-1]), r"the sum of 'cols'\); 'dk_norm' holds"),
    (lambda arrays: arrays.update(P=arrays["P"][:-1]), r"the sum of rows x cols\); 'P' holds"),
    (lambda arrays: arrays.update(dV=arrays["dV"][:-1]), r"the sum of 'cols'\); 'dV' holds"),
    (lambda arrays: arrays.update(dK=arrays["dK"].ravel()), "array 'dK' has dtype float32 and 1 dimensions"),
    (lambda arrays: arrays.update(D=arrays["D"].astype(np.float64)), "must be float32; 'D' is float64"),
    (lambda arrays: arrays.pop("dS"), "missing array 'dS'"),
    (set_entry("dq_norm", 7, np.inf), r"steps\[1\]\.dq_norm\[3\] = inf must be finite"),
    (set_entry("L", 0, -np.inf), r"steps\[0\]\.L\[0\] = -inf must be finite or \+inf"),
])
def test_malformed_npz_is_refused_with_the_reason(files, edit, message):
    _, path = files
    edit_npz(path, edit)
    refused(path, message)


def test_npz_shifted_rows_are_refused_against_the_config(files):
    _, path = files

    def edit(arrays):  # the same total, shared out differently: the tiles no longer fit the config
        arrays["rows"] = arrays["rows"].copy()
        arrays["rows"][:2] += [1, -1]

    edit_npz(path, edit)
    refused(path, r"steps\[0\]\.L holds 5 rows; the config's query tile 0 has 4")


@pytest.mark.parametrize("keep", [0.0, 0.3, 0.9])
def test_truncated_npz_is_refused(files, keep):
    _, path = files
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    refused(path, "NPZ")


def test_a_single_npy_array_is_not_a_backward_trace(tmp_path):
    path = tmp_path / "one.npz"
    with path.open("wb") as file:
        np.save(file, np.arange(3))
    refused(path, "single array")


def test_backward_config_types_cover_every_field_a_backward_trace_records():
    assert set(BACKWARD_CONFIG_TYPES) == {field.name for field in attrs.fields(RunConfig)} | {
        "forward_block_q", "forward_block_kv"}
    assert set(backward_run(window=(3, 0), heads=2, kv_heads=1).trace.config) <= set(BACKWARD_CONFIG_TYPES)
    assert set(FULL_FIELDS) == {"P", "dS", "dK", "dV"}
    assert trace_schema.BACKWARD_FILE.format != trace_schema.FORWARD_FILE.format


# ---------------------------------------------------------------------------------------------- CLI


def test_export_backward_writes_json_and_npz(tmp_path):
    common = ["--backward", "--n", "12", "--n-kv", "9", "--d", "4", "--heads", "2", "--block-q", "4", "--block-kv",
              "3", "--causal", "--causal-variant", "lower_right", "--dtype", "bfloat16", "--seed", "7"]
    for name in ("b.json", "b.npz"):
        result = CliRunner().invoke(app, ["export", "--out", str(tmp_path / name), *common])
        assert result.exit_code == 0, result.output
        assert "backward" in result.output
    from_json, from_npz = sf.BackwardTrace.load(tmp_path / "b.json"), sf.BackwardTrace.load(tmp_path / "b.npz")
    assert_identical(from_json, from_npz)
    config = from_json.config
    assert (config["algorithm"], config["n_q"], config["n_kv"], config["heads"], config["dtype"]) == (
        "fa2_backward", 12, 9, 2, "bfloat16")
    assert (config["block_q"], config["block_kv"], config["causal_variant"], from_json.level) == (
        4, 3, "lower_right", "full")
    sched = sf.TileSchedule(12, 9, 4, 3, causal=True, causal_variant="lower_right")
    assert len(from_json) == 2 * sum(len(sched.q_tiles(j)) for j in range(sched.n_kv_tiles))
    # The same trace as the library's, on the command's inputs (q, k, v from the seed, dO from its own stream).
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 12, 4)), rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 4))
    do = np.random.default_rng([7, 1]).standard_normal(q.shape)
    run = sf.flash_attention_backward(q, k, v, do, 4, 3, causal=True, causal_variant="lower_right",
                                      dtype="bfloat16", trace="full")
    assert_identical(run.trace, from_json)


def test_export_backward_of_naive_and_at_stats(tmp_path):
    result = CliRunner().invoke(app, ["export", "--backward", "--algorithm", "naive", "--n", "8", "--out",
                                      str(tmp_path / "naive.json")])
    assert result.exit_code == 0, result.output
    naive = sf.BackwardTrace.load(tmp_path / "naive.json")
    assert naive.level == "none" and len(naive) == 0 and naive.config["algorithm"] == "naive_backward"
    result = CliRunner().invoke(app, ["export", "--backward", "--level", "stats", "--n", "8", "--block-q", "4",
                                      "--out", str(tmp_path / "stats.npz")])
    assert result.exit_code == 0, result.output
    stats = sf.BackwardTrace.load(tmp_path / "stats.npz")
    assert stats.level == "stats" and len(stats) == 2 and stats[0].P is None


@pytest.mark.parametrize("args, option, message", [
    (["--out", "b.perfetto.json"], "--out", "a backward trace has no Perfetto timeline"),
    (["--out", "b.json", "--format", "perfetto"], "--out", "a backward trace has no Perfetto timeline"),
    (["--out", "b.json", "--algorithm", "fa1"], "--algorithm", r"must be one of \('naive', 'fa2'\) with --backward"),
    (["--out", "b.json", "--level", "everything"], "--level", "must be one of"),
    (["--out", "b.csv"], "--out", "path must end in .json, .npz or .perfetto.json"),
    (["--out", "b.json", "--n", "0"], "--n", "must be a positive integer"),
    (["--out", "b.json", "--n", "4096", "--d", "128"], None, "a 'full' trace of the backward would hold"),
])
def test_export_backward_errors_name_the_option(tmp_path, monkeypatch, args, option, message):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["export", "--backward", *args])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in output and (option is None or f"Invalid value for {option}" in output)
    assert re.search(message, output), output
    assert list(tmp_path.iterdir()) == []
