"""Grouped-query heads (pack_gqa off and on) and sliding windows: schedule from the definition, bytes and
FLOPs equal to the closed forms, outputs against the float64 reference, and hand-counted examples."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simflash as sf
from simflash.config import STORAGE_DTYPES
from simflash.numerics import RELATIVE_TOLERANCE, fa_rule, reference_attention, reference_mask, relative_error

windows = st.tuples(st.integers(-1, 12), st.integers(-1, 12))


@given(n_q=st.integers(1, 30), n_kv=st.integers(1, 30), block_q=st.integers(1, 10), block_kv=st.integers(1, 10),
       causal=st.booleans(), variant=st.sampled_from(["upper_left", "lower_right"]), window=windows,
       pack=st.integers(1, 4))
def test_schedule_agrees_with_the_windowed_element_mask(n_q, n_kv, block_q, block_kv, causal, variant, window, pack):
    """Packed row p is position p // pack; a tile is skipped iff its block of the reference mask (rows
    repeated per packed head) is all False, masked iff mixed, full iff all True."""
    if causal and window[1] > 0:
        window = (window[0], 0)
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal, variant, window=window, pack=pack)
    packed_mask = np.repeat(reference_mask(n_q, n_kv, causal, variant, window), pack, axis=0)  # (n_q pack, n_kv)
    for i in range(-(-n_q * pack // block_q)):
        rows = np.arange(n_q * pack)[i * block_q:(i + 1) * block_q]
        visited = set(sched.kv_tiles(i))
        for j in range(-(-n_kv // block_kv)):
            block = packed_mask[np.ix_(rows, np.arange(n_kv)[j * block_kv:(j + 1) * block_kv])]
            expected = "skipped" if not block.any() else "full" if block.all() else "masked"
            assert sched.tile_kind(i, j) == expected
            assert (j in visited) == (expected != "skipped")
            if expected != "skipped":
                assert np.array_equal(sched.mask(i, j), block)


def _inputs(seed, batch, h_q, h_kv, n_q, n_kv, d):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, h_q, n_q, d)), rng.standard_normal((batch, h_kv, n_kv, d)),
            rng.standard_normal((batch, h_kv, n_kv, d)))


@given(n_q=st.integers(1, 24), n_kv=st.integers(1, 24), d=st.sampled_from([1, 4, 8]), block_q=st.integers(1, 10),
       block_kv=st.integers(1, 10), batch=st.integers(1, 2), h_kv=st.integers(1, 2), group=st.integers(1, 3),
       causal=st.booleans(), causal_variant=st.sampled_from(["upper_left", "lower_right"]), window=windows,
       variant=st.sampled_from(["naive", "fa1", "fa2"]), pack_gqa=st.booleans(),
       dtype=st.sampled_from(sorted(STORAGE_DTYPES)), seed=st.integers(0, 2**32 - 1))
def test_bytes_and_flops_equal_the_closed_forms_and_outputs_the_reference(
        n_q, n_kv, d, block_q, block_kv, batch, h_kv, group, causal, causal_variant, window, variant, pack_gqa,
        dtype, seed):
    if causal and window[1] > 0:
        window = (window[0], 0)
    q, k, v = _inputs(seed, batch, h_kv * group, h_kv, n_q, n_kv, d)
    heads, kv_heads = batch * h_kv * group, batch * h_kv
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype, window=window)
    naive = sf.naive_attention(q, k, v, **kw)
    if variant == "naive":
        run = naive
        model = sf.model.naive_traffic(n_q, d, dtype, causal, n_kv=n_kv, heads=heads, kv_heads=kv_heads,
                                       causal_variant=causal_variant, window=window)
        flops = sf.model.flops_by_kind(n_q, d, "naive", causal, n_kv=n_kv, heads=heads, kv_heads=kv_heads,
                                       causal_variant=causal_variant, window=window)
    else:
        run = sf.flash_attention(q, k, v, block_q, block_kv, variant=variant, trace="none", pack_gqa=pack_gqa, **kw)
        model = sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, variant, n_kv=n_kv, heads=heads,
                                       causal_variant=causal_variant, window=window, kv_heads=kv_heads,
                                       pack_gqa=pack_gqa)
        flops = sf.model.flops_by_kind(n_q, d, variant, causal, block_q, block_kv, n_kv=n_kv, heads=heads,
                                       causal_variant=causal_variant, window=window, kv_heads=kv_heads,
                                       pack_gqa=pack_gqa)
    assert dict(run.traffic.ledger) == dict(model.ledger)
    assert run.flops_by_kind == flops
    assert run.out.shape == q.shape and run.out.dtype == STORAGE_DTYPES[dtype]

    ref = reference_attention(q, k, v, **kw)
    out = run.out.astype(np.float64)
    assert np.isfinite(out).all()
    if dtype == "float32":
        assert relative_error(out, ref) <= RELATIVE_TOLERANCE[dtype]
    elif variant == "fa2":
        assert fa_rule(out, naive.out, ref, sf.numerics.upcast(v, dtype))
    visible_rows = reference_mask(n_q, n_kv, causal, causal_variant, window).any(axis=1)
    assert not out[..., ~visible_rows, :].any()  # a row that sees no key outputs 0


@pytest.mark.parametrize("causal", [False, True])
def test_packing_a_group_changes_only_which_tiles_are_read(causal):
    """FA-2: a packed tile visits the union of its rows' KV tiles; a row's extra visits see only -inf
    scores (alpha = 1, P = 0), so every output is the unpacked one, to the last bit but for the order in
    which the machine's BLAS sums a row's products (which may change with the rows beside it in a tile):
    one float32 rounding of a score, one fp16 rounding of P."""
    q, k, v = _inputs(7, 2, 8, 2, 37, 53, 16)
    kw = dict(block_q=16, block_kv=8, causal=causal, window=(20, 0 if causal else 5), trace="none",
              write_logsumexp=True)
    unpacked = sf.flash_attention(q, k, v, **kw)
    packed = sf.flash_attention(q, k, v, pack_gqa=True, **kw)
    np.testing.assert_allclose(packed.out, unpacked.out, rtol=0, atol=2**-8)
    np.testing.assert_allclose(packed.logsumexp, unpacked.logsumexp, rtol=4 * np.finfo(np.float32).eps)


def test_decode_reads_each_kv_head_once_when_packed():
    """One query token, 32 query heads on 8 K/V heads, 4096 keys, d = 128, fp16: unpacked, each query
    head's CTA reads its group's K and V (32 x 4096 x 128 x 2 bytes each); packed, the 4 heads of a group
    fill 4 rows of one tile and K, V are read once per K/V head."""
    kv_bytes = 4096 * 128 * 2
    unpacked = sf.model.flash_traffic(1, 128, 128, 64, n_kv=4096, heads=32, kv_heads=8)
    packed = sf.model.flash_traffic(1, 128, 128, 64, n_kv=4096, heads=32, kv_heads=8, pack_gqa=True)
    assert unpacked.by_tensor["K"].read_bytes == 32 * kv_bytes
    assert packed.by_tensor["K"].read_bytes == 8 * kv_bytes
    assert packed.by_tensor["Q"].read_bytes == unpacked.by_tensor["Q"].read_bytes == 32 * 128 * 2
    assert packed.by_tensor["O"].write_bytes == 32 * 128 * 2


def test_sliding_window_reads_a_band_of_kv_tiles():
    """N = 4096, causal with 256 keys of history, B_r = 128, B_c = 64: query tile i (rows 128i .. 128i + 127)
    sees keys 128i - 256 .. 128i + 127, KV tiles 2i - 4 .. 2i + 1: 2, 4, then 6 tiles per query tile."""
    traffic = sf.model.flash_traffic(4096, 128, causal=True, window=(256, -1))
    tiles = 2 + 4 + 6 * (32 - 2)
    assert traffic.by_tensor["K"].read_bytes == tiles * 64 * 128 * 2
    assert sf.model.kv_passes(4096, causal=True, window=(256, -1)) == tiles * 64 / 4096
    # the band of S the naive path stores: row r keeps min(r, 256) + 1 keys
    naive = sf.model.naive_traffic(4096, 128, causal=True, window=(256, -1))
    assert naive.by_tensor["S"].write_bytes == sum(min(r, 256) + 1 for r in range(4096)) * 2


def test_window_wider_than_the_sequence_is_the_unbounded_run():
    q, k, v = _inputs(3, 1, 2, 2, 20, 20, 8)
    wide = sf.flash_attention(q, k, v, 8, 4, causal=True, window=(100, -1), trace="none")
    plain = sf.flash_attention(q, k, v, 8, 4, causal=True, trace="none")
    np.testing.assert_array_equal(wide.out, plain.out)
    assert wide.traffic.ledger == plain.traffic.ledger


def test_gqa_and_window_in_the_trace_config_and_its_file(tmp_path):
    q, k, v = _inputs(5, 1, 4, 2, 12, 12, 4)
    run = sf.flash_attention(q, k, v, 8, 4, causal=True, window=(5, 0), pack_gqa=True, trace="full")
    assert run.trace.config["window"] == (5, 0) and run.trace.config["pack_gqa"] is True
    assert run.trace.config["kv_heads"] == 2
    assert {step.head for step in run.trace} == {0, 1}  # packed: steps are indexed by K/V group
    assert max(step.row_start for step in run.trace) == 16  # 24 packed rows in tiles of 8
    path = tmp_path / "gqa.json"
    run.trace.save(path)
    loaded = sf.Trace.load(path)
    assert len(loaded.steps) == len(run.trace.steps)
    for a, b in zip(loaded, run.trace):
        np.testing.assert_array_equal(a.a, b.a)
