"""The simulated machine: HBM ledger, SRAM occupancy and capacity, FLOPs, events, stepping."""

import re

import ml_dtypes
import numpy as np
import pytest

import simflash as sf
from simflash.config import KiB
from simflash.memory import HBM, SRAM, DirectReadError, OnChipBufferError, SimulatedGPU


def test_hbm_counts_every_byte_by_kernel_tensor_and_direction():
    hbm = HBM()
    hbm.place("X", np.arange(12.0).reshape(3, 4), np.float16)  # placing inputs is not traffic
    hbm.allocate("Y", (3, 4), np.float32)
    assert hbm.traffic().total_bytes == 0
    with hbm.kernel("copy"):
        tile = hbm.read("X", (slice(0, 2),))
        hbm.write("Y", (slice(0, 2),), tile * 2)
    with hbm.kernel("again"):
        hbm.read("X", (2,))
    traffic = hbm.traffic()
    assert traffic.ledger == {("copy", "X"): sf.Flow(16, 0), ("copy", "Y"): sf.Flow(0, 32), ("again", "X"): sf.Flow(8, 0)}
    assert traffic.by_tensor["X"] == sf.Flow(24, 0) and traffic.by_kernel["copy"].total_bytes == 48
    assert tile.dtype == np.float32
    np.testing.assert_array_equal(hbm.inspect("Y")[:2], np.arange(8.0).reshape(2, 4) * 2)
    assert np.isnan(hbm.inspect("Y")[2]).all()  # never written: the poison shows


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_reads_after_writes_return_the_rounded_values(dtype):
    """A placed input reads from its float32 twin; writes round first and keep the twin in step."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 4))
    hbm = HBM()
    hbm.place("X", x, dtype)

    def rounded(values):
        return np.asarray(values).astype(dtype).astype(np.float32)

    with hbm.kernel("k"):
        np.testing.assert_array_equal(hbm.read("X", (1, slice(2, 5))), rounded(x[1, 2:5]))
        tile = rng.standard_normal((3, 4)).astype(np.float32)  # most of these are not fp16/bf16 values
        hbm.write("X", (0, slice(1, 4)), tile)
        x[0, 1:4] = rounded(tile)
        np.testing.assert_array_equal(hbm.read("X"), rounded(x))
        everything = rng.standard_normal(x.shape)
        hbm.write_where("X", everything, None)
        np.testing.assert_array_equal(hbm.read("X", (1,)), rounded(everything[1]))
        upper = np.triu(np.ones((6, 4), dtype=bool))
        hbm.write_where("X", x, upper)
        expected = np.where(upper, rounded(x), rounded(everything))
        np.testing.assert_array_equal(hbm.read_where("X", None, fill=0.0), expected)
        np.testing.assert_array_equal(hbm.read_where("X", upper, fill=-np.inf), np.where(upper, expected, -np.inf))
    np.testing.assert_array_equal(hbm.inspect("X").astype(np.float32), expected)
    itemsize = np.dtype(dtype).itemsize  # bytes are counted at the storage itemsize, not the twin's
    assert hbm.traffic().ledger[("k", "X")] == sf.Flow((12 + 48 + 24 + 48 + 2 * 10) * itemsize,
                                                       (12 + 48 + 2 * 10) * itemsize)


def test_transfers_outside_a_kernel_are_refused():
    hbm = HBM()
    hbm.place("X", np.ones(4), np.float32)
    with pytest.raises(RuntimeError, match="outside a kernel"):
        hbm.read("X")


def test_sram_tracks_live_and_peak_bytes_and_refuses_overflow():
    sram = SRAM(capacity_bytes=10 * KiB)
    sram.alloc("A", (1024,), np.float32)  # 4 KiB
    sram.alloc("B", (2048,), np.float16)  # 4 KiB
    sram.free("A")
    sram.alloc("C", (1024,), np.float32)
    with pytest.raises(sf.SRAMOverflowError, match="B 4 KiB, C 4 KiB, D 4 KiB = 12 KiB > capacity 10 KiB"):
        sram.alloc("D", (1024,), np.float32)
    stats = sram.statistics().shared
    assert stats.peak_bytes == 8 * KiB and stats.peak_by_buffer == {"A": 4 * KiB, "B": 4 * KiB, "C": 4 * KiB}


def test_on_chip_buffers_at_the_lesson_configuration():
    """Q_i 32 KiB and two stages of K_j, V_j 16 KiB in shared memory; m_i, l_i 1 KiB + a_i 64 KiB and S_ij
    32 KiB (float32) held in registers."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((256, 128)) for _ in range(3))
    on_chip = sf.flash_attention(q, k, v, trace="none").on_chip
    assert on_chip.shared.peak_by_buffer == {"Q_i": 32 * KiB, "K_j[0]": 16 * KiB, "V_j[0]": 16 * KiB,
                                             "K_j[1]": 16 * KiB, "V_j[1]": 16 * KiB}
    assert on_chip.shared.peak_bytes == 96 * KiB and on_chip.shared.capacity_bytes == 228 * KiB
    registers = on_chip.registers.peak_by_buffer
    assert registers["m_i"] + registers["l_i"] == 1 * KiB and registers["a_i"] == 64 * KiB
    assert registers["S_ij"] == 128 * 64 * 4


