"""Footprint scopes: the lesson's S + P figures, what the fused kernel holds instead, and short N against L2."""

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash.cli import app
from simflash.config import GiB, KiB, MiB
from simflash.model.footprint import (
    fused_footprints,
    intermediate_bytes_per_head,
    intermediate_footprints,
    short_sequence,
)

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def test_lesson_section_1_2_scopes():
    per_head, layer, training = intermediate_footprints(4096, heads=32, layers=32, dtype="float16")
    assert per_head.size_bytes == 64 * MiB
    assert layer.size_bytes == 2 * GiB
    assert training.size_bytes == 64 * GiB
    assert "no activation checkpointing" in training.assumption


def test_any_model_shape():
    per_head, layer, training = intermediate_footprints(8192, heads=64, layers=80, dtype="float32")
    assert per_head.size_bytes == 2 * 8192**2 * 4
    assert (layer.size_bytes, training.size_bytes) == (64 * per_head.size_bytes, 80 * 64 * per_head.size_bytes)


def test_per_head_bytes_are_what_the_simulated_baseline_writes():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 96, 8))
    written = sf.naive_attention(q, k, v, dtype="bfloat16").traffic.by_tensor
    assert intermediate_bytes_per_head(96, "bfloat16") == written["S"].write_bytes + written["P"].write_bytes


def test_lesson_section_6_short_sequence():
    fits = short_sequence(256)
    assert {f.s_bytes for f in fits} == {131_072} and 0.125 * MiB == 131_072
    assert [f.gpu for f in fits] == list(sf.GPUS)
    for f in fits:
        assert f.l2_bytes == sf.GPUS[f.gpu].l2_bytes and f.fits
        assert f.fraction_of_l2 == 131_072 / f.l2_bytes
    assert not short_sequence(8192, gpus=["A100"])[0].fits  # 128 MiB of S does not fit a 40 MiB L2


def test_fused_kernel_holds_tiles_not_matrices():
    hbm, shared, registers, lesson = fused_footprints(4096, 128, 128, 64)
    assert hbm.size_bytes == 0
    assert shared.size_bytes == (32 + 2 * (16 + 16)) * KiB  # Q_i and two stages of K_j, V_j, as the kernel
    assert registers.size_bytes == 1 * KiB + 64 * KiB + 32 * KiB  # m_i, l_i, a_i (section 3.3) and S_ij in float32
    assert lesson.size_bytes == (32 + 16 + 16 + 16) * KiB  # Q_i, K_j, V_j, S_ij at fp16 (the lesson's section 2)
    assert "S_ij if it were stored at float16 16 KiB" in lesson.assumption
    short = fused_footprints(100, 64, 128, 64)  # tiles never exceed the sequence
    assert short[2].size_bytes == (2 * 100 + 100 * 64 + 100 * 64) * 4


def test_bad_input():
    with pytest.raises(ValueError, match="heads"):
        intermediate_footprints(4096, heads=0)
    with pytest.raises(ValueError, match="dtype"):
        short_sequence(256, dtype="int8")
    with pytest.raises(ValueError, match="gpu"):
        short_sequence(256, gpus=["X100"])
    with pytest.raises(sf.SRAMOverflowError):
        fused_footprints(4096, 512, 128, 64, gpu="A100")  # 128 KiB of Q_i alone, plus K_j and V_j: over 164 KiB


def test_cli_footprint():
    result = runner.invoke(app, ["footprint"], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("64.00 MiB", "2.00 GiB", "64.00 GiB", "0.125 MiB", "131,072", "96.00 KiB", "97.00 KiB", "80.00 KiB", "60.00 MiB"):
        assert text in result.output


def test_cli_footprint_other_shape_and_errors():
    result = runner.invoke(app, ["footprint", "--n", "2048", "--heads", "8", "--layers", "4",
                                 "--short-n", "512"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "16.00 MiB" in result.output and "128.00 MiB" in result.output and "512.00 MiB" in result.output
    assert "0.500 MiB" in result.output
    refused = runner.invoke(app, ["footprint", "--layers", "0"], env=WIDE)
    assert refused.exit_code == 2 and "layers" in refused.output
