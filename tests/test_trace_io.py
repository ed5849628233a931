"""Trace files: lossless JSON and NPZ round trips, clear errors for damaged files, Perfetto timelines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import simflash as sf
from simflash import perfetto, trace_diff, trace_files, trace_schema
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.cli import app
from simflash.trace_schema import TraceFileError


def random_run(seed=0, n_q=10, n_kv=7, d=4, heads=1, block_q=4, block_kv=3, level="full", variant="fa2",
               record_events=False, **options):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, n_q, d))
    k, v = rng.standard_normal((2, heads, n_kv, d))
    return sf.flash_attention(q, k, v, block_q, block_kv, dtype="float32", trace=level, variant=variant,
                              record_events=record_events, **options)


def assert_identical(expected: sf.Trace, actual: sf.Trace) -> None:
    """Exact equality: level, config, every index and every array (dtype, shape, bits)."""
    assert actual.level == expected.level
    assert dict(actual.config) == dict(expected.config)
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        assert (got.head, got.i, got.j, got.row_start, got.masked) == (want.head, want.i, want.j, want.row_start,
                                                                         want.masked)
        for name in ("m", "alpha", "l", "a"):
            x, y = getattr(want, name), getattr(got, name)
            if x is None:
                assert y is None
            else:
                assert y.dtype == x.dtype == np.float32 and y.shape == x.shape
                assert np.array_equal(y, x, equal_nan=True)


SUFFIXES = (".json", ".npz")


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("level", ["full", "stats"])
def test_round_trip_is_lossless(tmp_path, suffix, level):
    # lower_right with n_q > n_kv: rows 0-2 see no key, so m holds -inf; two heads; ragged tiles.
    run = random_run(seed=3, heads=2, level=level, causal=True, causal_variant="lower_right")
    assert any(np.isneginf(step.m).any() for step in run.trace)
    path = run.trace.save(tmp_path / f"trace{suffix}")
    back = sf.Trace.load(path)
    assert_identical(run.trace, back)
    assert (back[0].a is None) == (level == "stats")
    assert trace_diff.trace_differences(run.trace, back) == []


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("level", ["none", "stats", "full"])
def test_empty_trace_round_trips(tmp_path, suffix, level):
    trace = sf.Trace(level, (), {"algorithm": "fa2", "scale": 0.5, "gpu": None})
    back = sf.Trace.load(trace.save(tmp_path / f"empty{suffix}"))
    assert_identical(trace, back)
    assert len(back) == 0 and back.level == level


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_naive_run_saves_its_config_and_no_steps(tmp_path, suffix):
    rng = np.random.default_rng(5)
    run = sf.naive_attention(*rng.standard_normal((3, 8, 4)))
    back = sf.Trace.load(run.trace.save(tmp_path / f"naive{suffix}"))
    assert back.config["algorithm"] == "naive" and back.config == run.trace.config and len(back) == 0


@given(
    n_q=st.integers(1, 9), n_kv=st.integers(1, 9), d=st.integers(1, 5), block_q=st.integers(1, 5),
    block_kv=st.integers(1, 5), causal=st.booleans(), variant_index=st.integers(0, len(FLASH_ALGORITHMS) - 1),
    lower_right=st.booleans(), seed=st.integers(0, 2**16),
)
def test_round_trip_property(tmp_path_factory, n_q, n_kv, d, block_q, block_kv, causal, variant_index,
                             lower_right, seed):
    run = random_run(seed, n_q, n_kv, d, 1, block_q, block_kv, variant=list(FLASH_ALGORITHMS)[variant_index],
                     causal=causal, causal_variant="lower_right" if lower_right else "upper_left")
    directory = tmp_path_factory.mktemp("round")
    for suffix in SUFFIXES:
        assert_identical(run.trace, sf.Trace.load(run.trace.save(directory / f"t{suffix}")))


def test_json_is_readable_and_strict(tmp_path):
    run = random_run(causal=True, causal_variant="lower_right")
    text = run.trace.save(tmp_path / "t.json").read_text()
    doc = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert doc["format"] == trace_schema.FORMAT_NAME and doc["schema_version"] == trace_schema.SCHEMA_VERSION
    assert doc["config"]["algorithm"] == "fa2" and doc["config"]["n_q"] == 10
    assert '"-inf"' in text  # non-finite values spelled as strings
    # One line per step, after an indented header.
    assert sum(1 for line in text.splitlines() if line.startswith('    {"head"')) == len(run.trace)


def test_format_comes_from_the_suffix_or_the_argument(tmp_path):
    assert trace_files.format_for("a.json") == "json"
    assert trace_files.format_for("a.NPZ") == "npz"
    assert trace_files.format_for("run.perfetto.json") == "perfetto"
    assert trace_files.format_for("anything", "npz") == "npz"
    with pytest.raises(ValueError, match="path must end in"):
        trace_files.format_for("a.txt")
    with pytest.raises(ValueError, match="format must be one of"):
        trace_files.format_for("a.json", "yaml")
    run = random_run()
    path = run.trace.save(tmp_path / "no_suffix", format="json")
    assert_identical(run.trace, sf.Trace.load(path, format="json"))


# ---------------------------------------------------------------------------------- damaged files


@pytest.fixture
def saved(tmp_path):
    run = random_run(causal=True)
    return run.trace.save(tmp_path / "t.json"), run.trace.save(tmp_path / "t.npz")


@pytest.mark.parametrize("keep", [0.0, 0.3, 0.9])
def test_truncated_json_is_refused(saved, keep):
    path, _ = saved
    text = path.read_text()
    path.write_text(text[: int(len(text) * keep)])
    with pytest.raises(TraceFileError, match="truncated or corrupted"):
        sf.Trace.load(path)


@pytest.mark.parametrize("keep", [0.0, 0.2, 0.6, 0.95])
def test_truncated_npz_is_refused(saved, keep):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(TraceFileError, match="NPZ"):
        sf.Trace.load(path)


def test_corrupted_npz_bytes_are_refused(saved):
    _, path = saved
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # zero a stretch inside the stored arrays
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFileError):
        sf.Trace.load(path)


def test_binary_garbage_named_json_is_refused(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(TraceFileError, match=r"not a text file|not a complete JSON"):
        sf.Trace.load(path)


def test_wrong_version_is_refused(saved):
    json_path, npz_path = saved
    doc = json.loads(json_path.read_text())
    doc["schema_version"] = trace_schema.SCHEMA_VERSION + 1
    json_path.write_text(json.dumps(doc))
    with pytest.raises(TraceFileError, match="schema version 2 is not supported"):
        sf.Trace.load(json_path)
    with np.load(npz_path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["schema_version"] = np.array(trace_schema.SCHEMA_VERSION + 1)
    np.savez(npz_path, **arrays)
    with pytest.raises(TraceFileError, match="schema version 2 is not supported"):
        sf.Trace.load(npz_path)


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc.pop("format"), "not a simflash trace"),
    (lambda doc: doc.update(level="everything"), "level must be one of"),
    (lambda doc: doc.update(config=[1, 2]), "config must be an object"),
    (lambda doc: doc.update(steps={}), "steps must be a list"),
    (lambda doc: doc["steps"][0].pop("alpha"), r"steps\[0\] must be an object with the fields"),
    (lambda doc: doc["steps"][1].update(m="high"), r"steps\[1\]\.m must be a list"),
    (lambda doc: doc["steps"][1].update(l=["1.5"]), r"steps\[1\]\.l must hold numbers"),
    (lambda doc: doc["steps"][1].update(l=doc["steps"][1]["l"][:-1]), "equal-length"),
    (lambda doc: doc["steps"][0].update(i=-1), r"steps\[0\]\.i must be a non-negative integer"),
    (lambda doc: doc["steps"][0].update(masked="yes"), "masked must be true or false"),
    (lambda doc: doc["steps"][0].update(a=None), "needs accumulator a"),
    (lambda doc: doc["steps"][0].update(a=doc["steps"][0]["a"][:-1]), "a must have shape"),
    (lambda doc: doc["steps"][0]["a"][0].pop(), "rows of different lengths"),
    (lambda doc: doc.update(level="none"), "level 'none' holds no steps"),
])
def test_malformed_json_is_refused_with_the_reason(saved, edit, message):
    path, _ = saved
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFileError, match=message):
        sf.Trace.load(path)


@pytest.mark.parametrize("edit, message", [
    (lambda arrays: arrays.pop("m"), "missing array 'm'"),
    (lambda arrays: arrays.update(alpha=arrays["alpha"][:-1]), "must hold"),
    (lambda arrays: arrays.update(rows=arrays["rows"][:-1]), "per-step arrays"),
    (lambda arrays: arrays.update(l=arrays["l"].astype(np.float64)), "float32"),
    (lambda arrays: arrays.update(head=arrays["head"].astype(float)), "array 'head' has dtype"),
    (lambda arrays: arrays.update(config_json=np.array("{not json")), "config_json is not valid JSON"),
    (lambda arrays: arrays.update(format=np.array("something else")), "not a simflash trace"),
])
def test_malformed_npz_is_refused_with_the_reason(saved, edit, message):
    _, path = saved
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    edit(arrays)
    np.savez(path, **arrays)
    with pytest.raises(TraceFileError, match=message):
        sf.Trace.load(path)


def test_a_single_npy_array_is_not_a_trace(tmp_path):
    path = tmp_path / "one.npz"
    with path.open("wb") as file:
        np.save(file, np.arange(3))
    with pytest.raises(TraceFileError, match="single array"):
        sf.Trace.load(path)


def test_errors_are_value_errors_naming_the_file(saved):
    path, _ = saved
    path.write_text("{")
    with pytest.raises(ValueError, match=str(path.name)):
        sf.Trace.load(path)


# ---------------------------------------------------------------------------------------- Perfetto


def check_chrome_trace(document: dict) -> None:
    """The Chrome Trace Event rules the Perfetto importer relies on."""
    assert set(document) >= {"traceEvents", "displayTimeUnit"}
    stacks: dict[tuple[int, int], list[int]] = {}
    for record in document["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(record), record
        assert isinstance(record["pid"], int) and isinstance(record["tid"], int)
        if record["ph"] == "M":
            assert record["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            continue
        assert isinstance(record["ts"], int) and record["ts"] >= 0
        if record["ph"] == "C":
            assert record["args"] and all(isinstance(x, int) for x in record["args"].values()), record
        elif record["ph"] == "i":
            assert record["s"] == "t"
        else:
            assert record["ph"] == "X" and isinstance(record["dur"], int) and record["dur"] > 0
            # Slices on one track nest: each starts after its parent starts and ends before it ends.
            stack = stacks.setdefault((record["pid"], record["tid"]), [])
            while stack and stack[-1] <= record["ts"]:
                stack.pop()
            end = record["ts"] + record["dur"]
            assert not stack or end <= stack[-1], f"slice {record['name']} overlaps its parent"
            stack.append(end)


def timeline_of(run) -> dict:
    return perfetto.perfetto_document(run.events, run.trace.config)


def counter_values(document: dict, name: str) -> list[dict]:
    return [r["args"] for r in document["traceEvents"] if r["ph"] == "C" and r["name"] == name]


@pytest.mark.parametrize("variant", list(FLASH_ALGORITHMS))
@pytest.mark.parametrize("causal", [False, True])
def test_perfetto_timeline_of_a_tiled_run(tmp_path, variant, causal):
    run = random_run(seed=7, n_q=12, n_kv=12, heads=2, variant=variant, causal=causal, record_events=True)
    path = run.trace.save(tmp_path / "run.perfetto.json", events=run.events)
    document = json.loads(path.read_text())
    assert document == timeline_of(run)  # the written file is the document, as valid JSON
    check_chrome_trace(document)
    records = document["traceEvents"]

    # One thread track per CTA, named after it; one process per kernel.
    ctas = {event.cta for event in run.events}
    threads = [r["args"]["name"] for r in records if r["name"] == "thread_name"]
    names = ("head", "query tile")
    assert sorted(threads) == sorted("CTA " + ", ".join(f"{k} {x}" for k, x in zip(names, cta)) for cta in ctas)
    assert not any(c in name for name in threads for c in "()")  # no Python tuples
    processes = [r["args"]["name"] for r in records if r["name"] == "process_name"]
    assert sorted(processes[1:]) == sorted(f"kernel {k}" for k in {e.kernel for e in run.events})

    # A slice for every load, matmul and store; a mark for every hold and free.
    by_category = {cat: sum(1 for r in records if r.get("cat") == cat) for cat in ("load", "compute", "store", "sram")}
    ops = [event.op for event in run.events]
    assert by_category == {"load": ops.count("read"), "compute": ops.count("matmul"), "store": ops.count("write"),
                           "sram": ops.count("hold") + ops.count("release")}
    assert sum(1 for r in records if r.get("cat") == "cta") == len(ctas)

    # Counters: cumulative HBM bytes end at the ledger's totals; SRAM occupancy peaks at the run's
    # peak and returns to zero.
    hbm = counter_values(document, "HBM bytes, cumulative")
    totals = [t["total"] for t in counter_values(document, perfetto.HBM_TOTAL_COUNTER)]
    assert hbm[-1] == {t: f.total_bytes for t, f in run.traffic.by_tensor.items()}
    # chrome://tracing stacks a counter's series: the per-tensor stack tops out at the total, not twice it.
    assert [sum(h.values()) for h in hbm] == totals
    assert totals[-1] == run.traffic.total_bytes and totals == sorted(totals)
    sram = counter_values(document, "SRAM live bytes")
    assert max(s.get("shared memory", 0) for s in sram) == run.on_chip.shared.peak_bytes
    assert max(s.get("registers", 0) for s in sram) == run.on_chip.registers.peak_bytes
    assert set(sram[-1].values()) == {0}


def test_loads_name_the_buffer_they_fill():
    run = random_run(n_q=4, n_kv=4, block_q=4, block_kv=4, record_events=True)
    names = [r["name"] for r in timeline_of(run)["traceEvents"] if r.get("cat") == "load"]
    assert names == ["load Q -> Q_i", "load K -> K_j[0]", "load V -> V_j[0]"]  # stage 0 of the K/V double buffer


def test_perfetto_timeline_of_naive_has_a_process_per_kernel(tmp_path):
    rng = np.random.default_rng(2)
    run = sf.naive_attention(*rng.standard_normal((3, 2, 8, 4)), causal=True, record_events=True)
    path = run.trace.save(tmp_path / "naive.json", format="perfetto", events=run.events)
    document = json.loads(path.read_text())
    check_chrome_trace(document)
    processes = [r["args"]["name"] for r in document["traceEvents"] if r["name"] == "process_name"]
    assert processes[1:] == ["kernel gemm_qk", "kernel softmax", "kernel gemm_pv"]
    assert sum(counter_values(document, "HBM bytes, cumulative")[-1].values()) == run.traffic.total_bytes
    assert counter_values(document, perfetto.HBM_TOTAL_COUNTER)[-1] == {"total": run.traffic.total_bytes}
    assert json.loads(document["otherData"]["config"]) == run.trace.config
    threads = [r["args"]["name"] for r in document["traceEvents"] if r["name"] == "thread_name"]
    assert sorted(set(threads)) == ["CTA head 0", "CTA head 1"]


def test_perfetto_time_unit_matches_the_timestamps():
    """ts is in microseconds (the format's unit); displayTimeUnit is one the format knows ("ms", the
    default, or "ns"), and not "ns": one 10 us tick shown as 10,000 ns misreads the logical clock."""
    document = timeline_of(random_run(record_events=True))
    assert document["displayTimeUnit"] == "ms"
    assert f"x {perfetto.TICK_US} us" in document["otherData"]["clock"]
    seqs = [r["args"]["seq"] for r in document["traceEvents"] if r.get("cat") in ("load", "compute", "store")]
    starts = [r["ts"] for r in document["traceEvents"] if r.get("cat") in ("load", "compute", "store")]
    assert starts == [seq * perfetto.TICK_US + perfetto.SLICE_START_US for seq in seqs]


def test_export_of_a_large_timeline_ignores_the_tile_trace_budget(tmp_path):
    """A full tile trace of this run would be about 260 MiB (over the 64 MiB budget); the timeline uses none."""
    out = tmp_path / "big.perfetto.json"
    result = CliRunner().invoke(app, ["export", "--out", str(out), "--n", "1024", "--d", "256",
                                      "--block-q", "128", "--block-kv", "4"])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert counter_values(document, perfetto.HBM_TOTAL_COUNTER)[-1]["total"] > 0


def test_perfetto_needs_events_and_cannot_be_loaded_as_a_trace(tmp_path):
    run = random_run(record_events=True)
    with pytest.raises(ValueError, match="record_events=True"):
        run.trace.save(tmp_path / "x.perfetto.json")
    path = run.trace.save(tmp_path / "x.perfetto.json", events=run.events)
    with pytest.raises(ValueError, match="holds no tile state"):
        sf.Trace.load(path)
    with pytest.raises(TraceFileError, match="Perfetto timeline, not a simflash trace"):
        sf.Trace.load(path, format="json")


def test_trace_differences_reports_what_changed():
    run = random_run(causal=True)
    other = random_run(causal=True)
    assert trace_diff.trace_differences(run.trace, other.trace) == []
    nudged = other.trace.steps[2].l
    nudged[0] = np.nextafter(nudged[0], np.float32(np.inf))  # one float32 ulp
    assert trace_diff.trace_differences(run.trace, other.trace) == [
        f"step 2 (head 0, i {run.trace[2].i}, j {run.trace[2].j}): l differs"]
    assert trace_diff.trace_differences(run.trace, other.trace, rtol=1e-6) == []
    shorter = sf.Trace(run.trace.level, run.trace.steps[:-1], run.trace.config)
    assert trace_diff.trace_differences(run.trace, shorter) == [f"{len(run.trace) - 1} steps != {len(run.trace)}"]


@pytest.mark.parametrize("algorithm", ["naive", *FLASH_ALGORITHMS])
def test_export_command_writes_every_format(tmp_path, algorithm):
    common = ["--algorithm", algorithm, "--n", "12", "--d", "4", "--block-q", "4", "--block-kv", "3", "--causal"]
    for name in ("t.json", "t.npz", "t.perfetto.json"):
        result = CliRunner().invoke(app, ["export", "--out", str(tmp_path / name), *common])
        assert result.exit_code == 0, result.output
    json_trace, npz_trace = sf.Trace.load(tmp_path / "t.json"), sf.Trace.load(tmp_path / "t.npz")
    assert_identical(json_trace, npz_trace)
    assert json_trace.config["algorithm"] == algorithm and json_trace.config["causal"] is True
    schedule = sf.TileSchedule(12, 12, 4, 3, causal=True)
    visited = sum(len(schedule.kv_tiles(i)) for i in range(schedule.n_q_tiles))
    assert len(json_trace) == (0 if algorithm == "naive" else visited)
    timeline = json.loads((tmp_path / "t.perfetto.json").read_text())
    check_chrome_trace(timeline)
    assert json.loads(timeline["otherData"]["config"]) == json_trace.config
    bad = CliRunner().invoke(app, ["export", "--out", str(tmp_path / "t.csv"), *common])
    assert bad.exit_code == 2 and "path must end in .json, .npz or .perfetto.json" in bad.output