def test_flops_count_the_two_matmuls():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 100, 16)) for _ in range(3))
    assert sf.naive_attention(q, k, v).flops == 2 * 4 * 100 * 100 * 16
    assert sf.flash_attention(q, k, v, 32, 16).flops == 2 * 4 * 100 * 100 * 16
    causal = sf.flash_attention(q, k, v, 32, 16, causal=True).flops
    assert causal < 2 * 4 * 100 * 100 * 16  # skipped tiles are never multiplied


def test_events_follow_the_ledger():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((40, 8)) for _ in range(3))
    run = sf.flash_attention(q, k, v, 16, 8, causal=True, record_events=True)
    reads = sum(e.nbytes for e in run.events if e.op == "read")
    writes = sum(e.nbytes for e in run.events if e.op == "write")
    assert (reads, writes) == (run.traffic.read_bytes, run.traffic.write_bytes)
    assert [e.seq for e in run.events] == list(range(len(run.events)))
    assert {e.cta for e in run.events} == {(0, 0), (0, 1), (0, 2)}
    assert sum(e.nbytes for e in run.events if e.op == "matmul") == run.flops
    holds = [e for e in run.events if e.op == "hold"]
    releases = [e for e in run.events if e.op == "release"]
    assert sorted((e.name, e.nbytes) for e in holds) == sorted((e.name, e.nbytes) for e in releases)
    assert sf.flash_attention(q, k, v, 16, 8).events == ()


def test_steps_are_live_and_the_generator_returns_the_run():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 12, 4)) for _ in range(3))
    steps = sf.flash_attention_steps(q, k, v, 4, 4, causal=True, dtype="float32")
    first = next(steps)
    assert (first.i, first.j, first.masked) == (0, 0, True) and first.a.shape == (4, 4)
    seen = [first]
    while True:
        try:
            seen.append(next(steps))
        except StopIteration as stop:
            run = stop.value
            break
    assert [(s.i, s.j) for s in seen] == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    recorded = sf.flash_attention(q, k, v, 4, 4, causal=True, dtype="float32", trace="full").trace
    for live, kept in zip(seen, recorded, strict=True):
        np.testing.assert_array_equal(live.a, kept.a)
        np.testing.assert_array_equal(live.m, kept.m)
    np.testing.assert_array_equal(run.out, sf.flash_attention(q, k, v, 4, 4, causal=True, dtype="float32").out)
    assert run.traffic == sf.model.flash_traffic(12, 4, 4, 4, "float32", causal=True)


def test_stats_trace_leaves_out_the_accumulator():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 30, 4)) for _ in range(3))
    trace = sf.flash_attention(q, k, v, 8, 8, trace="stats", trace_heads=[1], trace_tiles=[0, 3]).trace
    assert trace.level == "stats" and {(s.head, s.i) for s in trace} == {(1, 0), (1, 3)}
    assert all(s.a is None and s.m.shape == s.l.shape == s.alpha.shape == (len(s.rows),) for s in trace)
    assert sf.flash_attention(q, k, v, 8, 8, trace="none").trace.steps == ()


def test_simulated_gpu_build_shares_one_event_log():
    gpu = SimulatedGPU.build(sram_bytes=1024, record_events=True)
    assert gpu.hbm.log is gpu.sram.log is gpu.compute.log is gpu.log


# -- the memory model refuses misuse (issue 11, item 6): each test fails without its check


def _hbm_with_y():
    hbm = HBM()
    hbm.allocate("Y", (2, 4, 3), np.float32, poison=False)
    hbm.inspect("Y")[...] = 0.0
    return hbm


@pytest.mark.parametrize("index", [(0, [0, 2]), (0, np.array([1, 3])), (np.zeros((2, 4), dtype=bool),), (0, True)])
def test_write_through_an_advanced_index_is_refused_not_counted(index):
    """NumPy's advanced indexing selects a copy: the old write counted bytes and stored nothing."""
    hbm = _hbm_with_y()
    with hbm.kernel("k"), pytest.raises(TypeError, match=r"index into 'Y' must be basic .* at position"):
        hbm.write("Y", index, 1.0)
    with hbm.kernel("k"), pytest.raises(TypeError, match="index into 'Y' must be basic"):
        hbm.write_where("Y", np.ones((2, 3)), None, index=index)
    assert hbm.traffic().total_bytes == 0 and not hbm.inspect("Y").any()


def test_basic_index_writes_store_what_they_count():
    hbm = _hbm_with_y()
    with hbm.kernel("k"):
        hbm.write("Y", (1, slice(1, 3)), np.full((2, 3), 7.0))
        hbm.write("Y", 0, 2.0)  # a bare int is a basic index too
    assert hbm.traffic().ledger[("k", "Y")] == sf.Flow(0, (6 + 12) * 4)
    assert (hbm.inspect("Y")[1, 1:3] == 7).all() and (hbm.inspect("Y")[0] == 2).all()


