"""The simulated machine: HBM ledger, SRAM occupancy and capacity, FLOPs, events, stepping."""

import ml_dtypes
import numpy as np
import pytest

import simflash as sf
from simflash.config import KiB
from simflash.memory import HBM, SRAM, SimulatedGPU


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
