"""`simflash trace`, `simflash verify` and `simflash scopes`: the lesson's worked numbers, computed."""

import json
import re

import attrs
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import simflash as sf
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.algorithms.flash2 import flash2_cta
from simflash import verify, walkthrough
from simflash.commands import guard_app, teach


@pytest.fixture
def invoke():
    app = typer.Typer()
    teach.register(app)
    guard_app(app)  # as simflash.cli does: ordinary mistakes become exit status 2, naming the option
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(app, list(args))
        # Error boxes wrap long messages: compare on the words alone.
        result.words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
        return result

    return run


def lesson_example():
    """The lesson's two tiles as a row softmax, in float64: the numbers the trace must reproduce."""
    scores = np.array([8.0, 6.0, 10.0, 7.0])
    values = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    return scores, values, weights, weights @ values


def test_trace_without_arguments_reproduces_the_two_tile_example(invoke):
    result = invoke("trace")
    assert result.exit_code == 0, result.output
    _, values, weights, output = lesson_example()
    # tile 1: m = 8, l = 1 + e^-2, a = V_1 weighted; tile 2: m = 10, alpha = e^-2
    l_1 = 1 + np.exp(-2.0)
    a_1 = values[0] + np.exp(-2.0) * values[1]
    l_2 = np.exp(-2.0) * l_1 + 1 + np.exp(-3.0)
    a_2 = np.exp(-2.0) * a_1 + values[2] + np.exp(-3.0) * values[3]
    lines = result.output.splitlines()
    tile1 = next(line for line in lines if line.startswith("1 "))
    tile2 = next(line for line in lines if line.startswith("2 "))
    for text, numbers in ((tile1, [8.0, 0.0, l_1, *a_1]), (tile2, [10.0, np.exp(-2.0), l_2, *a_2])):
        for x in numbers:
            assert f"{x:.4f}" in text
    assert "O as stored in HBM: [4.6025, 5.6025]" in result.output  # the lesson's O
    assert f"[{output[0]:.4f}, {output[1]:.4f}]" == "[4.6025, 5.6025]"
    assert "weights [" + ", ".join(f"{w:.4f}" for w in weights) + "]" in result.output
    assert "weights [0.1125, 0.0152, 0.8310, 0.0414]" in result.output
    assert "max moved" in tile2


def test_trace_fa1_shows_the_normalised_output_after_each_tile(invoke):
    result = invoke("trace", "--variant", "fa1")
    assert result.exit_code == 0, result.output
    _, values, _, _ = lesson_example()
    first = (values[0] + np.exp(-2.0) * values[1]) / (1 + np.exp(-2.0))  # O after tile 1 = a_1 / l_1
    assert f"[{first[0]:.4f}, {first[1]:.4f}]" in result.output
    assert "O_i" in result.output and "no final division" in result.output


