"""Pictures: the files are produced, hold what they should, and the data behind them is right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread
from typer.testing import CliRunner

import simflash as sf
from simflash import plots, trace_io
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.cli import app

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def colour_count(path: Path) -> int:
    rgb = np.round(imread(path)[..., :3].reshape(-1, 3) * 255).astype(np.int64)
    return np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]).size


def has_colour(path: Path, hex_colour: str) -> bool:
    pixels = imread(path)[..., :3].reshape(-1, 3)
    return bool((np.abs(pixels - np.array(to_rgb(hex_colour))).max(axis=1) < 0.02).sum() > 50)


def assert_picture(path: Path, min_bytes: int = 8_000) -> None:
    data = path.read_bytes()
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"
    if path.suffix == ".png":
        assert data.startswith(PNG_SIGNATURE)
        assert colour_count(path) > 20  # text, lines and fills, not a blank canvas
    else:
        text = data.decode()
        assert text.lstrip().startswith("<?xml") and "<svg" in text and text.count("<path") > 20


def small_inputs(n=64, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d)) for _ in range(3))


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_tile_map(tmp_path, suffix):
    path = plots.tile_map(sf.TileSchedule(16, 16, 4, 2, causal=True), tmp_path / f"map{suffix}")
    assert_picture(path)
    if suffix == ".png":
        assert all(has_colour(path, colour) for colour in plots.TILE_COLOURS.values())


def test_unmasked_tile_map_has_only_full_tiles(tmp_path):
    path = plots.tile_map(sf.TileSchedule(12, 12, 4, 4), tmp_path / "map.png")
    assert has_colour(path, plots.TILE_COLOURS["full"])
    assert not has_colour(path, plots.TILE_COLOURS["masked"])


def test_tile_map_of_a_large_grid(tmp_path):
    path = plots.tile_map(sf.TileSchedule(2048, 2048, 64, 32, causal=True), tmp_path / "big.png")
    assert_picture(path)
    height, width = imread(path).shape[:2]
    assert width < 2500 and height < 2500


def test_row_statistics_follow_the_trace():
    case = trace_io.GOLDEN_CASES["two_tile"]()
    run = sf.flash_attention(case.q, case.k, case.v, trace="stats", **case.options)
    stats = plots.row_statistics(run.trace, 0)
    scores = case.k @ case.q[0]
    assert stats["j"].tolist() == [0, 1]
    np.testing.assert_allclose(stats["m"], [scores[:2].max(), scores.max()])
    np.testing.assert_allclose(stats["alpha"][1], np.exp(scores[:2].max() - scores.max()), rtol=1e-6)
    assert stats["l"].dtype == np.float32


def test_row_statistics_of_a_causal_row_stop_at_the_diagonal():
    run = sf.flash_attention(*small_inputs(), block_q=16, block_kv=8, causal=True, dtype="float32")
    schedule = sf.TileSchedule(64, 64, 16, 8, causal=True)
    for row in (0, 17, 63):
        assert plots.row_statistics(run.trace, row)["j"].tolist() == schedule.kv_tiles(row // 16)


def test_tile_stats(tmp_path):
    run = sf.flash_attention(*small_inputs(), block_q=16, block_kv=8, causal=True, dtype="float32")
    assert_picture(plots.tile_stats(run.trace, [0, 30, 63], tmp_path / "stats.png"))


def test_cumulative_bytes_end_at_the_ledger():
    q, k, v = small_inputs()
    runs = {"naive": sf.naive_attention(q, k, v, causal=True, record_events=True)}
    for variant in FLASH_ALGORITHMS:
        runs[variant] = sf.flash_attention(q, k, v, 16, 8, causal=True, variant=variant, record_events=True)
    for label, run in runs.items():
        series = plots.cumulative_hbm_bytes(run.events)
        assert set(series) == set(run.traffic.by_tensor), label
        for tensor, (seqs, so_far) in series.items():
            assert so_far[-1] == run.traffic.by_tensor[tensor].total_bytes
            assert (np.diff(seqs) > 0).all() and (np.diff(so_far) > 0).all()
    assert "S" in plots.cumulative_hbm_bytes(runs["naive"].events)
    assert "S" not in plots.cumulative_hbm_bytes(runs["fa2"].events)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_traffic_over_run(tmp_path, suffix):
    q, k, v = small_inputs()
    runs = {"naive": sf.naive_attention(q, k, v, record_events=True).events}
    for variant in FLASH_ALGORITHMS:
        runs[variant] = sf.flash_attention(q, k, v, 16, 8, variant=variant, record_events=True).events
    path = plots.traffic_over_run(runs, tmp_path / f"traffic{suffix}", title="test")
    assert_picture(path)
    if suffix == ".png":
        assert has_colour(path, "C0") and has_colour(path, "C2")  # the Q band and naive's S band


def test_bad_picture_requests_are_refused(tmp_path):
    schedule = sf.TileSchedule(8, 8, 4, 4)
    with pytest.raises(ValueError, match=r"path must end in one of \('.png', '.svg'\)"):
        plots.tile_map(schedule, tmp_path / "map.jpg")
    run = sf.flash_attention(*small_inputs(16), block_q=4, block_kv=4)
    with pytest.raises(ValueError, match=r"rows must be query rows recorded for head 0 \(recorded: 0..15\), got 16"):
        plots.tile_stats(run.trace, [16], tmp_path / "s.png")
    with pytest.raises(ValueError, match="at least one query row"):
        plots.tile_stats(run.trace, [], tmp_path / "s.png")
    with pytest.raises(ValueError, match="record_events=True"):
        plots.traffic_over_run({"fa2": run.events}, tmp_path / "t.png")
    assert not any(tmp_path.iterdir())


def test_plot_commands_write_pictures(tmp_path):
    runner = CliRunner()
    trace_path = tmp_path / "trace.json"
    assert runner.invoke(app, ["export", "--out", str(trace_path), "--n", "32", "--d", "4", "--block-q", "8",
                               "--block-kv", "4", "--causal", "--level", "stats"]).exit_code == 0
    commands = {
        "tilemap.png": ["plot", "tilemap", "--n", "24", "--block-q", "4", "--block-kv", "3"],
        "stats.svg": ["plot", "stats", "--rows", "0,7"],
        "saved.png": ["plot", "stats", "--trace", str(trace_path), "--rows", "3,31"],
        "traffic.png": ["plot", "traffic", "--n", "64", "--d", "8", "--block-q", "16", "--block-kv", "8"],
    }
    for name, arguments in commands.items():
        result = runner.invoke(app, [*arguments, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert_picture(tmp_path / name)


def test_plot_command_errors_name_the_problem(tmp_path):
    result = CliRunner().invoke(app, ["plot", "stats", "--rows", "zero", "--out", str(tmp_path / "s.png")])
    assert result.exit_code == 2 and "comma-separated integers" in result.output
    result = CliRunner().invoke(app, ["plot", "tilemap", "--block-q", "0", "--out", str(tmp_path / "m.png")])
    assert result.exit_code == 2 and "--block-q" in result.output and "must be a positive integer" in result.output
