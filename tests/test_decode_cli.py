"""`simflash decode`: the tables, --json, --plot, bad input, and the docs page's copy of its output."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.plots import decode_bandwidth

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["decode", *args])


def test_the_docs_page_shows_what_the_command_prints():
    """docs/decode.md quotes `simflash decode ...` in a console block and its output in the text block after it."""
    page = (REPO / "docs" / "decode.md").read_text()
    match = re.search(r"```console\n\$ simflash (decode[^\n]*)\n```\n\n```text\n(.*?)\n```", page, re.S)
    assert match, "docs/decode.md has no console block with `simflash decode` followed by its output"
    result = runner.invoke(app, shlex.split(match[1]))
    assert result.exit_code == 0, result.output
    assert result.output.rstrip("\n") == match[2]


def test_json_holds_the_model_for_each_cache_length():
    result = invoke("--heads", "32", "--kv-heads", "8", "--n-kv", "4096,32768", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [c["n_kv"] for c in data["configurations"]] == [4096, 32768]
    for configuration in data["configurations"]:
        model = sf.model.predict_decode(configuration["n_kv"], 128, heads=32, kv_heads=8)
        chosen = configuration["chosen"]
        assert chosen["launch"] == model.launch.to_dict()
        assert chosen["traffic"]["by_kernel"] == model.traffic.to_dict()["by_kernel"]
        assert all(isinstance(chosen["traffic"][key], int) for key in ("read_bytes", "write_bytes", "total_bytes"))
        assert chosen["time_s"] == pytest.approx(model.time_s)
        assert [k["kernel"] for k in chosen["kernels"]] == ["flash_decoding_split", "flash_decoding_combine"]
        assert configuration["one_split"]["launch"]["num_splits"] == 1
        assert [k["kernel"] for k in configuration["one_split"]["kernels"]] == ["flash_decoding_split"]


@pytest.mark.parametrize("pack", ["--pack-gqa", "--no-pack-gqa"])
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_cache_adds_the_whole_chip_dram_prediction_over_the_same_bytes(cache, pack):
    result = invoke("--n-kv", "4096", "--cache", cache, pack, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["config"]["cache"] == cache
    configuration = data["configurations"][0]
    chosen, dram = configuration["chosen"], configuration["dram"]
    launch = chosen["launch"]
    model = sf.model.predict_decode_dram(4096, 128, heads=32, kv_heads=8, num_splits=launch["num_splits"],
                                         block_kv=launch["block_kv"], pack_gqa=pack == "--pack-gqa", cache=cache)
    assert dram == json.loads(json.dumps(model.to_dict()))
    # the L2 sees the ledger's bytes, kernel by kernel: what it hits or sends to DRAM adds up to them
    for kernel in dram["kernels"]:
        ledger = chosen["traffic"]["by_kernel"][kernel["kernel"]]
        assert kernel["hit_bytes"] + kernel["dram_read_bytes"] == ledger["read_bytes"]
        assert kernel["write_bytes"] == ledger["write_bytes"]
    split = dram["kernels"][0]
    if pack == "--no-pack-gqa":  # four query heads read each K/V head: the L2 serves the repeats
        assert split["hit_bytes"] > 2 * split["dram_read_bytes"]
    elif cache == "cold":  # each K/V byte is read once: every one a miss (the splits' repeated Q rows hit)
        assert all(split["by_tensor"][t]["hit_bytes"] == 0 < split["by_tensor"][t]["dram_read_bytes"]
                   for t in ("K", "V"))
        assert split["by_tensor"]["Q"]["hit_bytes"] > 0


def test_cache_prints_the_dram_table():
    result = invoke("--n-kv", "4096", "--cache", "cold")
    assert result.exit_code == 0, result.output
    assert "whole-chip L2 model, cold" in result.output and "DRAM read" in result.output
    assert "whole-chip" not in invoke("--n-kv", "4096").output


def test_given_splits_and_no_packing():
    result = invoke("--num-splits", "4", "--no-pack-gqa", "--json")
    assert result.exit_code == 0, result.output
    launch = json.loads(result.output)["configurations"][0]["chosen"]["launch"]
    assert launch["num_splits"] == 4 and not launch["heuristic"] and launch["split_ctas"] == 4 * 32


@pytest.mark.parametrize(("args", "option"), [
    (["--kv-heads", "5"], "--kv-heads"),
    (["--kv-heads", "0"], "--kv-heads"),
    (["--n-kv", "32768,abc"], "--n-kv"),
    (["--n-kv", "0"], "--n-kv"),
    (["--num-splits", "300"], "--num-splits"),
    (["--num-splits", "0"], "--num-splits"),
    (["--block-kv", "0"], "--block-kv"),
    (["--dtype", "int8"], "--dtype"),
    (["--gpu", "V100"], "--gpu"),
    (["--batch", "0"], "--batch"),
    (["--d", "0"], "--d"),
    (["--n-q", "0"], "--n-q"),
    (["--plot", "bandwidth.txt"], "--plot"),
    (["--cache", "hot"], "--cache"),
    (["--cache", "cold", "--d", "96"], "--d"),
])
def test_bad_input_exits_2_naming_the_option(args, option):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert option in result.output


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "bandwidth.png"
    result = invoke("--n-kv", "8192", "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_bandwidth_one_split_grows_with_busy_sms_and_the_heuristic_meets_it_once_the_grid_is_full():
    """One split: x CTAs keep x of 132 SMs busy, so up to 132 the K/V bandwidth grows with x. From
    212 CTAs (80% of 264 slots) FA-2's heuristic returns one split: the lines meet."""
    data = decode_bandwidth([32768], group=4)
    one, heuristic = data["lines"][32768, "1 split"], data["lines"][32768, "heuristic"]
    pairs = data["pairs"]
    assert np.all(np.diff(one[pairs <= 132]) > 0)
    np.testing.assert_array_equal(one[pairs >= 212], heuristic[pairs >= 212])
    assert np.all(heuristic[pairs < 32] > 2 * one[pairs < 32])
    assert np.all(heuristic <= data["hbm_bytes_per_s"])
