"""`simflash run` and `simflash bench` on small sizes (the defaults are the lesson's N = 4096)."""

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simflash.cli import app
from simflash.config import MiB

runner = CliRunner()


def test_run_prints_the_table():
    result = runner.invoke(app, ["run", "--n", "256", "--d", "32"])
    assert result.exit_code == 0, result.output
    assert "naive, unmasked" in result.output and "fa2, causal" in result.output
    assert "gemm_qk" in result.output and "K/V passes per head: unmasked 2, causal 1.5" in result.output


def test_run_json_carries_exact_bytes_and_checks():
    result = runner.invoke(app, ["run", "--n", "300", "--d", "16", "--block-q", "64", "--block-kv", "48",
                                 "--heads", "2", "--dtype", "bfloat16", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    assert all(row["model_matches"] is not False and row["passed"] is not False for row in rows.values())
    naive = rows["naive, unmasked"]["traffic"]
    assert naive["total_bytes"] == 2 * (4 * 300 * 16 * 2 + 4 * 300 * 300 * 2)
    assert rows["fa2, unmasked"]["reduction_vs_matched_baseline"] > 1


def test_run_defaults_give_the_lesson_numbers():
    result = runner.invoke(app, ["run", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    totals = {name: row["traffic"]["total_bytes"] / MiB for name, row in rows.items()}
    assert totals["naive, unmasked"] == 132 and totals["fa2, unmasked"] == 66 and totals["fa2, causal"] == 35
    assert totals["naive, causal, idealised N^2/2 (model)"] == 68
    assert round(rows["fa2, causal"]["reduction_vs_matched_baseline"], 2) == 1.94


def flat(text: str) -> str:
    """The words of a (boxed, wrapped) terminal message."""
    return " ".join(text.replace("│", " ").split())


def test_run_reports_bad_arguments():
    result = runner.invoke(app, ["run", "--n", "0"])
    assert result.exit_code != 0 and "--n: must be a positive integer" in flat(result.output)
    result = runner.invoke(app, ["run", "--dtype", "float8"])
    assert result.exit_code != 0 and "--dtype: must be one of" in flat(result.output)


def test_run_shows_flops_by_kind_and_where_fa1_keeps_o():
    """The FLOPs-by-kind table (FA-1's per-tile divisions among them), the dtype of FA-1's running O and
    its "(init)" ledger labels, in the table and the JSON."""
    args = ["run", "--n", "128", "--d", "16", "--block-q", "32", "--block-kv", "16"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "FLOPs by kind" in text and "non-matmul vs naive" in text
    assert "FA-1 keeps its running O in HBM in float16 (--fa1-o-accum storage)" in text
    assert '"O (init)", "l (init)", "m (init)": the released kernel skips them' in text
    wide = runner.invoke(app, [*args, "--fa1-o-accum", "float32", "--json"])
    assert wide.exit_code == 0, wide.output
    data = json.loads(wide.stdout)
    assert data["fa1_o_accum_dtype"] == "float32"
    rows = {row["name"]: row for row in data["rows"]}
    fa1, fa2 = rows["fa1 (O in float32), unmasked"], rows["fa2, unmasked"]
    # FA-1 divides its B_r x d tile by l_new on every one of the 8 KV tiles; FA-2 divides once
    assert fa1["flops_by_kind"]["div"] == 8 * 128 * 16 and fa2["flops_by_kind"]["div"] == 128 * 16
    by_tensor = fa1["traffic"]["by_tensor"]
    assert by_tensor["O"]["write_bytes"] == 8 * 128 * 16 * 4  # float32: one store per KV tile
    assert by_tensor["out"]["write_bytes"] == 128 * 16 * 2 and by_tensor["O (init)"]["write_bytes"] == 128 * 16 * 4
    bad = runner.invoke(app, [*args, "--fa1-o-accum", "float64"])
    assert bad.exit_code == 2 and "--fa1-o-accum" in flat(bad.output) and "float64" in flat(bad.output)


def test_bench_writes_its_measurements(tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--n", "256", "--d", "32", "--big-n", "1024", "--repeat", "1",
                                 "--physical-n", "2048", "--physical-heads", "2", "--output", str(out), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert json.loads(result.stdout) == written  # --json prints what --output writes
    flash, naive, large, physical = written["results"]
    assert 0 < physical["seconds"] < physical["target_s"] == 10 and physical["dram_read_bytes"] > 0
    assert written["machine"]["blas_threads"] == 1
    assert flash["ratio"] == flash["simulated_s"] / flash["bare_s"] and flash["target_ratio"] == 1.5
    assert naive["target_ratio"] == 1.3 and naive["n"] == 256
    assert 0 < large["seconds"] < large["target_s"] == 30 and large["bare_s"] > 0
    # The child's own high-water mark: far below this test process's, which has run a lot already.
    assert 10 < large["peak_rss_mb"] < 250 and large["total_bytes"] == 1024 * 32 * 2 * (2 + 2 * 8)


def test_bare_loops_compute_attention():
    import numpy as np

    from simflash.bench import bare_tiled_attention, plain_attention, random_inputs
    from simflash.numerics import reference_attention, relative_error

    q, k, v = random_inputs(300, 16, "float16", seed=3)
    ref = reference_attention(q, k, v)
    for out in (bare_tiled_attention(q, k, v, 64, 48, 0.25), plain_attention(q, k, v, 0.25)):
        assert out.dtype == np.float16 and relative_error(out, ref) < 2e-3


def test_run_backward_prints_both_passes_and_what_each_forward_keeps():
    result = runner.invoke(app, ["run", "--backward", "--n", "256", "--d", "32", "--backward-block-q", "32",
                                 "--backward-block-kv", "64"])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "fa2, causal" in text and "flash2_backward_preprocess" in text and "softmax_backward" in text
    assert "naive, S + P (the lesson's count), all layers: 256.00 MiB" in text  # 32 x 32 heads x 2 x 256^2 x 2 B
    assert "recomputing S" in text


def test_run_backward_json_carries_exact_bytes_and_checks():
    result = runner.invoke(app, ["run", "--backward", "--n", "300", "--d", "16", "--heads", "2", "--dtype",
                                 "bfloat16", "--block-q", "64", "--block-kv", "48", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = {row["name"]: row for row in doc["rows"]}
    assert all(row["model_matches"] and row["passed"] for row in rows.values())
    naive = rows["naive, unmasked"]
    assert naive["kept_bytes"] == 2 * 300 * 300 * 2  # P of two heads
    assert naive["backward"]["total_bytes"] == 2 * (7 * 300 * 300 * 2 + 8 * 300 * 16 * 2)
    assert rows["fa2, unmasked"]["kept_bytes"] == 2 * (300 * 16 * 2 + 300 * 4)  # O and L
    assert {f["scope"] for f in doc["kept_for_backward"]} >= {"FA-2, O + L, all layers"}


def test_run_backward_reports_bad_tiles():
    result = runner.invoke(app, ["run", "--backward", "--backward-block-q", "0"])
    assert result.exit_code != 0 and "--backward-block-q: must be a positive integer" in flat(result.output)


@pytest.mark.slow
def test_the_backward_page_shows_what_simflash_run_backward_prints():
    """docs/backward.md quotes `simflash run --backward` in a console block and its output in the text block
    after it: character for character, but for the gradients' error ratios, which depend on the order in
    which the machine's BLAS sums float32 products; those are held to FlashAttention's rule (at most 2)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "backward.md").read_text()
    match = re.search(r"```console\n\$ simflash (run --backward[^\n]*)\n```\n\n```text\n(.*?)\n```", page, re.S)
    assert match, "docs/backward.md has no console block with `simflash run --backward` followed by its output"
    result = runner.invoke(app, shlex.split(match[1]))
    assert result.exit_code == 0, result.output
    ratios = re.compile(r"\d+\.\d\d, \d+\.\d\d, \d+\.\d\d")
    printed = ratios.findall(result.output)
    assert len(printed) == 4 and all(float(r) <= 2 for cell in printed for r in cell.split(", "))
    assert ratios.sub("x, y, z", result.output.strip("\n")) == ratios.sub("x, y, z", match[2])