def test_written_values_must_have_the_blocks_shape():
    """write_where(..., None) used to broadcast any shape and count the block's old size."""
    hbm = _hbm_with_y()
    with hbm.kernel("k"):
        with pytest.raises(ValueError, match=r"values written to 'Y' must have the selected block's shape \(4, 3\)"):
            hbm.write_where("Y", np.ones((1, 3)), None, index=(0,))
        with pytest.raises(ValueError, match=r"selected block's shape \(4, 3\).*got shape \(4,\)"):
            hbm.write_where("Y", np.ones(4), np.ones((4, 3), dtype=bool), index=(0,))
        with pytest.raises(ValueError, match=r"must have the selected block's shape \(2, 3\) \(or be a scalar\)"):
            hbm.write("Y", (0, slice(0, 2)), np.ones((3,)))
        with pytest.raises(ValueError, match=r"stored \(the mask for 'Y'\) must broadcast .* \(4, 3\), got shape \(5,\)"):
            hbm.write_where("Y", np.ones((4, 3)), np.ones(5, dtype=bool), index=(0,))
        with pytest.raises(ValueError, match=r"stored \(the mask for 'Y'\) must be a boolean array or None"):
            hbm.read_where("Y", np.ones((4, 3)), fill=0.0, index=(0,))
        hbm.write_where("Y", np.ones((4, 3)), np.array([True, False, True]), index=(1,))  # a broadcast mask counts 8
    assert hbm.traffic().ledger[("k", "Y")] == sf.Flow(0, 8 * 4)
    assert hbm.inspect("Y")[1].sum() == 8


def test_unknown_tensor_is_named():
    with HBM().kernel("k"), pytest.raises(KeyError, match="no tensor 'Z' in HBM"):
        HBM().read("Z")


def test_holding_a_live_buffer_name_again_is_refused():
    """The old hold silently replaced the first buffer: its bytes vanished from the live count."""
    sram = SRAM(capacity_bytes=10 * KiB)
    sram.alloc("A", (1024,), np.float32)
    with pytest.raises(OnChipBufferError, match=r"buffer 'A' is already held in shared memory \(4096 bytes\)"):
        sram.alloc("A", (16,), np.float32)
    with pytest.raises(OnChipBufferError, match="buffer 'A' is already held in shared memory"):
        sram.state("A", (4,), 0.0)
    sram.state("m", (4,), 0.0)
    with pytest.raises(OnChipBufferError, match="buffer 'm' is already held in registers"):
        sram.alloc("m", (4,), np.float32)
    assert sram.shared.live_bytes == 4 * KiB
    sram.free("A")
    sram.alloc("A", (16,), np.float32)  # free first, then the name can be held again


def test_freeing_an_unknown_buffer_names_it_and_what_is_held():
    sram = SRAM(capacity_bytes=10 * KiB)
    sram.alloc("K_j", (8,), np.float16)
    with pytest.raises(OnChipBufferError, match=r"cannot free buffer 'V_j'.*\(held: K_j\)"):
        sram.free("V_j")
    sram.free("K_j")
    with pytest.raises(OnChipBufferError, match=r"cannot free buffer 'K_j'.*\(held: nothing\)"):
        sram.free("K_j")


def test_tiles_land_on_chip_only_through_sram_load():
    """A CTA of a tiled kernel cannot read HBM around the SRAM: what it reads, it holds, and the
    capacity check sees it. sram.load through the same view works and holds the tile."""
    gpu = SimulatedGPU.build(sram_bytes=1 * KiB)
    gpu.hbm.place("K", np.ones((1, 64, 8)), np.float16)
    cta = gpu.for_cta((0, 0))
    with cta.hbm.kernel("k"):
        with pytest.raises(DirectReadError, match=r"hbm.read\('K', ...\).*sram.load\(buffer, hbm, 'K'"):
            cta.hbm.read("K", (0, slice(0, 64)))
        with pytest.raises(DirectReadError, match=re.escape("sram.load")):
            cta.hbm.read_where("K", None, fill=0.0)
        assert cta.sram.load("K_j", cta.hbm, "K", (0, slice(0, 32))).shape == (32, 8)  # 512 B held
        with pytest.raises(sf.SRAMOverflowError, match=re.escape("K_j 0.5 KiB, V_j 1 KiB = 1.5 KiB > capacity 1 KiB")):
            cta.sram.load("V_j", cta.hbm, "K", (0, slice(0, 64)))
        cta.hbm.write("K", (0, slice(0, 2)), np.zeros((2, 8)))  # writes pass through to the shared HBM
    assert gpu.hbm.traffic().ledger[("k", "K")] == sf.Flow(32 * 8 * 2 + 64 * 8 * 2, 2 * 8 * 2)
    assert cta.sram.statistics().shared.peak_bytes == 512


def test_tiled_runs_with_an_l2_go_through_the_view():
    """The L2 hook and the float32 twins still work behind the CTA view (the whole-chip path)."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 64, 16)) for _ in range(3))
    run = sf.flash_attention(q, k, v, 16, 16, cache="cold")
    assert run.traffic == sf.model.flash_traffic(64, 16, 16, 16).times(2)
    assert sum(f.dram_read_bytes for f in run.physical.ledger.values()) > 0
