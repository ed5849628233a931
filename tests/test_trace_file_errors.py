"""Bad trace files raise TraceFileError naming the field; the trace-file modules form no import cycle;
`simflash golden` finds the repository's traces/ from anywhere."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import attrs
import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash import golden, trace_io, trace_schema
from simflash.api import RunConfig
from simflash.cli import app
from simflash.trace_files import TraceFileError

REPO = Path(__file__).resolve().parents[1]


def saved_run(tmp_path, **options):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 2, 10, 4))  # two heads, n = 10, d = 4
    run = sf.flash_attention(q, k, v, 4, 3, dtype="float32", trace="full", **options)
    return run.trace.save(tmp_path / "t.json"), run.trace.save(tmp_path / "t.npz")


@pytest.fixture
def files(tmp_path):
    return saved_run(tmp_path)


def edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def edit_npz(path: Path, edit) -> None:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    edit(arrays)
    np.savez(path, **arrays)


def set_config(arrays, **changes):
    arrays["config_json"] = np.array(json.dumps({**json.loads(arrays["config_json"].item()), **changes}))


# ------------------------------------------------------------------------------ numbers out of range


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1" + "0" * 400, "-1" + "0" * 400, "1e39"])
def test_a_number_float32_cannot_hold_is_refused(files, number):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][1]["l"][2] = 123.5
    text = json.dumps(doc).replace("123.5", number, 1)
    path.write_text(text)
    with pytest.raises(TraceFileError, match=r"steps\[1\]\.l\[2\] = .* outside float32's range"):
        sf.Trace.load(path)


def test_a_huge_number_in_the_accumulator_names_its_row(files):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][0]["a"][1][3] = 123.5
    path.write_text(json.dumps(doc).replace("123.5", "1e400", 1))
    with pytest.raises(TraceFileError, match=r"steps\[0\]\.a\[1\]\[3\] = inf is outside float32's range"):
        sf.Trace.load(path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_constants_are_refused(files, constant):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][0]["m"][0] = 123.5
    path.write_text(json.dumps(doc).replace("123.5", constant, 1))
    with pytest.raises(TraceFileError, match=f"non-standard JSON constant {constant}"):
        sf.Trace.load(path)


def test_an_integer_past_pythons_digit_limit_is_refused(files):
    path, _ = files
    doc = json.loads(path.read_text())
    doc["steps"][0]["m"][0] = 123.5
    path.write_text(json.dumps(doc).replace("123.5", "9" * 5000, 1))
    with pytest.raises(TraceFileError, match="not a valid trace"):
        sf.Trace.load(path)


# -------------------------------------------------------------------------------------- nesting


def test_deeply_nested_json_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    depth = 200_000
    path.write_text('{"format": "simflash.trace", "schema_version": 1, "level": "full", "config": '
                    + "[" * depth + "]" * depth + ', "steps": []}')
    with pytest.raises(TraceFileError, match="nested too deeply"):
        sf.Trace.load(path)


def test_deeply_nested_npz_config_is_refused(files):
    _, path = files
    edit_npz(path, lambda arrays: arrays.update(config_json=np.array('{"x": ' + "[" * 200_000 + "]" * 200_000 + "}")))
    with pytest.raises(TraceFileError, match="config_json is nested too deeply"):
        sf.Trace.load(path)


# ------------------------------------------------------------------------------- schema version


@pytest.mark.parametrize("version", [True, 1.0, "1", None])
def test_schema_version_must_be_an_integer(files, version):
    path, _ = files
    edit_json(path, lambda doc: doc.update(schema_version=version))
    with pytest.raises(TraceFileError, match=rf"schema_version must be an integer .*got {version!r}"):
        sf.Trace.load(path)


@pytest.mark.parametrize("version", [np.array(True), np.array(1.0)])
def test_npz_schema_version_must_be_an_integer(files, version):
    _, path = files
    edit_npz(path, lambda arrays: arrays.update(schema_version=version))
    with pytest.raises(TraceFileError, match="array 'schema_version' has dtype"):
        sf.Trace.load(path)


# ----------------------------------------------------------------------------------- NPZ indices


@pytest.mark.parametrize("field", ["head", "i", "j", "row_start"])
def test_npz_negative_index_is_refused(files, field):
    _, path = files

    def edit(arrays):
        arrays[field] = arrays[field].copy()
        arrays[field][2] = -1

    edit_npz(path, edit)
    with pytest.raises(TraceFileError, match=f"array '{field}' must hold non-negative integers, got -1 at step 2"):
        sf.Trace.load(path)


@pytest.mark.parametrize("field, value, message", [
    ("head", 2, r"steps\[3\]\.head = 2 is outside the config's heads = 2"),
    ("head", 2**40, r"steps\[3\]\.head = 1099511627776 is outside the config's heads = 2"),
    ("i", 3, r"steps\[3\]\.i = 3 is outside the config's 3 query tiles \(n_q = 10, block_q = 4\)"),
    ("j", 4, r"steps\[3\]\.j = 4 is outside the config's 4 KV tiles \(n_kv = 10, block_kv = 3\)"),
])
def test_npz_index_outside_the_config_is_refused(files, field, value, message):
    _, path = files

    def edit(arrays):
        arrays[field] = arrays[field].copy()
        arrays[field][3] = value

    edit_npz(path, edit)
    with pytest.raises(TraceFileError, match=message):
        sf.Trace.load(path)


def test_npz_unsigned_index_beyond_int64_is_refused(files):
    _, path = files

    def edit(arrays):
        arrays["head"] = arrays["head"].astype(np.uint64)
        arrays["head"][0] = 2**64 - 1

    edit_npz(path, edit)
    with pytest.raises(TraceFileError, match=r"steps\[0\]\.head = 18446744073709551615 is outside"):
        sf.Trace.load(path)


def test_json_index_outside_the_config_is_refused(files):
    path, _ = files
    edit_json(path, lambda doc: doc["steps"][0].update(head=7))
    with pytest.raises(TraceFileError, match=r"steps\[0\]\.head = 7 is outside the config's heads = 2"):
        sf.Trace.load(path)


# ------------------------------------------------------------------- shapes against the config


@pytest.mark.parametrize("suffix", ["json", "npz"])
@pytest.mark.parametrize("changes, message", [
    ({"d": 5}, r"steps\[0\]\.a has 4 columns; the config's d = 5"),
    ({"block_q": 5}, r"steps\[0\]\.m holds 4 rows; the config's query tile 0 has 5 \(rows 0 to 4 of n_q = 10"),
    ({"block_q": 3}, r"steps\[0\]\.m holds 4 rows; the config's query tile 0 has 3"),
    ({"n_q": 9}, r"steps\[\d+\]\.m holds 2 rows; the config's query tile 2 has 1 \(rows 8 to 8 of n_q = 9"),
])
def test_state_shapes_that_disagree_with_the_config_are_refused(files, suffix, changes, message):
    json_path, npz_path = files
    if suffix == "json":
        edit_json(json_path, lambda doc: doc["config"].update(changes))
    else:
        edit_npz(npz_path, lambda arrays: set_config(arrays, **changes))
    with pytest.raises(TraceFileError, match=message):
        sf.Trace.load(json_path if suffix == "json" else npz_path)


def test_json_row_start_off_its_tile_is_refused(files):
    path, _ = files
    edit_json(path, lambda doc: doc["steps"][0].update(row_start=1))
    with pytest.raises(TraceFileError, match=r"steps\[0\]\.row_start = 1 disagrees with the config"):
        sf.Trace.load(path)


def test_npz_accumulator_width_against_d(files):
    _, path = files
    edit_npz(path, lambda arrays: arrays.update(a=np.concatenate([arrays["a"], arrays["a"][:, :1]], axis=1)))
    with pytest.raises(TraceFileError, match=r"steps\[0\]\.a has 5 columns; the config's d = 4"):
        sf.Trace.load(path)


@pytest.mark.parametrize("suffix", ["json", "npz"])
def test_a_trace_with_steps_needs_its_geometry(files, suffix):
    json_path, npz_path = files
    if suffix == "json":
        edit_json(json_path, lambda doc: doc["config"].pop("d"))
    else:
        def edit(arrays):
            config = json.loads(arrays["config_json"].item())
            del config["d"]
            arrays["config_json"] = np.array(json.dumps(config))
        edit_npz(npz_path, edit)
    with pytest.raises(TraceFileError, match=re.escape("config.d is missing; a trace with steps needs it")):
        sf.Trace.load(json_path if suffix == "json" else npz_path)


# ------------------------------------------------------------------------------ config field types


@pytest.mark.parametrize("suffix", ["json", "npz"])
@pytest.mark.parametrize("field, value, message", [
    ("n_q", "banana", "config.n_q must be a positive int, got 'banana'"),
    ("n_q", 0, "config.n_q must be a positive int, got 0"),
    ("d", 4.0, "config.d must be a positive int, got 4.0"),
    ("heads", True, "config.heads must be a positive int, got True"),
    ("block_kv", [3], r"config.block_kv must be a positive int or null, got \[3\]"),
    ("causal", "no", "config.causal must be a bool, got 'no'"),
    ("scale", "0.5", "config.scale must be a finite number, got '0.5'"),
    ("dtype", 16, "config.dtype must be a str, got 16"),
])
def test_config_fields_of_the_wrong_type_are_refused(files, suffix, field, value, message):
    json_path, npz_path = files
    if suffix == "json":
        edit_json(json_path, lambda doc: doc["config"].update({field: value}))
    else:
        edit_npz(npz_path, lambda arrays: set_config(arrays, **{field: value}))
    with pytest.raises(TraceFileError, match=message):
        sf.Trace.load(json_path if suffix == "json" else npz_path)


def test_config_scale_that_overflows_is_refused(files):
    path, _ = files
    path.write_text(path.read_text().replace('"scale": 0.5', '"scale": 1e400', 1))
    with pytest.raises(TraceFileError, match=re.escape("config.scale must be a finite number, got inf")):
        sf.Trace.load(path)


def test_an_empty_trace_checks_its_config_too(tmp_path):
    path = sf.Trace("none", (), {"algorithm": "naive", "n_q": 4}).save(tmp_path / "naive.json")
    edit_json(path, lambda doc: doc["config"].update(n_q="banana"))
    with pytest.raises(TraceFileError, match=re.escape("config.n_q must be a positive int, got 'banana'")):
        sf.Trace.load(path)


def test_config_types_cover_every_run_config_field():
    assert {field.name for field in attrs.fields(RunConfig)} == set(trace_schema.CONFIG_TYPES)


# ------------------------------------------------------------------------------------ Perfetto


def test_loading_a_perfetto_file_raises_trace_file_error(tmp_path):
    rng = np.random.default_rng(0)
    run = sf.flash_attention(*rng.standard_normal((3, 8, 4)), 4, 4, record_events=True)
    path = run.trace.save(tmp_path / "run.perfetto.json", events=run.events)
    with pytest.raises(TraceFileError, match=r"a Perfetto file is a timeline .* holds no tile state"):
        sf.Trace.load(path)
    with pytest.raises(TraceFileError, match="Perfetto timeline, not a simflash trace"):
        sf.Trace.load(path, format="json")


# ------------------------------------------------------------------------------- module layout


def runtime_imports(module: Path) -> set[str]:
    """The simflash modules a file imports when it runs (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(module.read_text())
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
               for stmt in block.body for node in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return {name for name in names if name.startswith("simflash")}


def module_graph() -> dict[str, set[str]]:
    files = {}
    for path in (REPO / "simflash").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        files[name] = path
    graph = {}
    for name, path in files.items():
        imported = runtime_imports(path)
        # `from simflash import trace` names the submodule; the package __init__ itself is not an edge.
        graph[name] = {n for n in imported if n in files and not any(m.startswith(n + ".") for m in imported)}
    return graph


def test_simflash_modules_import_no_cycle():
    graph = module_graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name):], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_trace_file_modules_stand_below_trace_and_api():
    graph = module_graph()
    for name in ("trace_files", "trace_schema", "trace_json", "trace_npz", "trace_diff", "perfetto", "trace_step",
                 "trace_backward_files", "trace_backward_step"):
        reached, stack = set(), [f"simflash.{name}"]
        while stack:
            for other in graph[stack.pop()] - reached:
                reached.add(other)
                stack.append(other)
        assert not reached & {"simflash.trace", "simflash.trace_backward", "simflash.api", "simflash.golden"}, name


