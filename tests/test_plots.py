"""Pictures: the files are produced, hold what they should, and the data behind them is right."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.image import imread
from matplotlib.text import Text
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


# -------------------------------------------------------------------- what the pictures show


def labelled_ticks(axis) -> list[str]:
    """The tick labels the axis shows inside its limits (after a draw)."""
    low, high = sorted(axis.get_view_interval())
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text() and low <= t.get_position()[
        0 if axis.axis_name == "x" else 1] <= high]


def draw(figure):
    figure.canvas.draw()  # the Figure got its Agg canvas in the builder's caller: give it one here
    return figure.get_window_extent()


def test_tile_map_of_256_x_256_tiles_keeps_its_labels_on_the_page():
    figure = plots.tile_map_figure(sf.TileSchedule(256 * 64, 256 * 64, 64, 64, causal=True))
    FigureCanvasAgg(figure)
    page = draw(figure)
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    for artist in (axes.yaxis.label, axes.xaxis.label, axes.title, figure.legends[0]):
        box = artist.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= page.x1 and box.y1 <= page.y1, artist
    assert axes.get_ylabel() == "query tile i (64 rows each)"


def test_tile_stats_show_steps_and_name_the_run():
    run = sf.flash_attention(*small_inputs(16, 4), block_q=4, block_kv=2, causal=True, dtype="float32",
                             trace="stats")
    figure = plots.tile_stats_figure(run.trace, [0, 15])
    title = figure.get_suptitle()
    assert "causal upper_left" in title and "float32" in title
    m_axes, alpha_axes, l_axes = figure.axes
    for axes in (m_axes, l_axes):  # states held from one tile to the next, marked at each tile
        assert [line.get_drawstyle() for line in axes.lines] == ["steps-post", "steps-post"]
        assert all(line.get_marker() == "o" for line in axes.lines)
        low, high = axes.get_ylim()
        assert low <= 0 <= high  # from zero: no zoom onto tiny changes
    for row, line in zip([0, 15], alpha_axes.lines):
        stats = plots.row_statistics(run.trace, row)
        assert stats["alpha"][0] == 0  # the trace's alpha at the first tile: nothing to rescale
        assert line.get_linestyle() == "None" and line.get_marker() == "o"
        assert list(line.get_xdata()) == list(stats["j"][1:])  # not drawn at the first tile
        assert (np.asarray(line.get_ydata()) > 0).all()
    assert alpha_axes.get_ylim() == (0, 1.05)


def traffic_runs(n, d, block_q, block_kv):
    q, k, v = small_inputs(n, d)
    runs = {"naive": sf.naive_attention(q, k, v, record_events=True).events}
    for variant in FLASH_ALGORITHMS:
        runs[variant] = sf.flash_attention(q, k, v, block_q, block_kv, variant=variant, trace="none",
                                           record_events=True).events
    return runs


def test_traffic_panels_share_x_and_one_stacking_order():
    runs = traffic_runs(64, 8, 16, 8)
    figure = plots.traffic_figure(runs)
    FigureCanvasAgg(figure)
    draw(figure)
    panels = figure.axes
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    stacking = legend[::-1]  # the legend lists the bands top first
    assert stacking[:3] == ["Q", "K", "V"]
    colours = {}
    for axes, events in zip(panels, runs.values()):
        assert axes.get_xlim() == (0.0, 1.0)
        assert labelled_ticks(axes.xaxis) == ["0", "25", "50", "75", "100"]
        bands = [c.get_label() for c in axes.collections]
        assert bands == [name for name in stacking if name in bands]  # one order in every panel
        assert set(bands) == set(plots.cumulative_hbm_bytes(events))
        for c in axes.collections:
            colours.setdefault(c.get_label(), set()).add(tuple(c.get_facecolor()[0]))
    assert all(len(c) == 1 for c in colours.values())  # a tensor has one colour in every panel
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # and no two share one


def test_traffic_ticks_stay_apart_at_n_8192():
    """Over 150,000 events for FA-1: the x axis still shows five short labels that do not touch."""
    figure = plots.traffic_figure(traffic_runs(8192, 4, 128, 64))
    FigureCanvasAgg(figure)
    draw(figure)
    renderer = figure.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for axes in figure.axes for t in axes.xaxis.get_ticklabels()
                    if t.get_text()), key=lambda box: box.x0)
    assert len(boxes) == 5 * len(figure.axes)
    assert all(a.x1 + 5 < b.x0 for a, b in itertools.pairwise(boxes))


def test_roofline_is_in_tflops_with_a_label_on_every_marker():
    from simflash.model.roofline import roof, roofline_figure, roofline_markers

    figure = roofline_figure("H200", 128)
    FigureCanvasAgg(figure)
    draw(figure)
    axes, side = figure.axes
    assert axes.get_ylabel() == "attainable TFLOP/s"
    ticks = labelled_ticks(axes.yaxis)
    assert len(ticks) >= 3 and "1,000" in ticks and not any("e" in t or "$" in t for t in ticks)
    markers = roofline_markers("H200", 128)
    assert max(y for *_, y in markers) == pytest.approx(roof("H200", "float16").peak_flops / 1e12)
    labels = {(a.get_text(), a.xy) for a in axes.texts}
    assert labels == {(f"N={n:,}", (x, y)) for _, n, x, y in markers}  # each label tied to its marker
    assert all(a.arrow_patch is not None for a in axes.texts)
    renderer = figure.canvas.get_renderer()
    boxes = [Text.get_window_extent(a, renderer) for a in axes.texts]  # the text, without its leader line
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    table = side.tables[0]
    assert max(row for row, _ in table.get_celld()) == len(markers)  # a header, then a row per marker


def test_sweep_draws_m_in_kib_and_labels_both_causal_baselines():
    from simflash.config import KiB
    from simflash.model.sweep import SWEEP_SRAM_BYTES, sweep_figure

    figure = sweep_figure(ns=[256, 1024])
    unmasked, causal, by_m = figure.axes
    assert by_m.get_xlabel() == "SRAM capacity M (KiB)"
    assert list(by_m.lines[0].get_xdata()) == [size / KiB for size in SWEEP_SRAM_BYTES]
    labels = [line.get_label() for line in causal.lines]
    assert "naive causal, exact triangle (matched baseline)" in labels and "naive causal, idealized N²/2" in labels
    assert unmasked.lines[0].get_label() == "naive (matched baseline)"
