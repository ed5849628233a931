"""Traffic curves: matched baselines against N, FA-1's tile rule and Theta(N^2 d^2 / M) against SRAM capacity."""

import matplotlib.image
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.config import KiB, MiB
from simflash.model.sweep import fa1_tile_sizes, local_slopes, plot_sweep, traffic_vs_n, traffic_vs_sram
from simflash.model.traffic import FLASH_TRAFFIC

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.mark.parametrize(("m", "d", "tiles"), [
    (65_536, 128, (128, 128)),  # 128 KiB of fp16: B_r reaches d
    (131_072, 128, (128, 256)),  # past it, only B_c grows
    (513, 128, (2, 2)),  # ceil, not floor
    (100, 64, (1, 1)),
])
def test_fa1_tile_rule(m, d, tiles):
    assert fa1_tile_sizes(m, d) == tiles


def test_lesson_points_with_matched_baselines():
    unmasked = traffic_vs_n([4096], 128, causal=False)[0]
    assert (unmasked.baseline_bytes, unmasked.bytes_by_variant["fa2"]) == (132 * MiB, 66 * MiB)
    assert unmasked.reduction("fa2") == 2.0 and unmasked.idealized_baseline_bytes is None
    causal = traffic_vs_n([4096], 128, causal=True)[0]
    assert causal.baseline_bytes == sf.model.naive_traffic(4096, 128, causal=True).total_bytes  # exact triangle
    assert causal.idealized_baseline_bytes == 68 * MiB and causal.bytes_by_variant["fa2"] == 35 * MiB
    assert f"{causal.idealized_baseline_bytes / causal.bytes_by_variant['fa2']:.2f}" == "1.94"
    assert f"{causal.reduction('fa2'):.2f}" == "1.94"


def test_every_registered_variant_appears(monkeypatch):
    monkeypatch.setitem(FLASH_TRAFFIC, "fa2_copy", FLASH_TRAFFIC["fa2"])
    point = traffic_vs_n([512], 64, causal=True)[0]
    assert set(point.bytes_by_variant) == set(FLASH_TRAFFIC)
    assert point.bytes_by_variant["fa2_copy"] == point.bytes_by_variant["fa2"]
    assert set(traffic_vs_sram([16 * KiB], 512, 64)[0].bytes_by_variant) == set(FLASH_TRAFFIC)


def test_traffic_is_theta_n2_d2_over_m_while_tiles_grow():
    d = 128
    points = traffic_vs_sram([8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 128 * KiB], n=4096, d=d)
    assert all(p.block_q < d or p.m_elements == 4 * d * d for p in points)  # the regime where B_r = ceil(M/4d)
    for variant in FLASH_TRAFFIC:
        scaled = [p.scaled(variant) for p in points]
        assert max(scaled) / min(scaled) < 1.1, (variant, scaled)
        assert all(slope == pytest.approx(-1, abs=0.05) for slope in local_slopes(points, variant)[1:])
    fa2 = [p.bytes_by_variant["fa2"] for p in points]
    assert fa2 == sorted(fa2, reverse=True)
    # Past M = 4 d^2 FA-2's B_r is capped at d: its traffic stops falling.
    capped = traffic_vs_sram([128 * KiB, 256 * KiB], n=4096, d=d)
    assert local_slopes(capped, "fa2")[1] == 0.0


def test_sram_points_match_the_closed_form_at_their_tiles():
    point = traffic_vs_sram([24 * KiB], n=1000, d=96, causal=True, dtype="bfloat16")[0]
    assert point.m_elements == 12 * KiB and (point.block_q, point.block_kv) == fa1_tile_sizes(12 * KiB, 96)
    for variant, nbytes in point.bytes_by_variant.items():
        assert nbytes == sf.model.flash_traffic(1000, 96, point.block_q, point.block_kv, "bfloat16", True,
                                                variant).total_bytes


def test_bad_input():
    with pytest.raises(ValueError, match="sram_bytes"):
        traffic_vs_sram([1], dtype="float16")
    with pytest.raises(ValueError, match="ns"):
        traffic_vs_n([])
    with pytest.raises(ValueError, match="ns"):
        traffic_vs_n([0, 256])


def test_plots(tmp_path):
    png = plot_sweep(tmp_path / "sweep.png", ns=[256, 1024, 4096], sram_bytes=[8 * KiB, 32 * KiB, 128 * KiB])
    assert png.stat().st_size > 20_000
    assert matplotlib.image.imread(png)[..., :3].std() > 0.05
    svg = plot_sweep(tmp_path / "sweep.svg", ns=[256, 512], sram_bytes=[8 * KiB, 16 * KiB]).read_text()
    assert "<svg" in svg and "matched baseline" in svg
    with pytest.raises(ValueError, match="plot file"):
        plot_sweep(tmp_path / "sweep.pdf")


def test_cli_sweep(tmp_path):
    plot = tmp_path / "s.png"
    result = runner.invoke(app, ["sweep", "--n", "1024,4096", "--sram-kib", "8,16,128,256", "--plot", str(plot)],
                           env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("Unmasked", "Causal", "132.00", "66.00", "68.02", "68.00", "35.00", "1.94x", "FA-1 Algorithm 1"):
        assert text in result.output
    assert "vs unmasked naive" in result.output and "vs causal naive" in result.output
    assert plot.stat().st_size > 20_000
    spaced = runner.invoke(app, ["sweep", "--n", "1024", "4096"], env=WIDE)  # the only list given
    assert spaced.exit_code == 0, spaced.output
    ambiguous = runner.invoke(app, ["sweep", "--n", "1024", "4096", "--sram-kib", "8", "16"], env=WIDE)
    assert ambiguous.exit_code == 2 and "unexpected argument" in ambiguous.output
