"""Amdahl's law: the lesson's projections, the sensitivity table, and FLOP share vs time share."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.model.amdahl import QUOTED_FLOP_SHARE, attention_flop_share, project, sensitivity

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def test_lesson_section_5():
    p = project(0.15, 3.5)
    assert f"{p.speedup:.3f}" == "1.120"
    assert f"{p.latency_reduction:.2%}" == "10.71%"
    assert sf.amdahl(0.15, 3.5) == p.speedup


def test_lesson_sensitivity_table():
    rows = sensitivity(3.5)
    assert [f"{r.f_time:.0%}" for r in rows] == ["15%", "40%", "65%"]
    assert [f"{r.speedup:.3f}" for r in rows] == ["1.120", "1.400", "1.867"]
    assert [f"{r.latency_reduction:.1%}" for r in rows] == ["10.7%", "28.6%", "46.4%"]


def test_flop_share_vs_time_share():
    # Section 5.1: the quoted 3.2% FLOP share with the same 3.5x kernel.
    assert f"{project(QUOTED_FLOP_SHARE, 3.5).speedup:.3f}" == "1.023"
    # Exercise 3: 22% time share at 2.8x.
    time_share = project(0.22, 2.8)
    assert f"{time_share.speedup:.3f}" == "1.165" and f"{time_share.latency_reduction:.1%}" == "14.1%"
    # The exercise's hint divides the FLOP share by 3.5 (0.00914), not 2.8: at 2.8 it is 1.021x.
    assert f"{project(QUOTED_FLOP_SHARE, 2.8).speedup:.3f}" == "1.021"


def test_counted_flop_share_of_the_nominal_8b_model():
    at_2048 = attention_flop_share(2048, 8e9, 32, 32, 128)
    assert f"{at_2048.share:.1%}" == "3.2%"  # the 3.2% the lesson quotes at P = 2,048
    assert round(attention_flop_share(4096, 8e9, 32, 32, 128).share * 100) == 6  # "~6%" at P = 4,096
    assert at_2048.linear_flops == 2 * 8e9 * 2048
    assert at_2048.attention_flops == 32 * sf.model.attention_flops(2048, 128, causal=True, heads=32)
    unmasked = attention_flop_share(2048, 8e9, 32, 32, 128, causal=False)
    assert unmasked.attention_flops == 32 * 32 * 4 * 2048**2 * 128


@given(f=st.floats(0, 1), s=st.floats(1, 100))
def test_speedup_is_bounded_by_the_kernel_and_the_serial_part(f, s):
    speedup = sf.amdahl(f, s)
    assert 1.0 <= speedup <= s * (1 + 1e-12)
    if f < 1:
        assert speedup <= 1 / (1 - f) * (1 + 1e-12)


@pytest.mark.parametrize(("f", "s", "field"), [
    (1.5, 2.0, "f_time"), (-0.1, 2.0, "f_time"), (math.nan, 2.0, "f_time"),
    (0.5, 0.0, "s_kernel"), (0.5, math.inf, "s_kernel"), (0.5, "3", "s_kernel"),
])
def test_bad_amdahl_input(f, s, field):
    with pytest.raises(ValueError, match=field):
        project(f, s)


def test_bad_flop_share_input():
    with pytest.raises(ValueError, match="params"):
        attention_flop_share(2048, -1, 32, 32, 128)
    with pytest.raises(ValueError, match="prompt_tokens"):
        attention_flop_share(0, 8e9, 32, 32, 128)


def test_cli_prints_the_projection_sensitivity_and_contrast():
    result = runner.invoke(app, ["amdahl", "--f-time", "0.15", "--kernel-speedup", "3.5"], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("= 1.120x", "10.71%", "1.400x", "1.867x", "46.43%", "3.20%", "1.023x", "3.25%"):
        assert text in result.output


def test_cli_exercise_3_and_errors():
    result = runner.invoke(app, ["amdahl", "--f-time", "0.22", "--kernel-speedup", "2.8",
                                 "--sensitivity", "0.5"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "1.165x" in result.output and "1.021x" in result.output and "50%" in result.output
    bad = runner.invoke(app, ["amdahl", "--f-time", "1.5", "--kernel-speedup", "2"], env=WIDE)
    assert bad.exit_code == 2 and "--f-time" in bad.output