def test_trace_takes_scores_and_values_from_flags_and_json(invoke, tmp_path):
    scores = [[1.0, 2.0, 3.0], [0.5]]
    values = [[1.0], [2.0], [4.0], [8.0]]
    flat = np.array([1.0, 2.0, 3.0, 0.5])
    expected = (np.exp(flat) / np.exp(flat).sum()) @ np.array(values)
    by_flags = invoke("trace", "--scores", "1,2,3;0.5", "--values", "1;2;4;8")
    path = tmp_path / "row.json"
    path.write_text(json.dumps({"scores": scores, "values": values}))
    by_json = invoke("trace", "--problem", str(path))
    for result in (by_flags, by_json):
        assert result.exit_code == 0, result.output
        assert f"O as stored in HBM: [{expected[0]:.4f}]" in result.output
        assert "2 KV tiles of 3 keys, d = 1" in result.output
    assert by_flags.output == by_json.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scores", "8,x", "--values", "1;2"], "--scores: must be scores per KV tile"),
        (["--scores", "8,6", "--values", "1,2;3"], "value rows must all have the same length d >= 1"),
        (["--scores", "8,6;1,2,3", "--values", "1;2;3;4;5"], "KV tiles must all hold 2 scores"),
        (["--scores", "8,6", "--values", "1;2;3"], "need one value row per score (2), got 3 rows"),
        (["--scores", "8,inf", "--values", "1;2"], "must hold finite numbers"),
        (["--scores", "8"], "--scores and --values go together"),
        (["--scores", "8", "--values", "1", "--n", "4"], "do not combine with given scores"),
        (["--n", "4", "--rows", "7"], "--rows: must lie in [0, 4), got [7]"),
        (["--n", "4", "--rows", "a"], "--rows: must be comma-separated query row indices"),
        (["--n", "0"], "--n: must be a positive integer, got 0"),
        (["--block-kv", "-2"], "--block-kv: must be a positive integer"),
        (["--n", "4", "--dtype", "float8"], "--dtype: must be one of"),
        (["--causal", "--causal-variant", "diagonal"], "--causal-variant: must be one of"),
        (["--causal-variant", "lower_right"], "--causal-variant: applies to causal attention: add --causal"),
        (["--variant", "fa9"], "--variant: must be one of ['fa1', 'fa2']"),
        (["--problem", "missing.json"], "cannot read missing.json"),
    ],
)
def test_trace_rejects_malformed_input_clearly(invoke, args, message):
    result = invoke("trace", *args)
    assert result.exit_code == 2
    assert message in result.words


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"scores": [[1]]}', 'must hold a JSON object {"scores"'),
        ('{"scores": [[1, "a"]], "values": [[1]]}', '"scores" in'),
        ('{"scores": [[1, 2]], "values": [[1], [true]]}', '"values" in'),
        ('{"scores": [[]], "values": []}', "every KV tile needs at least one score"),
        ('{"scores": [[1]], "values": [[]]}', "value rows must all have the same length d >= 1"),
        ('{"scores": [[1e39]], "values": [[1]]}', "k has values beyond the range of float32"),
    ],
)
def test_trace_rejects_malformed_json(invoke, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = invoke("trace", "--problem", str(path))
    assert result.exit_code == 2
    assert message in result.words


def test_trace_random_configuration_prints_one_table_per_row(invoke):
    result = invoke("trace", "--n", "12", "--n-kv", "9", "--d", "3", "--block-q", "4", "--block-kv", "2",
                    "--causal", "--causal-variant", "lower_right", "--rows", "0,11", "--seed", "5",
                    "--dtype", "float32", "--variant", "fa1")
    assert result.exit_code == 0, result.output
    sched = sf.TileSchedule(12, 9, 4, 2, causal=True, causal_variant="lower_right")
    for row in (0, 11):
        i = row // 4
        assert f"query row {row} (query tile {i}, row {row - 4 * i} of it): {len(sched.kv_tiles(i))} KV tiles" \
            in result.output
    assert "no visible key yet" in result.output  # row 0 sees no key under lower_right with n_q > n_kv
    errors = [float(x) for x in re.findall(r"max \|O - reference\| = (\S+)", result.output)]
    assert len(errors) == 2 and max(errors) < 1e-5


def test_trace_random_table_matches_the_simulator_trace(invoke):
    result = invoke("trace", "--n", "8", "--d", "2", "--block-q", "4", "--block-kv", "4", "--rows", "6")
    assert result.exit_code == 0, result.output
    rng = np.random.default_rng(0)  # the command's default seed, drawn in its order: q, k, v
    q, k, v = (rng.standard_normal((8, 2)) for _ in range(3))
    steps = sf.flash_attention(q, k, v, 4, 4, trace="full").trace.of_tile(1)
    rows = [line.split() for line in result.output.splitlines() if re.match(r"^\d+\s+(full|masked)", line)]
    assert [int(r[0]) for r in rows] == [s.j for s in steps]
    assert [r[2] for r in rows] == [f"{s.m[2]:.4f}" for s in steps]
    assert [r[4] for r in rows] == [f"{s.l[2]:.4f}" for s in steps]


def test_trace_json_gives_the_simulator_state_exactly(invoke):
    """--json: the same walk as data, float32 state as the trace holds it, -inf written as a string."""
    result = invoke("trace", "--n", "8", "--n-kv", "6", "--d", "2", "--block-q", "4", "--block-kv", "2",
                    "--rows", "0,6", "--causal", "--causal-variant", "lower_right", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((8, 2)), rng.standard_normal((6, 2)), rng.standard_normal((6, 2))
    run = sf.flash_attention(q, k, v, 4, 2, causal=True, causal_variant="lower_right", trace="full")
    for row in data["rows"]:
        i, local = row["row"] // 4, row["row"] % 4
        steps = run.trace.of_tile(i)
        assert [t["j"] for t in row["tiles"]] == [s.j for s in steps]
        assert [t["m"] for t in row["tiles"]] == [str(float(s.m[local])) if np.isinf(s.m[local]) else float(s.m[local])
                                                  for s in steps]
        assert [t["accumulator"] for t in row["tiles"]] == [s.a[local].tolist() for s in steps]
        assert row["stored_output"] == run.out[row["row"]].astype(float).tolist()
    assert {t["m"] for t in data["rows"][0]["tiles"]} == {"-inf"}  # row 0 sees no key (c <= 0 + 6 - 8)
    example = json.loads(invoke("trace", "--json").output)
    assert [t["m"] for t in example["tiles"]] == [8.0, 10.0] and example["max_abs_error"] < 1e-6


def test_every_variant_has_a_trace_view():
    assert set(walkthrough.TRACE_VIEWS) == set(FLASH_ALGORITHMS)


def test_verify_passes_and_covers_every_variant_and_exercise_4(invoke):
    result = invoke("verify")
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output
    for variant in FLASH_ALGORITHMS:
        assert f"PASS  {variant} causal" in result.output
        assert f"PASS  {variant} without the mask, skip bound kept" in result.output
    assert "loads j = 1..10 (skip bound j <= 2i = 10); j = 1..8 full, j = 9, 10 masked" in result.output
    assert "permits 0 entries in rows 513-576" in result.output


def test_verify_checks_fail_for_an_algorithm_that_ignores_the_mask(monkeypatch):
    def ignores_mask(gpu, sched, scale, trace, cta, write_logsumexp=False, kv_stages=2, p_registers="overwrite_s"):
        unmasked = verify.NoMaskSchedule(sched.n_q, sched.n_kv, sched.block_q, sched.block_kv,
                                        causal=sched.causal, causal_variant=sched.causal_variant)
        return flash2_cta(gpu, unmasked, scale, trace, cta, write_logsumexp, kv_stages, p_registers)

    monkeypatch.setitem(FLASH_ALGORITHMS, "broken", attrs.evolve(FLASH_ALGORITHMS["fa2"], cta=ignores_mask))
    failed = [c for c in verify.causal_checks() if not c.passed]
    assert failed and all(c.name.startswith("broken causal") for c in failed)


def test_verify_exits_non_zero_on_failure(invoke, monkeypatch):
    monkeypatch.setattr(teach, "exercise4_checks", lambda: [verify.Check("a check", False, "it failed")])
    result = invoke("verify")
    assert result.exit_code == 1
    assert "FAIL  a check" in result.output


def test_no_mask_schedule_keeps_the_skip_bound_and_permits_everything():
    masked = sf.TileSchedule(16, 16, 4, 2, causal=True)
    unmasked = verify.NoMaskSchedule(16, 16, 4, 2, causal=True)
    for i in range(4):
        assert unmasked.kv_tiles(i) == masked.kv_tiles(i)
        for j in masked.kv_tiles(i):
            assert unmasked.mask(i, j).all()
            assert unmasked.tile_kind(i, j) == masked.tile_kind(i, j)


def test_scopes_prints_the_lesson_scopes(invoke):
    result = invoke("scopes")
    assert result.exit_code == 0, result.output
    tiles = next(line for line in result.output.splitlines() if line.startswith("0-31"))
    assert tiles.split() == ["0-31", "32", "KiB", "16", "KiB", "16", "KiB", "16", "KiB", "16", "KiB", "96", "KiB"]
    assert "0-31         512 B  512 B  64 KiB  32 KiB  97 KiB" in result.output  # registers: m_i l_i a_i S_ij
    for name, size in (("Q_i tile", "32 KiB"), ("S_ij if it were stored at float16", "16 KiB")):
        assert next(line for line in result.output.splitlines() if line.startswith(name)).endswith(size)
    for scope, size in (("running state, one head", "32 KiB"), ("live state, one CTA", "1 KiB"),
                        ("+ accumulator a_i", "64 KiB"), ("exported logsumexp", "16 KiB")):
        line = next(line for line in result.output.splitlines() if scope in line)
        assert line.endswith(size)


def test_scopes_rejects_bad_sizes(invoke):
    result = invoke("scopes", "--d", "0")
    assert result.exit_code == 2
    assert "--d: must be a positive integer" in result.words
