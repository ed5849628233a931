"""Roofline: intensities from the closed-form model, ridges from the spec table, the generated conclusion, plots."""

import matplotlib.image
import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.config import MiB
from simflash.model.roofline import (
    INTENSITY_MODELS,
    Roof,
    attention_flops,
    compulsory_flash_traffic,
    conclusion,
    crossing,
    gpu_roofs,
    intensity_row,
    intensity_table,
    plot_roofline,
    roof,
)

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def lecture_naive_bytes(n, d, b=2):
    """The lecture's naive_attention_bytes, term by term."""
    return 3 * n * d * b + n * n * b + 2 * n * n * b + n * n * b + n * d * b


def test_flops_are_the_two_matmuls_and_match_the_simulator():
    assert attention_flops(4096, 128) == 4 * 4096**2 * 128
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 2, 48, 16))
    assert sf.naive_attention(q, k, v).flops == attention_flops(48, 16, heads=2)
    assert attention_flops(10, 8, causal=True) == 4 * 8 * (10 * 11 // 2)


@pytest.mark.parametrize(("n", "d"), [(256, 64), (4096, 128), (1000, 96)])
def test_bytes_follow_the_roofline_lecture_and_the_lesson(n, d):
    row = intensity_row(n, d)
    assert row.bytes_by_model["naive"] == lecture_naive_bytes(n, d) == sf.model.naive_traffic(n, d).total_bytes
    assert row.bytes_by_model["fa_compulsory"] == (3 * n * d + n * d) * 2  # flash_attention_bytes
    assert row.bytes_by_model["fa_tiled"] == sf.model.flash_traffic(n, d).total_bytes


def test_lesson_numbers_at_n_4096():
    row = intensity_row(4096, 128)
    assert row.bytes_by_model["naive"] == 132 * MiB
    assert row.bytes_by_model["fa_tiled"] == 66 * MiB
    assert compulsory_flash_traffic(4096, 128).total_bytes == 4 * MiB
    assert round(row.intensity("fa_compulsory")) == 4096 // 2


def test_ridge_points_come_from_the_spec_table():
    assert round(roof("H100").ridge()) == 295
    assert round(roof("H200").ridge()) == 206
    assert round(roof("A100").ridge()) == 153  # 312 TFLOPS / 2.039 TB/s, the lesson's sources table
    assert [r.gpu for r in gpu_roofs()] == list(sf.GPUS)
    h200 = roof("H200")
    assert h200.ridge("L2") == sf.GPUS["H200"].peak_flops["float16"] / sf.GPUS["H200"].l2_bytes_per_s
    assert h200.attainable_flops(1e6) == h200.peak_flops
    assert h200.attainable_flops(10.0) == pytest.approx(10.0 * 4.8e12)


def test_models_name_their_memory_level():
    assert {name: m.level for name, m in INTENSITY_MODELS.items()} == {
        "naive": "HBM", "fa_compulsory": "HBM", "fa_tiled": "L2"}


def test_table_is_ordered_by_d_then_n():
    rows = intensity_table([256, 512], [64, 128])
    assert [(r.n, r.d) for r in rows] == [(256, 64), (512, 64), (256, 128), (512, 128)]


@pytest.mark.parametrize(("values", "expected"), [
    ([1, 2, 3], "stays below the ridge across the entire sweep"),
    ([20, 30], "stays above the ridge across the entire sweep"),
    ([5, 12, 30], "crosses above the ridge at N=2"),
    ([30, 12, 5], "crosses below the ridge at N=3"),
    ([5, 30, 5], "crosses the ridge at N=2, 3"),
])
def test_crossing_words(values, expected):
    points = [(n, v) for n, v in zip((1, 2, 3), values)]
    assert crossing(points, ridge=10) == expected


def test_conclusion_is_generated_from_the_numbers():
    rows = intensity_table()
    text = conclusion(rows, roof("H200"))
    assert "naive attention at d=64, 128, 256 stays below the ridge across the entire sweep" in text
    assert "compulsory traffic (DRAM) at d=64, 128, 256 crosses above the ridge at N=512" in text
    assert "tiled logical traffic (L2, estimated L2 ridge 82 FLOP/byte) at d=64, 128, 256 stays above" in text
    # A machine with a low ridge turns the sentence around: naive crosses above it at N=512 (I = 51.2 at d=128).
    low = Roof("test", "low-ridge GPU", "float16", 50e12, {"HBM": 1e12, "L2": 1e13})
    assert "at d=128 crosses above the ridge at N=512" in conclusion(intensity_table(ds=[128]), low)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        conclusion(intensity_table(ds=[64], dtype="float32"), roof("H200", "float16"))
    with pytest.raises(ValueError, match="variant"):
        intensity_row(256, 64, variant="fa9")
    with pytest.raises(ValueError, match="ds"):
        intensity_table(ds=[])
    with pytest.raises(ValueError, match="gpu"):
        roof("X100")


def test_plot_png_is_non_trivial(tmp_path):
    path = plot_roofline(tmp_path / "roof.png", "H100", d=64)
    assert path.stat().st_size > 20_000
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image[..., :3].std() > 0.05  # not a blank canvas


def test_plot_svg_marks_the_l2_roof_as_an_estimate(tmp_path):
    text = plot_roofline(tmp_path / "roof.svg").read_text()
    assert "<svg" in text and "(estimate)" in text and "N=16,384" in text
    with pytest.raises(ValueError, match="plot file"):
        plot_roofline(tmp_path / "roof.jpg")


def test_cli_prints_tables_conclusion_and_plot(tmp_path):
    plot = tmp_path / "r.png"
    result = runner.invoke(app, ["roofline", "--d", "64", "128", "256", "--plot", str(plot)], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("H100 SXM", "295", "206", "FA tiled logical", "what L2 serves", "Conclusion:", "N=512"):
        assert text in result.output
    assert plot.stat().st_size > 20_000
    assert "42.7" in result.output  # naive I at N=256, d=128


def test_cli_list_forms_and_errors():
    repeated = runner.invoke(app, ["roofline", "--d", "64", "--d", "128", "--n", "256,512"], env=WIDE)
    assert repeated.exit_code == 0, repeated.output
    assert "d=64, 128" in repeated.output and "N=256..512" in repeated.output
    assert runner.invoke(app, ["roofline", "--gpu", "X100"], env=WIDE).exit_code == 2
    bad = runner.invoke(app, ["roofline", "--d", "64,x"], env=WIDE)
    assert bad.exit_code == 2 and "expected integers" in bad.output
    stray = runner.invoke(app, ["roofline", "128"], env=WIDE)
    assert stray.exit_code == 2 and "unexpected argument" in stray.output


# -- the roofline lecture read two ways (issue 11, item 8)


@pytest.mark.parametrize(("d", "text_says"), [(64, 128), (128, 256)])
def test_lecture_text_and_code_readings_of_naive_intensity(d, text_says):
    from simflash.model.roofline import naive_intensity_readings

    n = 32768
    readings = naive_intensity_readings(d, n)
    text, code = readings.readings
    assert (text.source, code.source) == ("lecture text", "lecture code")
    assert text.value == text_says  # "I ≈ 128" (d = 64), "I ≈ 256" (d = 128): 4 N^2 d over N^2 x 2 bytes
    assert code.value == 4 * n * n * d / lecture_naive_bytes(n, d)  # the lecture's own naive_attention_bytes
    assert code.value == pytest.approx(d / 2, rel=0.01)
    assert f"{text.value:.1f}" in readings.note and f"{code.value:.1f}" in readings.note
    assert "simflash's tables use the code's count" in readings.note


def test_lecture_a100_bandwidth_against_the_lesson():
    from simflash.model.roofline import lecture_readings, lecture_ridge_readings

    a100 = lecture_ridge_readings("A100")
    lecture, table = a100.readings
    assert lecture.value == 312e12 / 2.0e12 == 156  # the lecture's table: ~156
    assert table.value == sf.GPUS["A100"].peak_flops["bfloat16"] / 2.039e12  # the lesson: ≈ 153
    assert round(table.value) == 153
    assert "2.0 TB/s" in a100.note and "2.039 TB/s" in a100.note and "ridge 156 vs 153" in a100.note
    assert lecture_ridge_readings("H100") is None  # the lecture and the spec table agree there
    assert [t.quantity for t in lecture_readings()] == [
        "naive I at d=64", "naive I at d=128", "A100 HBM ridge (bfloat16)"]


def test_roofline_command_shows_both_readings_with_notes():
    result = runner.invoke(app, ["roofline", "--gpu", "H100", "--d", "64", "--n", "4096"], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "The roofline lecture read two ways" in out
    code_64 = 4 * 4096**2 * 64 / lecture_naive_bytes(4096, 64)
    code_128 = 4 * 4096**2 * 128 / lecture_naive_bytes(4096, 128)
    for value in ("128.0", f"{code_64:.1f}", "256.0", f"{code_128:.1f}", "156.0", "153.0"):
        assert value in out
    assert "2.0 TB/s" in out and "2.039 TB/s" in out
    assert out.count("Note: ") == 3
    assert "d=128: lecture text I = 256.0 is below H100 SXM's ridge 295" in out