def test_trace_io_still_offers_its_names():
    from simflash import perfetto, trace_diff, trace_files

    assert trace_io.TraceFileError is trace_files.TraceFileError is trace_schema.TraceFileError
    assert trace_io.GOLDEN_CASES is golden.GOLDEN_CASES and trace_io.check_golden is golden.check_golden
    assert trace_io.perfetto_document is perfetto.perfetto_document
    assert trace_io.trace_differences is trace_diff.trace_differences
    assert set(trace_io.__all__) <= set(dir(trace_io))


# ---------------------------------------------------------------------------- golden directory


def test_golden_directory_is_the_repositorys_from_anywhere_inside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO / "docs")  # (installed from a wheel, only the working directory can tell)
    assert golden.golden_directory() == REPO / "traces"
    assert golden.golden_directory(tmp_path / "mine") == tmp_path / "mine"
    result = CliRunner().invoke(app, ["golden", "--check"])
    assert result.exit_code == 0, result.output
    assert "match the code" in result.output and str(REPO / "traces") in result.output


def test_golden_directory_found_above_the_working_directory(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    monkeypatch.setattr(golden, "_is_checkout", lambda root: root == checkout)
    assert golden.golden_directory(start=checkout / "docs" / "deep") == checkout / "traces"


def test_golden_without_a_checkout_asks_for_a_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(golden, "_is_checkout", lambda root: False)
    with pytest.raises(golden.GoldenDirectoryNotFound, match="name the directory with --dir"):
        golden.golden_directory()
    for args in (["golden"], ["golden", "--check"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "--dir" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # nothing written
