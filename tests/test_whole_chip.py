"""The whole chip: the L2 model, the grid runner's two schedules, traffic-only runs against runs with values."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import simflash as sf
from simflash.config import MiB
from simflash.l2 import RESIDUE, L2Cache, L2Flow, L2Mixture, L2Sets
from simflash.model.physical import predict


def _inputs(seed, heads, n_q, n_kv, d):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((heads, n_q, d)), rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_kv, d))


def test_l2_counts_misses_hits_evictions_and_dirty_at_end():
    l2 = L2Cache(capacity_bytes=100)
    l2.kernel = "k"
    l2.write(("S", 0, 0), 60)  # allocated dirty, no DRAM read
    l2.read(("Q", 0, 0), 30)  # miss
    l2.read(("Q", 0, 0), 30, count=3)  # three hits
    l2.read(("K", 0, 0), 30)  # miss: 120 > 100 evicts the LRU block, dirty S, written back
    l2.end_kernel()
    flows = l2.traffic().ledger
    assert flows["k", "S"].dram_write_bytes == 60 and flows["k", "S"].write_bytes == 60
    assert flows["k", "Q"].dram_read_bytes == 30 and flows["k", "Q"].hit_bytes == 90
    assert flows["k", "K"].dram_read_bytes == 30
    assert flows["k", "S"].dirty_at_end_bytes == 0
    l2.kernel = "k2"
    l2.write(("O", 0, 0), 10)
    l2.end_kernel()
    assert l2.traffic().ledger["k2", "O"].dirty_at_end_bytes == 10
    l2.flush()
    l2.kernel = "k3"
    l2.read(("Q", 0, 0), 30)
    assert l2.traffic().ledger["k3", "Q"].dram_read_bytes == 30  # flushed: a miss again


def test_read_fill_weight_lets_dirty_blocks_stay():
    light = L2Cache(capacity_bytes=100, read_fill_weight=0.25)
    light.kernel = "k"
    light.write(("S", 0, 0), 80)
    for block in range(4):
        light.read(("P", 0, block), 20)  # streamed once: each holds a quarter of its size
    light.end_kernel()
    assert light.traffic().ledger["k", "S"].dram_write_bytes == 0  # 80 + 4 x 5 = 100 fits
    plain = L2Cache(capacity_bytes=100)
    plain.kernel = "k"
    plain.write(("S", 0, 0), 80)
    plain.read(("P", 0, 0), 30)
    assert plain.traffic().ledger["k", "S"].dram_write_bytes == 80


def test_a_read_leaves_a_dirty_block_where_it_was_a_clean_one_moves_to_the_end():
    """Capacity 3 KiB: S0, S1, S2 written (dirty), S0 read, P0 written. The read leaves S0 the oldest, so P0
    evicts it (read, the softmax is done with it), not S1, which is still to be read. Clean blocks: K0, K1,
    K2 read, K0 read again, Q0 read: K0 moved to the end, K1 goes."""
    l2 = L2Cache(capacity_bytes=3 * 1024)
    l2.kernel = "k"
    for row in range(3):
        l2.write(("S", 0, row), 1024)
    l2.read(("S", 0, 0), 1024)
    l2.write(("P", 0, 0), 1024)
    l2.read(("S", 0, 1), 1024)
    flows = l2.traffic().ledger
    assert flows["k", "S"].dram_write_bytes == 1024 and flows["k", "S"].hit_bytes == 2048
    l2.flush()
    for block in (0, 1, 2, 0):
        l2.read(("K", 0, block), 1024)
    l2.read(("Q", 0, 0), 1024)
    l2.read(("K", 0, 0), 1024)
    assert l2.traffic().ledger["k", "K"].hit_bytes == 2 * 1024


def test_a_dirty_block_read_is_written_back_once_the_window_of_reads_has_passed_and_stays_clean():
    """A 1,000-byte cache, window 25: S0..S2 written by one kernel; the next reads S0 (dirty), then R0, R1: 20
    bytes read since, nothing written back; R2 takes it to 30 > 25: S0 goes back to DRAM, still resident (read
    again, it hits) and no longer dirty at the end. S1, read last, and S2, never read, stay dirty; without a
    window S0 does too."""
    for window, written_back in ((25, 10), (None, 0)):
        l2 = L2Cache(capacity_bytes=1000, dirty_read_window_bytes=window)
        l2.kernel = "writer"
        for row in range(3):
            l2.write(("S", row), 10)
        l2.end_kernel()
        l2.kernel = "reader"
        l2.read(("S", 0), 10)
        for row in range(2):
            l2.read(("R", row), 10)
        assert l2.traffic().ledger["reader", "S"].dram_write_bytes == 0
        l2.read(("R", 2), 10)
        l2.read(("S", 0), 10)
        l2.read(("S", 1), 10)
        l2.end_kernel()
        flow = l2.traffic().ledger["reader", "S"]
        assert (flow.dram_write_bytes, flow.hit_bytes, flow.dirty_at_end_bytes) == (written_back, 30, 30 - written_back)


def test_a_shared_read_counts_once_and_holds_the_cohort_weight():
    """A block several CTAs read at once but the ledger counts once (the P V GEMM's chunks of V) holds the
    cohort weight, not the read-fill weight: here all of its 40 bytes, so a 60-byte write overflows the
    100-byte cache and evicts it; read by one CTA it would hold 10 and stay."""
    for shared, hit in ((True, 0), (False, 40)):
        l2 = L2Cache(capacity_bytes=100, read_fill_weight=0.25, cohort_weight=1.0)
        l2.kernel = "k"
        l2.read(("V", 0, 0), 40, shared=shared)
        l2.read(("Q", 0, 0), 40)
        l2.write(("S", 0, 0), 60)
        l2.read(("V", 0, 0), 40)
        flow = l2.traffic().ledger["k", "V"]
        assert (flow.read_bytes, flow.hit_bytes) == (80, hit)


def test_a_kernel_with_its_own_read_weight_reads_without_displacing_what_it_writes():
    """In a kernel `kernel_read_weights` names, reads hold that weight, filled or read again (0 for the naive Q K
    GEMM, as the machine file has it): 80 bytes of Q and K read there, K twice, leave all 100 bytes of S written
    around them dirty at the end in a 100-byte cache; in another kernel, at a quarter, the 80 bytes of fills
    push 20 of S out, and K read again (all of its size) 40 more."""
    caches = sf.model.physical.l2_cache(sf.GPUS["H200"]).caches
    assert (caches[0].kernel_read_weights, caches[0].kernel_clean_age_factors) == (
        {"gemm_qk": 0.0, "softmax": 0.4}, {"gemm_qk": 1.4})
    for kernel, written_back in (("gemm_qk", 0), ("gemm_pv", 60)):
        l2 = L2Cache(capacity_bytes=100, read_fill_weight=0.25, kernel_read_weights={"gemm_qk": 0.0})
        l2.kernel = kernel
        for row in range(3):
            l2.write(("S", 0, row), 20)
        l2.read(("Q", 0, 0), 40)
        l2.read(("K", 0, 0), 40)
        l2.write(("S", 0, 3), 40)
        l2.read(("K", 0, 0), 40, again=True)
        l2.end_kernel()
        flow = l2.traffic().ledger[kernel, "S"]
        assert (flow.dram_write_bytes, flow.dirty_at_end_bytes) == (written_back, 100 - written_back)
        k = l2.traffic().ledger[kernel, "K"]
        assert (k.read_bytes, k.hit_bytes, k.again_bytes) == (40, 40, 40)  # the ledger's K is the first read
    # A dirty block read there holds its size: the 40 bytes of S the softmax (fills at 0.4) finds dirty keep their
    # room, so four 50-byte fills after them (80 bytes of room) write S back; at 0.4, S would have stayed (96).
    l2 = L2Cache(capacity_bytes=100, read_fill_weight=1.0, kernel_read_weights={"softmax": 0.4})
    l2.kernel = "gemm_qk"
    l2.write(("S", 0, 0), 40)
    l2.end_kernel()
    l2.kernel = "softmax"
    l2.read(("S", 0, 0), 40)
    for row in range(4):
        l2.read(("X", 0, row), 50)
    l2.end_kernel()
    assert l2.traffic().ledger["softmax", "S"].dram_write_bytes == 40


def test_a_block_written_in_a_kernel_with_its_own_write_weight_holds_that_share_of_its_size():
    """In a kernel `kernel_write_weights` names, a block written holds that share of its size (1.1 for FA-2's
    O, as the machine file has it): five 20-byte blocks written at 1.25 in a 100-byte cache hold 125, so the
    oldest is written back and 80 bytes stay dirty; in another kernel all 100 stay. Written again, a block
    keeps holding its kernel's share."""
    caches = sf.model.physical.l2_cache(sf.GPUS["H200"]).caches
    assert caches[0].kernel_write_weights == {"flash2_forward": 1.1}
    for kernel, written_back in (("flash2_forward", 20), ("softmax", 0)):
        l2 = L2Cache(capacity_bytes=100, kernel_write_weights={"flash2_forward": 1.25})
        l2.kernel = kernel
        for row in range(5):
            l2.write(("O", 0, row), 20)
        l2.write(("O", 0, 4), 20)
        assert l2._blocks["O", 0, 4][2] == (25 if written_back else 20)
        l2.end_kernel()
        flow = l2.traffic().ledger[kernel, "O"]
        assert (flow.dram_write_bytes, flow.dirty_at_end_bytes) == (written_back, 100 - written_back)


def test_a_clean_block_ageing_slower_outlasts_dirty_ones_written_after_it():
    """Capacity 100: Q (clean, 20 bytes) read, then S written 20 bytes at a time. Least recently used order
    evicts Q first; ageing clean blocks 1.4 times slower, Q outlasts S pieces written up to 1.4 times its age
    before them: with S0..S4 written, the first eviction takes S0 (Q's age 100 / 1.4 = 71 < S0's 80), the next
    Q (its age 120 / 1.4 = 86 > S1's 80)."""
    for factors, evicted in (({}, ["Q", "S"]), ({"k": 1.4}, ["S", "Q"])):
        l2 = L2Cache(capacity_bytes=100, kernel_clean_age_factors=factors)
        l2.kernel = "k"
        l2.read(("Q", 0, 0), 20)
        order = []
        for row in range(6):
            l2.write(("S", 0, row), 20)
            for key in (("Q", 0, 0), ("S", 0, 0)):
                if key not in l2._blocks and key[0] not in order and (key[0] != "S" or row >= 4):
                    order.append(key[0])
        assert order == evicted


def test_a_mixture_keeps_data_reused_between_its_capacities_half_the_time():
    """A stream of 100 bytes read twice: caches of 90 and 110 bytes miss and hit the second pass; their
    mixture reads half of it again. The logical bytes are every cache's; the flush residue is carried
    where only one cache wrote it back."""
    mixture = L2Mixture((L2Cache(90, flush_residue_bytes=6), L2Cache(110, flush_residue_bytes=6)))
    mixture.flush(residue=True)
    mixture.kernel = "k"
    for _ in range(2):
        for block in range(10):
            mixture.read(("K", 0, block), 10)
    mixture.end_kernel()
    flows = mixture.traffic().ledger
    assert flows["k", "K"].dram_read_bytes == (200 + 100) // 2 and flows["k", "K"].read_bytes == 200
    assert flows["k", "K"].hit_bytes == 200 - 150
    assert flows["k", RESIDUE].dram_write_bytes == 6 // 2  # the 90-byte cache evicted it, the 110-byte one did not
    assert mixture.capacity_bytes == 100


def test_hashed_sets_keep_part_of_a_reuse_one_lru_of_their_capacity_loses_whole():
    """A buffer 10% larger than the cache, read twice in the same order: one LRU cache of the whole capacity
    misses every block of the second pass; the same capacity as 16 hashed sets keeps the blocks of the sets
    that happen to hold fewer. Blocks larger than a stripe are spread over several sets, bytes conserved."""

    def second_pass_misses(l2) -> int:
        l2.flush()
        l2.kernel = "k"
        for _ in range(2):
            for block in range(1100):
                l2.read(("K", 0, block), 10)
        l2.end_kernel()
        return l2.traffic().ledger["k", "K"].dram_read_bytes - 11000

    def sets() -> L2Sets:
        return L2Sets(tuple(L2Cache(10000 / 16) for _ in range(16)), stripe_bytes=10)

    assert sets().capacity_bytes == 10000
    assert second_pass_misses(L2Cache(10000)) == 11000
    kept_in_part = second_pass_misses(sets())
    assert 0 < kept_in_part < 11000
    assert second_pass_misses(sets()) == kept_in_part  # the hash is the same on every run
    wide = L2Sets(tuple(L2Cache(1000) for _ in range(4)), stripe_bytes=16)
    wide.flush()
    wide.kernel = "k"
    wide.write(("O", 0, 0), 100)  # 7 stripes: 6 of 14 bytes, one of 16
    wide.end_kernel()
    assert wide.traffic().ledger["k", "O"].write_bytes == 100
    assert sum(len(c._blocks) for c in wide.caches) == 7


def test_a_cold_flush_leaves_its_residue_for_the_next_kernel_to_write_back():
    l2 = L2Cache(capacity_bytes=100, flush_residue_bytes=20)
    l2.flush(residue=True)
    l2.kernel = "small"
    l2.read(("Q", 0, 0), 70)  # 20 + 70 fits: the residue stays, written by no kernel yet
    l2.end_kernel()
    assert ("small", RESIDUE) not in l2.traffic().ledger
    l2.flush(residue=True)
    l2.kernel = "large"
    l2.read(("Q", 0, 0), 90)  # 20 + 90 does not: the residue, oldest, is evicted and written back
    l2.end_kernel()
    residue = l2.traffic().ledger["large", RESIDUE]
    assert (residue.dram_write_bytes, residue.write_bytes, residue.dirty_at_end_bytes) == (20, 0, 0)
    l2.flush()  # the read-only sweep before a warm run leaves nothing behind
    l2.kernel = "warm"
    l2.read(("K", 0, 0), 100)
    l2.end_kernel()
    assert ("warm", RESIDUE) not in l2.traffic().ledger


def test_blocks_a_cohort_reads_hold_their_cohort_weight():
    """Four 40-byte blocks read by two CTAs at once: at full size 160 bytes overflow a 100-byte cache and
    the second pass misses; at a cohort weight of 0.5 they hold 80 and every second read hits."""
    for weight, second_pass_misses in ((1.0, 160), (0.5, 0)):
        l2 = L2Cache(capacity_bytes=100, cohort_weight=weight)
        l2.kernel = "k"
        for _ in range(2):
            for block in range(4):
                l2.read(("K", block), 40, count=2)
        flow = l2.traffic().ledger["k", "K"]
        assert flow.dram_read_bytes == 160 + second_pass_misses and flow.read_bytes == 2 * 2 * 160


def test_the_flush_residue_leaves_in_proportion_over_its_ramp():
    """Room beside a residue of 20 in 100 bytes is 80: what is brought in beyond it writes the residue
    back in proportion over the 80-byte ramp, whether it was read or written."""
    l2 = L2Cache(capacity_bytes=100, flush_residue_bytes=20, residue_ramp_bytes=80)
    l2.flush(residue=True)
    l2.kernel = "k"
    written = []
    for block, access in enumerate([l2.read, l2.write, l2.read, l2.write]):
        access(("X", block), 40)
        written.append(l2.traffic().ledger.get(("k", RESIDUE), L2Flow()).dram_write_bytes)
    assert written == [0, 0, 10, 20]  # 40, 80 in: none; 120: half of it; 160: all


def test_the_flush_residue_is_what_the_h200_probe_measured():
    """The machine file's residue is the DRAM writes of a read-only kernel run right after a 48 MiB
    write under ncu's cache control (benchmarks/gpu/write_sources.json), not a fitted figure."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    probe = next(c for c in json.loads((root / "benchmarks/gpu/write_sources.json").read_text())["configs"]
                 if c["config"]["algorithm"] == "flush_probe")
    fill, reduce = probe["kernels"][:2]
    assert reduce["l2_write_sectors_sm"] * 32 < 0.25 * MiB  # its own stores: the partial sums, 0.16 MiB
    assert sf.GPUS["H200"].calibration["l2_flush_residue_bytes"] == reduce["dram_write_bytes"]
    assert fill["dram_write_bytes"] < 48 * MiB - 20 * MiB  # most of the fill is still dirty at its end


def test_sdpa_flash_kernel_s_extra_writes_are_its_register_spills():
    """PyTorch's FA-2 kernel stores to local memory (255 registers, a stack frame): its SMs write many
    times O into the L2, nearly all of it spills; simflash's kernel writes O and nothing else."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = json.loads((root / "benchmarks/gpu/write_sources.json").read_text())["configs"]
    flash = [(row["config"], row["kernels"][0]) for row in rows if row["config"]["algorithm"] in ("fa2", "sdpa_flash")]
    assert {c["algorithm"] for c, _ in flash} == {"fa2", "sdpa_flash"}
    for c, k in flash:
        out = c["heads"] * c["n"] * c["d"] * 2
        if c["algorithm"] == "sdpa_flash":
            assert k["registers_per_thread"] == 255 and k["local_store_sectors"] * 32 > 5 * out
            spills_and_stores = k["local_store_sectors"] + k["global_store_sectors"]
            assert k["l2_write_sectors_sm"] == pytest.approx(spills_and_stores, rel=0.01)
        else:
            assert k["local_store_sectors"] == 0 and k["l2_write_sectors_sm"] * 32 == out


shapes = st.tuples(st.integers(1, 2), st.integers(1, 150), st.integers(1, 150), st.sampled_from([16, 32]))


@given(shape=shapes, causal=st.booleans(), variant=st.sampled_from(["upper_left", "lower_right"]),
       algorithm=st.sampled_from(["fa2", "fa1"]), seed=st.integers(0, 2**32 - 1))
def test_schedules_agree_on_output_and_ledger(shape, causal, variant, algorithm, seed):
    heads, n_q, n_kv, d = shape
    q, k, v = _inputs(seed, heads, n_q, n_kv, d)
    options = dict(block_q=32, block_kv=16, causal=causal, causal_variant=variant, variant=algorithm, trace="none")
    sequential = sf.flash_attention(q, k, v, **options)
    concurrent = sf.flash_attention(q, k, v, schedule="concurrent", cache="warm", **options)
    assert np.array_equal(sequential.out, concurrent.out)
    assert sequential.traffic == concurrent.traffic
    assert sequential.flops_by_kind == concurrent.flops_by_kind


@given(shape=shapes, causal=st.booleans(), variant=st.sampled_from(["upper_left", "lower_right"]),
       cache=st.sampled_from(["cold", "warm"]), capacity=st.sampled_from([65536, 10**6, 10**9]),
       seed=st.integers(0, 2**32 - 1))
# a cohort's reads held at the cohort weight change what this small L2 evicts
@example(shape=(3, 384, 384, 32), causal=False, variant="upper_left", cache="cold", capacity=98304, seed=1)
# the softmax's writes of P trail its reads of S by three blocks of 64 rows: all of a head's reads, then its writes
@example(shape=(2, 150, 2048, 16), causal=False, variant="upper_left", cache="warm", capacity=65536, seed=2)
def test_traffic_only_run_sees_what_a_run_with_values_sees(shape, causal, variant, cache, capacity, seed):
    """Same logical bytes (also the closed form), same hits, DRAM bytes and dirty blocks, byte for byte.

    (Exact as long as the cache holds one step's blocks, as any real L2 holds a few tiles.) The naive path's
    chip has 32 SMs, so its softmax holds 256 rows at once and writes each head's P a block (or more) late."""
    import attrs

    heads, n_q, n_kv, d = shape
    gpu = attrs.evolve(sf.GPUS["H200"], sm_count=2, calibration={"l2_effective_bytes": capacity,
                                                                    "l2_read_fill_weight": 0.5,
                                                                    "l2_cohort_weight": 0.75,
                                                                    "l2_flush_residue_bytes": 4096})
    naive_gpu = attrs.evolve(gpu, sm_count=32)
    sf.config.GPUS["_test"], sf.config.GPUS["_test_naive"] = gpu, naive_gpu
    try:
        q, k, v = _inputs(seed, heads, n_q, n_kv, d)
        run = sf.flash_attention(q, k, v, block_q=64, block_kv=64, causal=causal, causal_variant=variant,
                                 trace="none", schedule="concurrent", cache=cache, gpu="_test")
        predicted = predict("fa2", n_q, d, n_kv=n_kv, heads=heads, causal=causal, causal_variant=variant,
                            block_q=64, block_kv=64, gpu=gpu, cache=cache)
        naive = sf.naive_attention(q, k, v, causal=causal, causal_variant=variant, cache=cache, gpu="_test_naive")
        naive_predicted = predict("naive", n_q, d, n_kv=n_kv, heads=heads, causal=causal, causal_variant=variant,
                                  gpu=naive_gpu, cache=cache)
    finally:
        del sf.config.GPUS["_test"], sf.config.GPUS["_test_naive"]
    for values, traffic_only in ((run, predicted), (naive, naive_predicted)):
        for kernel, flow in values.physical.by_kernel.items():
            p = traffic_only.kernel(kernel)
            assert (p.l2_hit_bytes, p.dram_read_bytes, p.dram_write_bytes, p.dirty_at_end_bytes) == (
                flow.hit_bytes, flow.dram_read_bytes, flow.dram_write_bytes, flow.dirty_at_end_bytes)
            logical = values.traffic.by_kernel[kernel]
            assert (p.logical_read_bytes, p.logical_write_bytes) == (logical.read_bytes, logical.write_bytes)


def test_sdpa_ctas_walk_their_kv_tiles_from_the_last_down():
    """FlashAttention-2's kernel visits a CTA's KV tiles in reverse: the same blocks as simflash's order,
    last first; with the mask, CTAs of one head start on different tiles (each its own cohort)."""
    from simflash.algorithms.flash2 import flash2_grid, flash2_program
    from simflash.schedule import TileSchedule

    sched = TileSchedule(512, 512, 128, 64, causal=True)
    for cta, reverse in zip(flash2_grid(sched, 1), flash2_grid(sched, 1, kv_descending=True)):
        forward = [flash2_program(sched, cta, 64, 2).stream(t) for t in range(cta.n_steps)]
        backward = [flash2_program(sched, reverse, 64, 2, kv_descending=True).stream(t) for t in range(cta.n_steps)]
        assert backward == forward[::-1] and backward[0][0].key == ("K", 0, 64 * (cta.n_steps - 1))
        assert reverse.cohort == (0, cta.n_steps)
    sdpa = predict("fa2", 4096, 128, heads=4, causal=True, kernel="sdpa_flash").kernels[0]
    ours = predict("fa2", 4096, 128, heads=4, causal=True).kernels[0]
    assert (sdpa.logical_read_bytes, sdpa.logical_write_bytes) == (ours.logical_read_bytes, ours.logical_write_bytes)


def test_lock_step_waves_reread_kv_that_outgrows_the_l2():
    """One head's K + V (64 MiB at N = 131072, d = 128) does not fit: every wave of 132 CTAs streams it
    from DRAM again (ncu measured 545 MiB of reads on the H200 for this kernel)."""
    p = predict("fa2", 131072, 128, heads=1).kernel("flash2_forward")
    waves = -(-1024 // 132)
    assert p.dram_read_bytes == pytest.approx(32 * MiB + waves * 64 * MiB, rel=0.02)
    small = predict("fa2", 4096, 128, heads=32).kernel("flash2_forward")
    # Q, K, V once: the re-reads hit, all but 48 KiB (ncu measured 96.07 MiB cold, 96.16 warm)
    assert 96 * MiB <= small.dram_read_bytes <= 96.1 * MiB


def test_lecture_example_moving_s_and_p_at_3_tb_per_s():
    """~90 µs per head to move the 128 MiB of S and the 128 MiB of P at N = 8192, bf16, ~3 TB/s."""
    traffic = sf.model.naive_traffic(8192, 128, "bfloat16")
    moved = traffic.by_tensor["S"].write_bytes + traffic.by_tensor["P"].write_bytes
    assert moved == 256 * MiB
    assert sf.model.physical.dram_seconds(moved, 3e12) == pytest.approx(89.5e-6, abs=0.1e-6)


def test_predict_refuses_bad_input():
    with pytest.raises(ValueError, match="algorithm"):
        predict("fa3")
    with pytest.raises(ValueError, match="cache"):
        predict(cache="hot")
    with pytest.raises(ValueError, match="causal"):
        predict(causal="no")
    with pytest.raises(ValueError, match="heads"):
        predict(heads=0)
    with pytest.raises(ValueError, match="block_q=128 and block_kv=64 at d=256, 4-byte elements need 393216 bytes"):
        predict("fa2", 2048, 256, dtype="float32")
    with pytest.raises(ValueError, match="schedule"):
        sf.flash_attention(*_inputs(0, 1, 8, 8, 8), schedule="parallel")


def test_validation_records_match_the_model_and_the_docs():
    """The committed validation reports (the eleven sweeps) are what the model predicts now, and the docs
    show their tables."""
    import json
    from pathlib import Path

    from simflash.model.calibration import REPORTS, markdown

    root = Path(__file__).resolve().parents[1]
    reports = [json.loads((root / "benchmarks/gpu" / name).read_text()) for name in REPORTS.values()]
    docs = (root / "docs/physical.md").read_text()
    assert all(markdown(report) in docs for report in reports)
    assert [{row["subset"] for row in report["rows"]} for report in reports] == [
        {"fit", "held-out"}, {"validation"}, {"unseen"}, {"blind"}, {"confirm"}, {"fresh"}, {"recheck"}, {"verify"},
        {"splitkv"}, {"later"}, {"lead"}]
    quick = [r for report in reports for r in report["rows"]
             if r["config"]["n"] * r["config"]["heads"] <= 8192 and not r["config"]["causal"]]
    assert len(quick) >= 20
    for row in quick[::len(quick) // 12]:
        c = row["config"]
        algorithm = "naive" if c["algorithm"] == "naive" else "fa2"
        kernel = {"naive": "simflash", "fa2": "simflash", "sdpa_flash": "sdpa_flash"}[c["algorithm"]]
        p = predict(algorithm, c["n"], c["d"], heads=c["heads"], causal=c["causal"], cache=row["cache"],
                    kernel=kernel).kernel(row["kernel"])
        assert (p.dram_read_bytes, p.dram_write_bytes, p.time_s) == (
            row["predicted"]["dram_read_bytes"], row["predicted"]["dram_write_bytes"], row["predicted"]["time_s"])


def test_a_cohort_streaming_with_values_reads_as_one_with_a_count():
    """Two CTAs of one cohort, with values: where both only stream (step 1), their reads of K_1 reach the L2 as
    one read of count 2, held at the cohort weight (as a traffic-only run plays them); where they start (step
    0) one after the other, K_0 held whole. Members that stream different blocks are an error."""
    from simflash.grid import CTA, run_bodies

    class Machine:
        l2 = L2Cache(capacity_bytes=1000, cohort_weight=0.5)

    def body(cta, keys):
        for step in range(cta.n_steps):
            Machine.l2.read(("K", 0, keys[step]), 10)
            yield None

    ctas = [CTA((i,), n_steps=2, cohort=(0, 0)) for i in range(2)]
    Machine.l2.kernel = "k"
    list(run_bodies({cta: (lambda cta=cta: body(cta, (0, 1))) for cta in ctas}, 2, Machine))
    assert isinstance(Machine.l2, L2Cache)
    assert (Machine.l2._blocks["K", 0, 0][2], Machine.l2._blocks["K", 0, 1][2]) == (10, 5)
    flow = Machine.l2.traffic().ledger["k", "K"]
    assert (flow.read_bytes, flow.dram_read_bytes) == (40, 20)
    bodies = {cta: (lambda cta=cta: body(cta, (0, cta.index[0] + 1))) for cta in ctas}
    with pytest.raises(RuntimeError, match="streamed different blocks at step 1"):
        list(run_bodies(bodies, 2, Machine))


@pytest.mark.parametrize("slots", [1, 3])
def test_each_cta_body_starts_once_and_runs_its_steps(slots):
    from simflash.grid import CTA, run_bodies

    started = []

    def body(cta):
        started.append(cta.index)
        for step in range(cta.n_steps):
            yield (cta.index, step)

    ctas = [CTA((i,), n_steps=i % 3 + 1, cohort=(0, i % 2)) for i in range(7)]
    yielded = list(run_bodies({cta: (lambda cta=cta: body(cta)) for cta in ctas}, slots))
    assert sorted(started) == [cta.index for cta in ctas]
    assert sorted(yielded) == sorted((cta.index, s) for cta in ctas for s in range(cta.n_steps))


def test_naive_time_figures_come_out_of_their_fit():
    """The machine file's naive-path time figures are what `fit_naive_time` computes from the committed
    cold sweep (fit set only), to the four digits written there."""
    import json
    from pathlib import Path

    from simflash.model.calibration import NAIVE_TIME_KEYS, fit_naive_time

    sweep = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/gpu/calibration_cold.json").read_text())
    fitted = fit_naive_time(sweep)
    for key in NAIVE_TIME_KEYS:
        assert sf.GPUS["H200"].calibration[key] == pytest.approx(fitted[key], rel=2e-3), key


def test_tensor_efficiencies_come_out_of_their_fit():
    """Each FA-2 kernel's achieved tensor-core share in the machine file is what `fit_tensor_efficiency`
    computes from the committed calibration sweep (fit set, CUDA-event times), to the digits written."""
    import json
    from pathlib import Path

    from simflash.model.calibration import fit_tensor_efficiency

    root = Path(__file__).resolve().parents[1] / "benchmarks/gpu"
    sweep, times = (json.loads((root / f"calibration_{name}.json").read_text()) for name in ("cold", "time"))
    for kernel in ("simflash", "sdpa_flash"):
        fitted = fit_tensor_efficiency(sweep, times, kernel)
        assert sf.GPUS["H200"].calibration[f"tensor_efficiency_{kernel}"] == pytest.approx(fitted, rel=5e-4), kernel


def test_a_partial_last_wave_has_an_sm_per_cta():
    """N = 106,496, d = 64, one head: 832 CTAs on 264 slots (two an SM) are three full waves and 40 CTAs
    that run alone on their SMs. A wave is 1,664 KV tiles and the epilogue; the busiest SM works through
    two CTAs' steps at each of the full waves' time steps and one at the last's."""
    p = predict("fa2", 106496, 64).kernels[0]
    wave = 106496 // 64 + 1
    assert (p.ctas, p.resident_ctas) == (832, 264)
    assert (p.makespan_steps, p.busiest_sm_steps) == (4 * wave, (2 * 3 + 1) * wave)


def test_reread_floors_come_out_of_their_fit():
    """SDPA's re-read floors in the machine file are what `fit_reread_floor` computes from the committed
    calibration sweep (fit set with the mask, cold and warm); a prediction of its causal grid in several waves
    reads at least Q, K and V once and the floor's share of the rest, one of a single wave and simflash's kernel
    as the L2 model has them."""
    import json
    from pathlib import Path

    from simflash.model.calibration import fit_reread_floor, without_figures
    from simflash.model.physical import first_read_bytes
    from simflash.schedule import TileSchedule

    root = Path(__file__).resolve().parents[1] / "benchmarks/gpu"
    fitted = fit_reread_floor([json.loads((root / f"calibration_{mode}.json").read_text()) for mode in ("cold", "warm")])
    spec = sf.GPUS["H200"]
    written = {k: v for k, v in spec.calibration.items() if k.startswith("reread_floor_")}
    assert sorted(written) == sorted(fitted) == ["reread_floor_sdpa_flash_d128_causal", "reread_floor_sdpa_flash_d64_causal"]
    for key, value in fitted.items():
        assert written[key] == pytest.approx(value, abs=1e-6), key
    floor = written["reread_floor_sdpa_flash_d128_causal"]
    bare = without_figures(spec, "reread_floor_")
    waves = predict("fa2", 8192, 128, heads=64, causal=True, kernel="sdpa_flash").kernels[0]
    without = predict("fa2", 8192, 128, heads=64, causal=True, kernel="sdpa_flash", gpu=bare).kernels[0]
    first = first_read_bytes(TileSchedule(8192, 8192, 128, 64, causal=True), 64, 128, 2)
    assert first == 3 * 8192 * 128 * 2 * 64 and waves.ctas > waves.resident_ctas
    assert without.dram_read_bytes < first + floor * (without.logical_read_bytes - first)  # the floor binds here
    assert waves.dram_read_bytes == first + round(floor * (waves.logical_read_bytes - first))
    assert waves.l2_hit_bytes + waves.dram_read_bytes == without.l2_hit_bytes + without.dram_read_bytes
    one_wave = dict(n=16384, d=128, heads=1, causal=True, kernel="sdpa_flash")
    assert predict("fa2", **one_wave).kernels[0] == predict("fa2", **one_wave, gpu=bare).kernels[0]
    simflash_kernel = dict(n=8192, d=128, heads=64, causal=True)
    assert predict("fa2", **simflash_kernel).kernels[0] == predict("fa2", **simflash_kernel, gpu=bare).kernels[0]


def test_spill_write_figures_come_out_of_their_fit():
    """SDPA's spill figures in the machine file are what `fit_spill_writes` computes from the committed
    calibration sweep (fit set, cold and warm), to the four digits written there; and a prediction's
    DRAM writes carry them (simflash's kernel has none)."""
    import json
    from pathlib import Path

    from simflash.model.calibration import fit_spill_writes

    root = Path(__file__).resolve().parents[1] / "benchmarks/gpu"
    fitted = fit_spill_writes([json.loads((root / f"calibration_{mode}.json").read_text()) for mode in ("cold", "warm")])
    written = {k: v for k, v in sf.GPUS["H200"].calibration.items() if k.startswith("spill_")}
    assert sorted(written) == sorted(fitted) and len(fitted) == 8
    for key, value in fitted.items():
        assert written[key] == pytest.approx(value, rel=2e-3), key
    sdpa = predict("fa2", 4096, 128, heads=32, kernel="sdpa_flash").kernels[0]
    ctas, steps = 32 * 32, 32 * 32 * 64
    assert sdpa.spill_write_bytes == round(written["spill_sdpa_flash_d128_cta_bytes"] * ctas
                                           + written["spill_sdpa_flash_d128_step_bytes"] * steps)
    assert predict("fa2", 4096, 128, heads=32).kernels[0].spill_write_bytes == 0
    unfitted = predict("fa2", 1024, 96, heads=16, kernel="sdpa_flash", causal=True)
    assert unfitted.kernels[0].spill_write_bytes == 0 and "no spill figures for sdpa_flash at d=96 causal" in unfitted.notes[0]
    assert predict("fa2", 1024, 128, heads=16, kernel="sdpa_flash").notes == ()
    other_tiles = predict("fa2", 1024, 128, heads=16, kernel="sdpa_flash", block_kv=128)
    assert other_tiles.kernels[0].spill_write_bytes == 0 and "its own tiles (128x64)" in other_tiles.notes[0]


def test_sdpa_s_causal_grids_of_several_waves_carry_the_diagonal_reuse_note():
    several_waves = predict("fa2", 4096, 128, heads=32, causal=True, kernel="sdpa_flash")  # 1024 CTAs, 264 slots
    assert several_waves.kernels[0].ctas > several_waves.kernels[0].resident_ctas
    assert any("from its diagonal down" in note for note in several_waves.notes)
    one_wave = predict("fa2", 4096, 128, heads=4, causal=True, kernel="sdpa_flash")  # 128 CTAs
    assert one_wave.kernels[0].ctas <= one_wave.kernels[0].resident_ctas and one_wave.notes == ()
    assert predict("fa2", 4096, 128, heads=32, kernel="sdpa_flash").notes == ()  # no mask: cohorts share each read
    assert predict("fa2", 4096, 128, heads=32, causal=True).notes == ()  # simflash's kernel walks from the first tile


def test_naive_predictions_say_where_cublas_does_what_the_model_does_not():
    """At element sizes other than 16 bits, where K has more than one group of keys, the Q K GEMM's reads carry
    a note (its walk was measured at fp16); at 16 bits, where S outgrows the L2's effective capacity, its writes
    do (cuBLAS's kernel family); warm, from 8 MiB of P in all, the P V GEMM's writes do."""
    assert predict("naive", 2048, 128, heads=1).notes == ()  # 8 MiB of S
    (family,) = predict("naive", 8192, 128, heads=1, dtype="bfloat16").notes  # 128 MiB
    assert family.startswith("gemm_qk's DRAM writes") and "_TNN 26.1" in family
    assert predict("naive", 4096, 128, heads=1, causal=True).notes == ()  # 16 MiB of the 32 stored
    assert predict("naive", 4096, 128, heads=1).notes == (family,)  # 32 MiB
    (qk,) = predict("naive", 512, 128, n_kv=4096, heads=1, dtype="float32").notes
    assert qk.startswith("gemm_qk reads Q's tiles again once a group of 2,048 keys")
    assert predict("naive", 512, 128, n_kv=2048, heads=1, dtype="float32").notes == ()  # K of one group
    assert predict("naive", 256, 128, heads=8, cache="warm").notes == ()  # 1 MiB of P
    (pv,) = predict("naive", 1024, 128, heads=8, cache="warm").notes  # 16 MiB of P
    assert pv.startswith("gemm_pv's warm DRAM writes") and "135 of the sweeps' 224" in pv
    assert predict("naive", 1024, 128, heads=8, cache="cold").notes == ()
    assert predict("naive", 4096, 128, heads=1, cache="warm", dtype="float32").notes == (qk, pv)


def test_naive_predictions_run_on_every_machine_file():
    """Machine files without fitted L2 figures predict with the nameplate L2 (an LRU of its size), notes and all:
    at N = 4096 one head's 32 MiB of S outgrow the H200's 28.5 MiB effective capacity but not the A100's 40 MiB."""
    notes = {gpu: predict("naive", 4096, 128, heads=1, gpu=gpu).notes for gpu in sf.GPUS}
    assert set(notes) >= {"A100", "H100", "H200", "B200"}
    assert any("_TNN" in note for note in notes["H200"]) and not any("_TNN" in note for note in notes["A100"])


def test_the_q_k_gemm_walks_groups_of_keys_and_reads_q_again_once_a_group():
    """K of 4,096 keys is two groups: the GEMM's units are every query tile of group 0, then of group 1 backwards;
    the reads again (Q's tiles in group 1, K's tiles after a group's first unit) reach the L2, not the ledger, whose
    reads are Q and K once; S is written in (rows, group) pieces the softmax reads, all of them once."""
    from simflash.algorithms.naive import naive_grid, naive_program
    from simflash.schedule import TileSchedule

    sched = TileSchedule(512, 4096, 512, 4096)
    (cta,) = naive_grid("gemm_qk", sched, 1, 2, 0)
    program = naive_program("gemm_qk", sched, cta, 128, 2, 0)
    accesses = [a for t in range(cta.n_steps) for a in program.stream(t)]
    queries = [a.key[2] for a in accesses if a.key[0] == "Q"]
    assert queries == [0, 128, 256, 384, 384, 256, 128, 0]
    first = {t: sum(a.nbytes for a in accesses if a.key[0] == t and not a.again and not a.write) for t in "QK"}
    assert first == {"Q": 512 * 128 * 2, "K": 4096 * 128 * 2}
    assert sum(a.nbytes for a in accesses if a.key[0] == "K" and a.again) == 3 * 4096 * 128 * 2  # 4 units a group
    written = sorted((a.key, a.nbytes) for a in accesses if a.write)
    (softmax,) = naive_grid("softmax", sched, 1, 2, 0)
    scores = naive_program("softmax", sched, softmax, 128, 2, 0)
    read = sorted((a.key, a.nbytes) for t in range(softmax.n_steps) for a in scores.stream(t) if a.key[0] == "S")
    assert written == read and sum(n for _, n in written) == 512 * 4096 * 2
    prediction = predict("naive", 512, 128, n_kv=4096, heads=1).kernel("gemm_qk")
    assert prediction.logical_read_bytes == (512 + 4096) * 128 * 2


def test_the_pv_gemm_walks_p_a_column_chunk_at_a_time_and_writes_o_a_wave_at_a_time():
    """N = 1024, d = 128, fp16: rows of S stream in blocks of 128, P's columns in chunks of 512. With waves of
    512 rows of O, the P V GEMM's CTA takes a step per (wave, chunk): it reads that chunk of every row block of
    the wave (the first wave with the chunk of V), and writes the wave's four blocks of O at its last chunk
    (steps 1 and 3), 1024 x 128 x 2 bytes in all; a wave of 132 x 256 rows holds 33 such heads side by side."""
    from simflash.algorithms.naive import block_rows, gemm_pv_heads_at_once, naive_grid, naive_program
    from simflash.chip import gemm_pv_wave_rows
    from simflash.schedule import TileSchedule

    sched = TileSchedule(1024, 1024, 1024, 1024)
    assert block_rows(1024, 2) == 128
    (cta,) = naive_grid("gemm_pv", sched, 1, 2, wave_rows=512)
    assert cta.n_steps == 4
    program = naive_program("gemm_pv", sched, cta, 128, 2, wave_rows=512)
    writes = {step: [a for a in program.stream(step) if a.write] for step in range(cta.n_steps)}
    assert [step for step, w in writes.items() if w] == [1, 3]
    assert [len(writes[1]), len(writes[3])] == [4, 4]
    assert sum(a.nbytes for w in writes.values() for a in w) == 1024 * 128 * 2
    assert [a.key for a in program.stream(0)] == [("V", 0, 0)] + [("P", 0, r, 0) for r in (0, 128, 256, 384)]
    assert [a.shared for a in program.stream(0)] == [True] + [False] * 4  # every CTA of the wave reads V's chunk
    assert [a.key for a in program.stream(2)] == [("P", 0, r, 0) for r in (512, 640, 768, 896)]
    assert all(a.nbytes == 128 * 512 * 2 for a in program.stream(2))
    assert gemm_pv_wave_rows(sf.GPUS["H200"]) == 132 * 256
    assert gemm_pv_heads_at_once(sched, 132 * 256) == 132 * 256 // 1024


def test_a_head_shorter_than_a_cohort_of_pv_ctas_reads_v_as_a_stream(monkeypatch):
    """A head's chunk of V is a cohort's read (shared) once its rows fill PV_SHARED_V_TILES of the P V GEMM's
    tiles (4 x 256 rows): at N = 512 its two CTAs read it as a stream, like P, at N = 1,024 as a cohort. Read as
    a stream it holds a read fill's share of the L2, so more of O stays dirty there: with 256 heads of N = 256
    the GEMM writes back less, cold, than if V held a cohort's share."""
    from simflash.algorithms import naive
    from simflash.algorithms.naive import GEMM_TILE_ROWS, PV_SHARED_V_TILES, naive_grid, naive_program, v_shared
    from simflash.schedule import TileSchedule

    assert PV_SHARED_V_TILES * GEMM_TILE_ROWS == 1024
    for n, shared in ((512, False), (1023, False), (1024, True)):
        sched = TileSchedule(n, n, n, n)
        (cta,) = naive_grid("gemm_pv", sched, 1, 2, wave_rows=132 * 256)
        v = naive_program("gemm_pv", sched, cta, 128, 2, wave_rows=132 * 256).stream(0)[0]
        assert v.key[0] == "V" and v.shared is shared is v_shared(sched)

    def pv_writes() -> int:
        return predict("naive", 256, 128, heads=256, cache="cold").kernel("gemm_pv").dram_write_bytes

    streamed = pv_writes()
    monkeypatch.setattr(naive, "PV_SHARED_V_TILES", 1)
    assert streamed < pv_writes() - 2 * MiB


def test_the_softmax_writes_p_in_the_pieces_the_pv_gemm_reads_and_the_mask_leaves_out_empty_ones():
    """Causal, N = 1024, fp16: row block 0 (rows 0-127) stores entries only in column chunk 0, so the softmax
    writes one piece there; row block 7 (rows 896-1023) two. The pieces the P V GEMM reads are those written,
    with the same bytes, and their sum is the lower triangle's."""
    from simflash.algorithms.naive import naive_grid, naive_program
    from simflash.schedule import TileSchedule

    sched = TileSchedule(1024, 1024, 1024, 1024, causal=True)
    (softmax,) = naive_grid("softmax", sched, 1, 2, wave_rows=33792)
    written = [a for t in range(softmax.n_steps) for a in naive_program("softmax", sched, softmax, 128, 2, 33792).stream(t)
               if a.write]
    assert [a.key for a in written if a.key[2] == 0] == [("P", 0, 0, 0)]
    assert [a.key for a in written if a.key[2] == 896] == [("P", 0, 896, 0), ("P", 0, 896, 512)]
    (pv,) = naive_grid("gemm_pv", sched, 1, 2, wave_rows=33792)
    program = naive_program("gemm_pv", sched, pv, 128, 2, 33792)
    read = [a for t in range(pv.n_steps) for a in program.stream(t) if not a.write and a.key[0] == "P"]
    assert sorted((a.key, a.nbytes) for a in read) == sorted((a.key, a.nbytes) for a in written)
    assert sum(a.nbytes for a in read) == 1024 * 1025 // 2 * 2


def test_the_softmax_writes_trail_its_reads_by_the_rows_resident_at_once():
    """Each CTA of the naive softmax reads its row of S whole, then writes its row of P, so P goes out the rows
    resident at once after S comes in: 1,056 on the H200 (8 CTAs of 256 threads an SM), fewer once a row's
    shared memory limits them, and a row that fits no CTA is refused. At N = 2048 in fp16 (blocks of 64 rows),
    16 blocks later: the head's first 16 steps only read, its last 16 only write."""
    from simflash.algorithms.naive import naive_grid, naive_program
    from simflash.chip import softmax_resident_rows
    from simflash.schedule import TileSchedule

    h200 = sf.GPUS["H200"]
    assert [softmax_resident_rows(h200, n, 2) for n in (256, 8192, 14000, 16384, 65536)] == [1056] * 3 + [792, 132]
    with pytest.raises(ValueError, match="n_kv=131072: the naive softmax holds a row of S in shared memory"):
        softmax_resident_rows(h200, 131072, 2)
    sched = TileSchedule(2048, 2048, 2048, 2048)
    (cta,) = naive_grid("softmax", sched, 1, 2, 0, softmax_rows=1056)
    program = naive_program("softmax", sched, cta, 128, 2, 0, softmax_rows=1056)
    assert cta.n_steps == 32 + 16
    steps = [program.stream(t) for t in range(cta.n_steps)]
    read = [{a.key[2] for a in step if not a.write} for step in steps]
    written = [{a.key[2] for a in step if a.write} for step in steps]
    assert read == [{64 * t} for t in range(32)] + [set()] * 16
    assert written == [set()] * 16 + [{64 * t} for t in range(32)]
    (at_once,) = naive_grid("softmax", sched, 1, 2, 0)
    assert at_once.n_steps == 32 and all(a.key[2] == 0 for a in naive_program("softmax", sched, at_once, 128, 2, 0
                                                                               ).stream(0))


def test_pytorch_s_small_grids_are_split_kv_as_ncu_measured():
    """PyTorch runs a grid of fewer than 0.8 x 2 x SMs query tiles of 64 rows split-KV (measured on the H200:
    benchmarks/gpu/sdpa_kv_order/floor.json, N = 2048 to 8192, one head): the split kernel reads Q, K and V
    once and leaves its fp32 partials in the L2, the combine reads them back from DRAM (cold). Larger grids
    run the plain kernel."""
    import json
    from pathlib import Path

    floor = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "sdpa_kv_order" / "floor.json"
    split = 0
    for row in json.loads(floor.read_text())["configs"]:
        c = row["config"]
        if c["algorithm"] != "sdpa_flash":
            continue
        predicted = predict("fa2", c["n"], c["d"], heads=c["heads"], causal=c["causal"], kernel="sdpa_flash").kernels
        if len(row["kernels"]) == 1:
            assert [k.kernel for k in predicted] == ["flash2_forward"]
            continue
        split += 1
        assert [k.kernel for k in predicted] == ["flash_decoding_split", "flash_decoding_combine"]
        for k, measured in zip(predicted, row["kernels"]):
            assert k.dram_read_bytes == pytest.approx(measured["dram_read_bytes"], rel=0.05)
            assert abs(k.dram_write_bytes - measured["dram_write_bytes"]) <= MiB
    assert split == 5


def test_two_long_ctas_that_start_on_one_sm_share_it_to_the_end():
    """Slots 0..3 on 2 SMs (slot i on SM i mod 2): CTAs of 4, 1, 4 and 1 steps put both long ones on SM 0.
    Each holds its slot for its steps and its epilogue: 2 time steps with two CTAs on every SM, then 3
    with both long CTAs on SM 0 (10 CTA-steps on the busiest SM, where spreading them would give 7); a
    freed slot's next CTA starts on the same SM."""
    from simflash.model.physical import busiest_sm_steps

    assert busiest_sm_steps([4, 1, 4, 1], slots=4, sm_count=2) == 2 * 2 + 2 * 3
    assert busiest_sm_steps([4, 4, 1, 1], slots=4, sm_count=2) == 2 * 2 + 1 * 3
    # one slot an SM: two CTAs of 1 step (2 time steps), then two of 3 (4), then one of 0 (its epilogue)
    assert busiest_sm_steps([1, 1, 3, 3, 0], slots=2, sm_count=2) == 2 + 4 + 1
