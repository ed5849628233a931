"""Ordinary mistakes on the command line: one line naming the option the user typed, exit status 2, never a
traceback (simflash.commands.guard_app wraps every command); and the API refuses look-alike types."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app

REPO = Path(__file__).resolve().parents[1]

runner = CliRunner()


def fails(args: list[str], *expected: str) -> str:
    """Run `simflash args`; it must exit 2 with every expected phrase in its (unwrapped) message."""
    result = runner.invoke(app, args)
    text = " ".join(result.output.replace("│", " ").replace("╭", " ").replace("╰", " ").split())
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    for phrase in expected:
        assert phrase in text, (phrase, text)
    return text


# ------------------------------------------------------------------------------------ paths


def test_plot_trace_missing_and_directory(tmp_path):
    fails(["plot", "stats", "--trace", str(tmp_path / "none.json"), "--out", str(tmp_path / "s.png")],
          "--trace", "No such file or directory")
    fails(["plot", "stats", "--trace", str(tmp_path), "--out", str(tmp_path / "s.png")], "--trace")


def test_export_out_missing_folder_and_directory(tmp_path):
    fails(["export", "--out", str(tmp_path / "no" / "x.json")], "--out", "No such file or directory")
    fails(["export", "--out", str(tmp_path), "--format", "json"], "--out", "Is a directory")


def test_plot_output_in_missing_folder(tmp_path):
    fails(["plot", "tilemap", "--out", str(tmp_path / "no" / "map.png")], "--out", "No such file or directory")
    fails(["sweep", "--n", "256", "--plot", str(tmp_path / "no" / "sweep.png")], "--plot", "No such file")


def test_gpu_bench_dram_from(tmp_path):
    fails(["gpu", "bench", "--dram-from", str(tmp_path / "none.json")], "--dram-from", "No such file")
    fails(["gpu", "bench", "--dram-from", str(tmp_path)], "--dram-from", "Is a directory")
    (tmp_path / "p.json").write_text('{"rows": [')
    fails(["gpu", "bench", "--dram-from", str(tmp_path / "p.json")], "--dram-from", "is not valid JSON")


def test_gpu_report_damaged_json_and_update_to_a_missing_file(tmp_path):
    (tmp_path / "bench.json").write_text('{"rows": [')
    fails(["gpu", "report", str(tmp_path)], "FOLDER", "bench.json is not valid JSON")
    (tmp_path / "bench.json").write_text("{}")
    fails(["gpu", "report", str(tmp_path)], "FOLDER", "not what `simflash gpu ... --save` writes")
    (tmp_path / "bench.json").write_text(json.dumps({"rows": []}))
    fails(["gpu", "report", str(tmp_path), "--update", str(tmp_path / "none.md")], "--update", "No such file")


def test_negative_seed_names_the_option():
    fails(["verify", "--seed", "-1"], "--seed")
    fails(["run", "--n", "16", "--seed", "-1"], "--seed")
    fails(["export", "--out", "x.json", "--seed", "-2"], "--seed")


# ------------------------------------------------------------------------------- option names


@pytest.mark.parametrize("args, option, phrase", [
    (["sweep", "--n", "0"], "--n", "must be a positive integer"),
    (["roofline", "--n", "0"], "--n", "must be a positive integer"),
    (["amdahl", "--f-time", "2", "--kernel-speedup", "2"], "--f-time", "must be a time share"),
    (["amdahl", "--f-time", "0.5", "--kernel-speedup", "0"], "--kernel-speedup", "must be a finite positive"),
    (["plot", "stats", "--rows", "999", "--out", "x.png"], "--rows", "must be query rows"),
    (["run", "--n", "0"], "--n", "must be a positive integer"),
    (["run", "--block-kv", "0"], "--block-kv", "must be a positive integer"),
    (["scopes", "--d", "0"], "--d", "must be a positive integer"),
    (["trace", "--n", "0"], "--n", "must be a positive integer"),
    (["export", "--out", "x.json", "--n", "0"], "--n", "must be a positive integer"),
])
def test_messages_name_the_option_typed(args, option, phrase):
    text = fails(args, f"Invalid value for {option}", phrase)
    for internal in (" ns ", "f_time", "s_kernel", "block_kv must"):
        assert internal not in text


# ---------------------------------------------------------------------------- unbounded inputs


def test_huge_tile_map_is_refused():
    fails(["plot", "tilemap", "--n", "100000", "--block-q", "1", "--block-kv", "1", "--out", "x.png"],
          "--n", "100,000 x 100,000 tiles", "at most 512")


def test_huge_sweep_is_refused():
    fails(["sweep", "--n", "10000000000"], "Invalid value for --n", "at most 1,048,576 query tiles")


def test_huge_report_scenario_is_refused(tmp_path):
    from importlib.resources import files

    text = (files("simflash") / "model" / "scenarios" / "document_qa.toml").read_text()
    scenario = tmp_path / "big.toml"
    scenario.write_text(text.replace("prompt_tokens = 4096", "prompt_tokens = 10000000000"))
    fails(["report", str(scenario)], "SCENARIO:", "workload.prompt_tokens", "too large")
    fails(["report", str(tmp_path / "none.toml")], "SCENARIO: file", "does not exist")


def test_scopes_does_not_grow_with_n():
    from simflash.scopes import on_chip_scopes

    report = on_chip_scopes(1_048_576)  # one full tile and the last are simulated, not 8,192 tiles
    assert [(t.first, t.last) for t in report.tiles] == [(0, 8191)]
    assert report.head_state_bytes == 8 * 1_048_576 and report.logsumexp_bytes == 4 * 1_048_576


@pytest.mark.parametrize("n, block_q", [(1000, 128), (300, 64), (129, 64)])
def test_scopes_with_few_simulated_tiles_equals_every_tile(n, block_q, monkeypatch):
    import simflash.scopes as scopes

    fast = scopes.on_chip_scopes(n, 32, block_q, 16)
    tiles = -(-n // block_q)
    assert fast.tiles[0].first == 0 and fast.tiles[-1].last == tiles - 1
    assert sum(t.last - t.first + 1 for t in fast.tiles) == tiles
    assert fast.head_state_bytes == 8 * n and fast.logsumexp_bytes == 4 * n


# ------------------------------------------------------------------------------------- run


def test_run_with_one_token():
    result = runner.invoke(app, ["run", "--n", "1", "--d", "8"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def test_run_table_explains_its_columns():
    result = runner.invoke(app, ["run", "--n", "64", "--d", "16", "--block-q", "16", "--block-kv", "16"])
    assert result.exit_code == 0, result.output
    model_row = next(line for line in result.output.splitlines() if "idealised" in line and "│" in line)
    assert [cell.strip() for cell in model_row.split("│")[6:9]] == ["-", "-", "-"]  # model = sim, error, / naive's
    text = " ".join(result.output.split())
    assert "/ naive's: the row's rel. error divided by naive's" in text
    assert "naive, unmasked: S overflow: none (0 entries beyond float16)" in text


# ------------------------------------------------------------------------------------- API


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 16, 8)) for _ in range(3)]


@pytest.mark.parametrize("kwargs, message", [
    ({"causal": "no"}, "causal must be True or False, got 'no'"),
    ({"causal": 1}, "causal must be True or False"),
    ({"scale": True}, "scale must be a finite positive number, got True"),
    ({"trace_tiles": "12"}, "trace_tiles must be None or a collection of integer indices"),
    ({"trace_tiles": 0}, "trace_tiles must be None or a collection of integer indices"),
    ({"trace_tiles": [1.0]}, "trace_tiles must hold integer indices, got 1.0"),
    ({"trace_heads": [True]}, "trace_heads must hold integer indices, got True"),
    ({"write_logsumexp": "yes"}, "write_logsumexp must be True or False"),
    ({"record_events": 1}, "record_events must be True or False"),
])
def test_flash_attention_refuses_look_alike_types(qkv, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sf.flash_attention(*qkv, 4, 4, **kwargs)


def test_naive_and_schedule_refuse_string_booleans(qkv):
    with pytest.raises(ValueError, match="causal must be True or False"):
        sf.naive_attention(*qkv, causal="no")
    with pytest.raises(ValueError, match="causal must be True or False"):
        sf.TileSchedule(16, 16, 4, 4, causal="no")
    assert sf.TileSchedule(16, 16, 4, 4, causal=np.bool_(True)).causal is True


def test_fp16_naive_overflow_is_reported_not_warned(qkv):
    q, k, v = qkv
    q, k = np.full_like(q, 1e4), np.full_like(k, 1e4) * np.sign(k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy RuntimeWarning leaks
        run = sf.naive_attention(q, k, v, dtype="float16")
    assert np.isnan(run.out.astype(np.float32)).all()  # what an fp16 eager path really does
    assert run.overflow == int(np.sum(np.abs(q[0] @ k[0].T / np.sqrt(8)) > 65504))
    assert f"{run.overflow:,} entries of S" in run.overflow_note and "16 output row(s) are NaN" in run.overflow_note
    assert sf.naive_attention(*qkv).overflow == 0 and sf.naive_attention(*qkv).overflow_note == ""


@pytest.mark.parametrize("mask", [dict(causal=True), dict(causal=True, causal_variant="lower_right"),
                                  dict(window=(3, 2))])
def test_masked_entries_never_stored_are_not_counted_as_overflow(qkv, monkeypatch, mask):
    """S's masked entries are never written: whatever the uninitialised memory holds there (here +inf)
    is no overflow of the stored scores."""
    allocate = sf.memory.HBM.allocate

    def garbage_where_unwritten(self, name, shape, dtype, poison=True):
        allocate(self, name, shape, dtype, poison)
        if not poison:
            self.inspect(name)[...] = np.inf

    monkeypatch.setattr(sf.memory.HBM, "allocate", garbage_where_unwritten)
    run = sf.naive_attention(*qkv, **mask)
    assert run.overflow == 0 and run.overflow_note == "" and np.isfinite(run.out.astype(np.float32)).all()
    q, k, v = qkv  # an overflow among the stored entries is still counted, and only those
    big = sf.naive_attention(np.full_like(q, 1e4), np.full_like(k, 1e4), v, **mask)
    assert big.overflow == int(sf.numerics.reference_mask(q.shape[-2], k.shape[-2], **mask).sum()) * q.shape[0]


# ------------------------------------------------------------------------------------- --json


@pytest.mark.parametrize("args, keys", [
    (["scopes", "--n", "256"], {"tiles", "head_state_bytes", "logsumexp_bytes"}),
    (["verify"], {"checks", "passed"}),
    (["roofline", "--n", "1024"], {"gpus", "rows", "conclusion"}),
    (["amdahl", "--f-time", "0.22", "--kernel-speedup", "2.8"], {"projection", "sensitivity", "by_share"}),
    (["footprint", "--n", "1024"], {"naive", "fused", "short_sequence"}),
    (["sweep", "--n", "1024,2048"], {"vs_n", "vs_sram"}),
    (["report", "document_qa"], {"ttft_ms", "baseline_bytes", "flash_bytes"}),
    (["gpu", "report", "benchmarks/gpu"], {"bench"}),
])
def test_table_commands_print_json(args, keys):
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert keys <= set(data), sorted(data)


def test_physical_validate_prints_json(tmp_path):
    """On the unseen sweep's first configurations (the whole sweep takes minutes to predict)."""
    for mode in ("cold", "warm", "time"):
        sweep = json.loads((REPO / "benchmarks" / "gpu" / f"unseen_{mode}.json").read_text())
        (tmp_path / f"unseen_{mode}.json").write_text(json.dumps({**sweep, "configs": sweep["configs"][:4]}))
    result = runner.invoke(app, ["physical-validate", str(tmp_path), "--sweep", "unseen", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {row["subset"] for row in data["rows"]} == {"unseen"} and len(data["rows"]) == 2 * 4 * 3


def test_scopes_json_matches_the_report():
    data = json.loads(runner.invoke(app, ["scopes", "--n", "256", "--json"]).stdout)
    assert data["tiles"][0]["first"] == 0 and data["tiles"][-1]["last"] == 1
    assert data["head_state_bytes"] == 8 * 256


def test_trace_input_file_is_problem_not_json(tmp_path):
    path = tmp_path / "row.json"
    path.write_text(json.dumps({"scores": [[8, 6], [10, 7]], "values": [[1, 2], [3, 4], [5, 6], [7, 8]]}))
    assert runner.invoke(app, ["trace", "--problem", str(path)]).exit_code == 0
    assert "--problem" in runner.invoke(app, ["trace", "--help"]).output


def test_integer_lists_show_as_integers_in_help():
    for args in (["sweep", "--help"], ["roofline", "--help"], ["gpu", "bench", "--help"], ["gpu", "profile", "--help"]):
        text = runner.invoke(app, args, env={"COLUMNS": "200"}).output
        assert "<int>[,<int>...]" in text and " TEXT " not in text, args
