"""On-chip scopes read off the simulator's buffers: the lesson's section 2 tiles and section 3.3 scopes."""

import attrs
import pytest

import simflash as sf
from simflash.config import KiB, STATE_DTYPE
from simflash.scopes import TileOccupancy, on_chip_scopes


def test_lesson_configuration():
    """N = 4096, d = 128, fp16, B_r = 128, B_c = 64: the numbers of the lesson's sections 2 and 3.3."""
    report = on_chip_scopes()
    stage = {"K_j[0]": 16 * KiB, "V_j[0]": 16 * KiB, "K_j[1]": 16 * KiB, "V_j[1]": 16 * KiB}
    registers = {"m_i": 512, "l_i": 512, "a_i": 64 * KiB, "S_ij": 32 * KiB}  # float32; P_ij overwrites S_ij
    assert report.tiles == (TileOccupancy(0, 31, {"Q_i": 32 * KiB, **stage}, 96 * KiB, registers, 97 * KiB),)
    assert report.lesson_tiles == {"Q_i tile": 32 * KiB, "K_j tile": 16 * KiB, "V_j tile": 16 * KiB,
                                   "S_ij if it were stored at float16": 16 * KiB}
    assert report.threads == 256 and report.kv_stages == 2
    assert report.head_state_bytes == 32 * KiB  # 2 x 4096 x 4 B
    assert report.cta_stats_bytes == 1 * KiB  # 2 x 128 x 4 B
    assert report.cta_accumulator_bytes == 64 * KiB  # 128 x 128 x 4 B
    assert report.logsumexp_bytes == 16 * KiB  # 4096 x 4 B
    assert report.capacity_bytes == sf.GPUS["H200"].smem_carveout_bytes


def test_the_key_length_changes_no_scope():
    one_tile = on_chip_scopes(256, 32, 64, 16, "bfloat16")
    many_tiles = on_chip_scopes(256, 32, 64, 16, "bfloat16", n_kv=200)
    assert one_tile.n_kv == 32 and many_tiles.n_kv == 200  # default: one KV tile per K/V stage
    assert attrs.evolve(one_tile, n_kv=0) == attrs.evolve(many_tiles, n_kv=0)


def test_ragged_last_query_tile_holds_less_and_the_head_sums_every_row():
    n, d, block_q, block_kv = 300, 16, 64, 32
    report = on_chip_scopes(n, d, block_q, block_kv, "float16", n_kv=100)
    full, ragged = report.tiles
    assert (full.first, full.last, ragged.first, ragged.last) == (0, 3, 4, 4)
    assert full.buffer_bytes == {"Q_i": 64 * d * 2, "K_j[0]": 32 * d * 2, "V_j[0]": 32 * d * 2,
                                 "K_j[1]": 32 * d * 2, "V_j[1]": 32 * d * 2}
    assert full.register_bytes["S_ij"] == 64 * 32 * 4
    assert ragged.buffer_bytes["Q_i"] == (n - 4 * block_q) * d * 2
    assert ragged.peak_bytes < full.peak_bytes == sum(full.buffer_bytes.values())
    s = STATE_DTYPE.itemsize
    assert report.head_state_bytes == 2 * n * s  # every query row's m and l, including the ragged tile's
    assert report.logsumexp_bytes == n * s
    assert report.cta_stats_bytes == 2 * block_q * s
    assert report.cta_accumulator_bytes == block_q * d * s


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n_kv must be a positive integer"):
        on_chip_scopes(64, 8, 16, 8, n_kv=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        on_chip_scopes(64, 8, 16, 8, "float64")
