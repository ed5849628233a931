"""The on-chip model is the backend kernels': shared memory Q_i + kv_stages x (K_j + V_j), S_ij and P_ij in
float32 registers (P_ij in its own, storage dtype, as version 3 keeps it); FA-2's edge cases (empty query
tiles, rows with no key); the tiles that fit a GPU."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simflash as sf
from simflash.algorithms.flash2 import flash2_grid, flash2_program
from simflash.backends.flash2_v3 import ALIGN_SLACK, Flash2V3Kernel
from simflash.backends.flash2_v3 import BLOCK_KV as V3_BLOCK_KV
from simflash.backends.flash2_v3 import HEAD_DIMS as V3_HEAD_DIMS
from simflash.backends.flash2_v3 import KV_STAGES as V3_KV_STAGES
from simflash.backends.kernels import BLOCK_KV, BLOCK_Q, HEAD_DIMS, STORAGE_TYPES, Flash2Kernel
from simflash.cli import app
from simflash.config import KiB
from simflash.memory import SRAM
from simflash.model.footprint import fused_footprints
from simflash.onchip import TileFitError, cta_resources, tile_candidates
from simflash.scopes import on_chip_scopes

runner = CliRunner()
# Every instantiation the GPU kernel is built for whose shared memory fits the H200 (the kernel refuses
# the others, e.g. d = 256 with B_c = 128: 320 KiB).
SUPPORTED = [(bq, bkv, d) for bq, bkv, d in itertools.product(BLOCK_Q, BLOCK_KV, HEAD_DIMS)
             if Flash2Kernel("float16", bq, bkv, d).shared_bytes <= sf.GPUS["H200"].max_shared_bytes_per_cta]


@pytest.mark.parametrize(("block_q", "block_kv", "d"), SUPPORTED)
def test_scopes_and_footprint_equal_the_kernel_s_own_resources(block_q, block_kv, d):
    for dtype in STORAGE_TYPES:
        kernel = Flash2Kernel(dtype, block_q, block_kv, d)
        model = cta_resources(block_q, block_kv, d, dtype)
        assert model.shared_bytes == kernel.shared_bytes and model.threads == kernel.threads
    kernel = Flash2Kernel("float16", block_q, block_kv, d)
    report = on_chip_scopes(4 * block_q, d, block_q, block_kv, "float16")
    (tile,) = report.tiles
    assert tile.peak_bytes == kernel.shared_bytes == sum(tile.buffer_bytes.values())
    assert tile.register_peak_bytes == (2 * block_q + block_q * d + block_q * block_kv) * 4
    assert report.threads == kernel.threads
    _, shared, registers, _ = fused_footprints(4096, d, block_q, block_kv)
    assert shared.size_bytes == kernel.shared_bytes and registers.size_bytes == tile.register_peak_bytes


def test_one_kv_stage_holds_one_k_and_v_tile_and_the_capacity_check_uses_kv_stages():
    q, k, v = np.random.default_rng(0).standard_normal((3, 256, 64))
    one = sf.flash_attention(q, k, v, 128, 64, kv_stages=1, trace="none").on_chip.shared
    assert one.peak_by_buffer == {"Q_i": 16 * KiB, "K_j[0]": 8 * KiB, "V_j[0]": 8 * KiB} and one.peak_bytes == 32 * KiB
    sf.flash_attention(q, k, v, 128, 64, kv_stages=1, sram_bytes=40 * KiB, trace="none")
    with pytest.raises(sf.SRAMOverflowError, match=r"shared memory.*kv_stages=2.*block_q/block_kv or a larger"):
        sf.flash_attention(q, k, v, 128, 64, sram_bytes=40 * KiB, trace="none")  # 16 + 2 x 16 = 48 KiB
    with pytest.raises(ValueError, match=r"kv_stages must be one of \[1, 2\]"):
        sf.flash_attention(q, k, v, kv_stages=3)


def test_register_held_state_is_checked_against_the_register_file():
    q = np.zeros((128, 512))
    with pytest.raises(TileFitError, match=r"registers per thread.*block_q=128, block_kv=64, d=512"):
        sf.flash_attention(q, q, q, 128, 64, trace="none")
    sram = SRAM(228 * KiB, register_bytes=4 * KiB)
    sram.state("a_i", (16, 32), 0.0)  # 2 KiB
    with pytest.raises(sf.SRAMOverflowError, match=r"do not fit in registers.*block_q/block_kv or a smaller d"):
        sram.state("S_ij", (16, 64), 0.0)  # + 4 KiB


def test_tiles_for_d_256_and_512():
    report = tile_candidates(256)
    assert all(c.block_q % 16 == 0 and (c.block_kv is None or c.block_kv % 16 == 0) for c in report.candidates)
    by_rows = {c.block_q: c for c in report.candidates}
    assert by_rows[128].block_kv == 80 and by_rows[128].stopped_by == ("shared memory per CTA",)
    assert by_rows[64].resources.shared_bytes == (64 + 4 * 96) * 256 * 2 <= sf.GPUS["H200"].max_shared_bytes_per_cta
    assert report.candidates[-1].block_kv is None and "register file" in report.candidates[-1].stopped_by
    assert (report.largest.block_q, report.largest.block_kv) == (192, 64)
    none = tile_candidates(512)  # a_i alone is 256 registers per thread
    assert none.largest is None and none.candidates[0].stopped_by == ("registers per thread",)
    assert tile_candidates(256, kv_stages=1).largest.block_q * tile_candidates(256, kv_stages=1).largest.block_kv \
        > 192 * 64


def test_cli_tiles():
    result = runner.invoke(app, ["tiles", "--d", "256", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["largest"] == {"block_q": 192, "block_kv": 64} and data["gpu"] == "H200 SXM"
    text = runner.invoke(app, ["tiles", "--d", "256", "--gpu", "A100"])
    assert text.exit_code == 0 and "largest tile" in text.output
    assert runner.invoke(app, ["tiles", "--d", "0"]).exit_code == 2
    assert runner.invoke(app, ["tiles", "--kv-stages", "3"]).exit_code == 2


@settings(max_examples=40, deadline=None)
@given(n_kv=st.integers(1, 40), extra=st.integers(1, 60), d=st.sampled_from([4, 8]),
       block_q=st.integers(1, 16), block_kv=st.integers(1, 16), heads=st.integers(1, 2))
def test_empty_query_tiles_exit_without_q_and_rows_without_keys_get_logsumexp_inf(n_kv, extra, d, block_q,
                                                                                  block_kv, heads):
    n_q = n_kv + extra  # lower_right with n_q > n_kv: the first extra rows see no key
    rng = np.random.default_rng(n_q)
    q = rng.standard_normal((heads, n_q, d))
    k, v = rng.standard_normal((2, heads, n_kv, d))
    kw = dict(causal=True, causal_variant="lower_right")
    run = sf.flash_attention(q, k, v, block_q, block_kv, trace="none", write_logsumexp=True, **kw)
    model = sf.model.flash_traffic(n_q, d, block_q, block_kv, n_kv=n_kv, heads=heads, write_logsumexp=True, **kw)
    assert run.traffic == model
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, **kw)
    empty_rows = sum(len(range(*sched.q_rows(i).indices(n_q))) for i in range(sched.n_q_tiles)
                     if not sched.kv_tiles(i))
    assert run.traffic.by_tensor["Q"].read_bytes == heads * (n_q - empty_rows) * d * 2
    programs = [flash2_program(sched, cta, d, 2, True) for cta in flash2_grid(sched, heads)]
    q_reads = sum(a.nbytes for p in programs for a in p.prologue if a.key[0] == "Q")
    assert q_reads == run.traffic.by_tensor["Q"].read_bytes
    # rows with no visible key: O = 0 and L = +inf, so a backward's exp(S - L) is 0, not NaN
    no_key = np.arange(n_q) < extra
    assert (run.out[:, no_key] == 0).all() and np.isposinf(run.logsumexp[:, no_key]).all()
    assert np.isfinite(run.logsumexp[:, ~no_key]).all()
    S = np.einsum("hqd,hkd->hqk", q, k) / np.sqrt(d)
    with np.errstate(over="ignore"):
        P = np.exp(S - run.logsumexp[..., None])
    assert not np.isnan(P).any() and (P[:, no_key] == 0).all()


def test_cli_run_write_logsumexp():
    plain = json.loads(runner.invoke(app, ["run", "--n", "64", "--d", "16", "--block-q", "16", "--block-kv", "16",
                                           "--json"]).output)
    with_l = runner.invoke(app, ["run", "--n", "64", "--d", "16", "--block-q", "16", "--block-kv", "16", "--json",
                                 "--write-logsumexp"])
    assert with_l.exit_code == 0, with_l.output
    data = json.loads(with_l.output)
    assert data["write_logsumexp"] is True
    fa2 = [r for r in data["rows"] if r["algorithm"] == "fa2"]
    before = [r for r in plain["rows"] if r["algorithm"] == "fa2"]
    for row, old in zip(fa2, before):
        assert row["model_matches"]
        assert row["traffic"]["by_tensor"]["L"]["write_bytes"] == 64 * 4
        assert row["traffic"]["total_bytes"] == old["traffic"]["total_bytes"] + 64 * 4


@pytest.mark.parametrize(("block_kv", "d"), [(block_kv, d) for block_kv in V3_BLOCK_KV for d in V3_HEAD_DIMS])
def test_p_registers_own_makes_scopes_and_footprint_equal_version_3_s_resources(block_kv, d):
    # version 3 keeps P_ij (storage dtype) in registers of its own beside S_ij (float32), two K/V stages
    kernel = Flash2V3Kernel("bfloat16", 128, block_kv, d)
    model = cta_resources(128, block_kv, d, "bfloat16", V3_KV_STAGES, p_registers="own")
    assert model.shared_bytes == kernel.shared_bytes - ALIGN_SLACK  # the kernel's alignment slack holds no data
    assert model.register_by_buffer["P_ij"] == 128 * block_kv * 2
    report = on_chip_scopes(4 * 128, d, 128, block_kv, "bfloat16", kv_stages=V3_KV_STAGES, p_registers="own")
    (tile,) = report.tiles
    assert tile.peak_bytes == model.shared_bytes
    held = (2 * 128 + 128 * d + 128 * block_kv) * 4 + 128 * block_kv * 2  # m_i, l_i, a_i, S_ij; P_ij
    assert tile.register_peak_bytes == held == model.register_bytes
    assert report.threads == kernel.threads - 128  # the consumers hold the state; the producer warpgroup holds none
    # the consumers' 240 registers each hold it
    assert model.registers_per_thread <= 240
    _, shared, registers, _ = fused_footprints(4096, d, 128, block_kv, "bfloat16", p_registers="own")
    assert shared.size_bytes == model.shared_bytes and registers.size_bytes == tile.register_peak_bytes


def test_p_registers_changes_the_register_report_and_nothing_else():
    q, k, v = np.random.default_rng(1).standard_normal((3, 2, 300, 64))
    runs = [sf.flash_attention(q, k, v, 128, 64, causal=True, p_registers=p, trace="stats")
            for p in ("overwrite_s", "own")]
    assert np.array_equal(runs[0].out, runs[1].out) and runs[0].traffic == runs[1].traffic
    assert runs[0].on_chip.shared == runs[1].on_chip.shared
    assert "P_ij" not in runs[0].on_chip.registers.peak_by_buffer
    assert runs[1].on_chip.registers.peak_by_buffer["P_ij"] == 128 * 64 * 2
    assert runs[1].on_chip.registers.peak_bytes == runs[0].on_chip.registers.peak_bytes + 128 * 64 * 2
    with pytest.raises(ValueError, match=r"p_registers must be one of \['overwrite_s', 'own'\]"):
        sf.flash_attention(q, k, v, p_registers="shared")
