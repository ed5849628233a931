"""Flash-Decoding: bytes and FLOPs of the simulation equal the closed forms, outputs match the float64
reference built per batch element on its valid keys, FA-2's split heuristic, the launch, the trace and
its files, and bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simflash as sf
from simflash.algorithms.flash_decoding_combine import combine_grid
from simflash.algorithms.flash_decoding_split import split_grid
from simflash.config import STORAGE_DTYPES, gpu_spec
from simflash.model.decode import default_block_kv, num_splits_heuristic, predict_decode, split_efficiencies
from simflash.numerics import (
    RELATIVE_TOLERANCE,
    fa_rule,
    max_abs_error,
    reference_attention,
    relative_error,
    upcast,
)
from simflash.schedule import SplitSchedule
from simflash.trace_diff import trace_differences


def _inputs(seed, batch, h_q, h_kv, n_q, n_kv, d):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, h_q, n_q, d)), rng.standard_normal((batch, h_kv, n_kv, d)),
            rng.standard_normal((batch, h_kv, n_kv, d)))


def _per_batch(attention, q, k, v, seqlens, **kw):
    """`attention` of each batch element on its valid keys, causal and window bottom-right aligned."""
    return np.stack([np.asarray(attention(q[b], k[b, :, :n], v[b, :, :n], causal_variant="lower_right", **kw),
                                dtype=np.float64) for b, n in enumerate(seqlens)])


def _closed_forms(run, batch, h_q, h_kv, n_q, n_kv, d, **kw):
    shape = dict(batch=batch, heads=h_q, kv_heads=h_kv, n_q=n_q, num_splits=run.decode.num_splits,
                 block_kv=run.decode.block_kv, **kw)
    return sf.model.flash_decoding_traffic(n_kv, d, dtype=run.config.dtype, **shape), \
        sf.model.flash_decoding_flops(n_kv, d, **shape)


windows = st.tuples(st.integers(-1, 12), st.integers(-1, 12))


@given(batch=st.integers(1, 3), h_kv=st.integers(1, 2), group=st.integers(1, 4), n_q=st.integers(1, 20),
       n_kv=st.integers(1, 40), d=st.sampled_from([1, 4, 8]), block_kv=st.integers(1, 12), data=st.data(),
       pack_gqa=st.booleans(), causal=st.booleans(), window=windows, dtype=st.sampled_from(sorted(STORAGE_DTYPES)),
       seed=st.integers(0, 2**32 - 1))
def test_bytes_and_flops_equal_the_closed_forms_and_outputs_the_reference(
        batch, h_kv, group, n_q, n_kv, d, block_kv, data, pack_gqa, causal, window, dtype, seed):
    if causal and window[1] > 0:
        window = (window[0], 0)
    kv_tiles = -(-n_kv // block_kv)
    num_splits = data.draw(st.one_of(st.none(), st.integers(1, kv_tiles)), label="num_splits")
    ragged = data.draw(st.booleans(), label="ragged")
    seqlens = [data.draw(st.integers(1, n_kv), label=f"seqlen[{b}]") for b in range(batch)] if ragged else None
    q, k, v = _inputs(seed, batch, h_kv * group, h_kv, n_q, n_kv, d)
    mask = dict(causal=causal, window=window)
    run = sf.flash_decoding(q, k, v, num_splits, block_kv, pack_gqa=pack_gqa, cache_seqlens=seqlens, dtype=dtype,
                            trace="stats", **mask)

    traffic, flops = _closed_forms(run, batch, h_kv * group, h_kv, n_q, n_kv, d, pack_gqa=pack_gqa,
                                   cache_seqlens=seqlens, **mask)
    assert dict(run.traffic.ledger) == dict(traffic.ledger)
    assert run.flops_by_kind == flops
    assert run.out.shape == q.shape and run.out.dtype == STORAGE_DTYPES[dtype]

    lengths = seqlens or [n_kv] * batch
    ref = _per_batch(reference_attention, q, k, v, lengths, dtype=dtype, **mask)
    out = run.out.astype(np.float64)
    assert np.isfinite(out).all()
    # the dtype's tolerance as a max error against the output scale max|V| (a tiny random problem's outputs
    # can cancel to ~0); FlashAttention's 2x rule compares maxima over many outputs: held below at hundreds of keys
    assert max_abs_error(out, ref) <= RELATIVE_TOLERANCE[dtype] * np.abs(upcast(v, dtype)).max()
    for b, n in enumerate(lengths):  # a row that sees no key (a position before the cache) outputs 0
        visible = sf.numerics.reference_mask(n_q, n, causal, "lower_right", window).any(axis=1)
        assert not out[b][:, ~visible].any()

    splits = run.decode.num_splits
    assert all(0 <= step.split < splits for step in run.trace)
    weights = run.trace.combine_weights
    if splits == 1:
        assert weights is None and set(run.traffic.by_kernel) == {"flash_decoding_split"}
    else:
        assert weights.shape == (splits, q.size // d)
        seen = (ref != 0).any(axis=-1).ravel()  # rows that see a key (their reference output is not 0)
        np.testing.assert_allclose(weights.sum(axis=0)[seen], 1, rtol=1e-5)


@given(batch=st.integers(1, 2), h_kv=st.integers(1, 2), group=st.integers(1, 4), n_q=st.integers(1, 2),
       n_kv=st.integers(200, 1200), d=st.sampled_from([32, 64, 128]), num_splits=st.integers(1, 12),
       pack_gqa=st.booleans(), causal=st.booleans(), window=st.sampled_from([(-1, -1), (150, -1), (300, 0)]),
       dtype=st.sampled_from(["float16", "bfloat16"]), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_fa_rule_holds_at_hundreds_of_keys(batch, h_kv, group, n_q, n_kv, d, num_splits, pack_gqa, causal, window,
                                           dtype, data, seed):
    """16-bit storage, KV tiles of 16, float32 partials merged over up to 12 splits: the output's max error is at most 2x
    that of naive attention in the same dtype (FlashAttention's test rule), on ragged caches."""
    if causal and window[1] > 0:
        window = (window[0], 0)
    seqlens = [data.draw(st.integers(100, n_kv), label=f"seqlen[{b}]") for b in range(batch)]
    q, k, v = _inputs(seed, batch, h_kv * group, h_kv, n_q, n_kv, d)
    mask = dict(causal=causal, window=window)
    run = sf.flash_decoding(q, k, v, num_splits, 16, pack_gqa=pack_gqa, cache_seqlens=seqlens, dtype=dtype, **mask)
    ref = _per_batch(reference_attention, q, k, v, seqlens, dtype=dtype, **mask)
    naive = _per_batch(lambda *x, **kw: sf.naive_attention(*x, **kw).out, q, k, v, seqlens, dtype=dtype, **mask)
    check = fa_rule(run.out, naive, ref, upcast(v, dtype))
    assert check.passed, check


@pytest.mark.parametrize("pack_gqa", [True, False])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 8])
def test_the_heuristic_and_other_split_counts_agree_with_the_reference(num_splits, pack_gqa):
    """fp16 and bf16 against naive attention in the same dtype (FA's 2x rule), float32 to its tolerance, on
    a decode step of realistic length: 8 query heads on 2 K/V heads, 2 batch elements, ragged caches."""
    q, k, v = _inputs(11, 2, 8, 2, 1, 1000, 64)
    seqlens = [1000, 613]
    for dtype in STORAGE_DTYPES:
        run = sf.flash_decoding(q, k, v, num_splits, 64, pack_gqa=pack_gqa, cache_seqlens=seqlens, dtype=dtype)
        ref = _per_batch(reference_attention, q, k, v, seqlens, dtype=dtype)
        if dtype == "float32":
            assert relative_error(run.out, ref) <= RELATIVE_TOLERANCE[dtype]
        else:
            naive = _per_batch(lambda *x, **kw: sf.naive_attention(*x, **kw).out, q, k, v, seqlens, dtype=dtype)
            assert fa_rule(run.out, naive, ref, upcast(v, dtype))
    if num_splits is None:  # 1 x 2 (packed) or 1 x 8 query tiles x batch 2 CTAs, 16 KV tiles of 64
        assert run.decode.num_splits == num_splits_heuristic(2 * (2 if pack_gqa else 8), 2 * 132, 16)


def test_one_split_is_fa2_over_the_cache():
    """num_splits=1: one kernel, the FA-2 CTA over the whole run of KV tiles, so its output is bit for bit
    flash_attention's with the same tiles (lower_right causal is decoding's bottom-right alignment), and its
    bytes are FA-2's under another kernel name."""
    q, k, v = _inputs(2, 1, 6, 2, 3, 90, 16)
    run = sf.flash_decoding(q, k, v, 1, 16, causal=True, window=(40, 0))
    fa2 = sf.flash_attention(q, k, v, 64, 16, causal=True, causal_variant="lower_right", window=(40, 0),
                             pack_gqa=True, trace="none")
    np.testing.assert_array_equal(run.out, fa2.out)
    assert {tensor: flow for (_, tensor), flow in run.traffic.ledger.items()} == \
        {tensor: flow for (_, tensor), flow in fa2.traffic.ledger.items()}
    assert set(run.traffic.by_kernel) == {"flash_decoding_split"}


def test_lesson_decode_example_hand_counted():
    """Batch 1, 32 query heads on 8 K/V heads, d = 128, a 32k cache in fp16 (the lesson's 6.1 shape).
    FA-2's tiles for d = 128: 64 query rows, 128 keys: T_c = 256. Packed, each K/V head's 4 query heads
    are 4 rows of one query tile: 8 CTAs without splits, against 2 x 132 = 264 slots on the H200. The
    heuristic: the best eligible wave is 32 splits' 256 / 264 (33 splits are 8 tiles each, as 32 are);
    28 splits would reach 224 / 264 >= 85% of it, but cut 256 tiles into runs of 10, 26 splits in effect;
    29 is the first eligible count there: 232 / 264 = 0.879, 9 KV tiles per split, the last 256 - 28 x 9 = 4."""
    efficiency = split_efficiencies(8, 264, 256)
    assert 28 not in efficiency and 33 not in efficiency
    assert max(efficiency.values()) == efficiency[32] == pytest.approx(256 / 264)
    assert efficiency[29] == pytest.approx(232 / 264)
    assert all(eff < 0.85 * efficiency[32] for splits, eff in efficiency.items() if splits < 29)
    launch = sf.model.decode_launch(32768, 128, heads=32, kv_heads=8)
    assert (launch.num_splits, launch.block_q, launch.block_kv, launch.kv_tiles) == (29, 64, 128, 256)
    assert (launch.split_ctas, launch.cta_slots, launch.tiles_per_split, launch.combine_ctas) == (232, 264, 9, 8)
    assert launch.waves == launch.wave_efficiency == 232 / 264

    traffic = sf.model.flash_decoding_traffic(32768, 128, heads=32, kv_heads=8, num_splits=29)
    b, f = 2, 4  # fp16, float32
    assert traffic.by_tensor["K"].read_bytes == traffic.by_tensor["V"].read_bytes == 8 * 32768 * 128 * b
    assert traffic.by_tensor["Q"].read_bytes == 8 * 29 * 4 * 128 * b  # each split's CTA reads its 4 rows
    assert traffic.by_kernel["flash_decoding_split"].write_bytes == 29 * 32 * (128 + 1) * f  # O_s, LSE_s per row
    assert traffic.by_kernel["flash_decoding_combine"].read_bytes == 29 * 32 * (128 + 1) * f
    assert traffic.by_kernel["flash_decoding_combine"].write_bytes == 32 * 128 * b  # O

    unpacked = sf.model.flash_decoding_traffic(32768, 128, heads=32, kv_heads=8, num_splits=29, pack_gqa=False)
    assert unpacked.by_tensor["K"].read_bytes == 4 * traffic.by_tensor["K"].read_bytes  # once per query head


@pytest.mark.slow
def test_lesson_decode_example_simulated():
    """The same configuration run on the simulated GPU: its ledger is the closed form's, byte for byte."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    k, v = (rng.standard_normal((1, 8, 32768, 128), dtype=np.float32) for _ in range(2))
    run = sf.flash_decoding(q, k, v)
    assert run.decode == sf.model.decode_launch(32768, 128, heads=32, kv_heads=8)
    assert dict(run.traffic.ledger) == dict(
        sf.model.flash_decoding_traffic(32768, 128, heads=32, kv_heads=8, num_splits=29).ledger)


# Outputs of FlashAttention-2's own num_splits_heuristic (csrc/flash_attn/flash_api.cpp at commit 0251105a),
# compiled with g++ and run on these inputs: (batch x heads x m-blocks, SMs x 2, n-blocks) -> splits.
FA2_HEURISTIC = [
    ((1, 264, 256), 128), ((8, 264, 256), 29), ((16, 264, 256), 14), ((32, 264, 256), 7), ((64, 264, 256), 4),
    ((100, 264, 256), 5), ((211, 264, 256), 5), ((212, 264, 256), 1), ((1, 264, 3), 3), ((5, 264, 64), 32),
    ((1, 264, 257), 86), ((5, 264, 257), 52), ((40, 264, 7), 4), ((40, 264, 64), 6), ((1, 228, 1000), 112),
    ((3, 228, 1000), 63), ((13, 228, 1000), 15),
]


@pytest.mark.parametrize(("inputs", "splits"), FA2_HEURISTIC)
def test_heuristic_returns_what_flashattention2_returns(inputs, splits):
    assert num_splits_heuristic(*inputs) == splits


@given(ctas=st.integers(1, 400), sms=st.integers(1, 300), blocks=st.integers(1, 600))
def test_heuristic_picks_an_eligible_count_within_its_bounds(ctas, sms, blocks):
    splits = num_splits_heuristic(ctas, sms, blocks)
    assert 1 <= splits <= min(128, sms, blocks) or splits == 1
    if splits > 1:  # one more split than splits - 1 changes the tiles per split (else it is not a new count)
        assert -(-blocks // splits) != -(-blocks // (splits - 1))
        assert ctas < 0.8 * sms


def test_default_tiles_follow_flashattention2_by_head_dim():
    assert [default_block_kv(d) for d in (32, 64, 96, 128, 192, 256)] == [256, 256, 128, 128, 64, 64]
    assert [sf.model.decode_launch(4096, d).combine_block_rows for d in (32, 64, 96, 128, 192, 256)] == \
        [16, 8, 16, 4, 8, 4]


def test_split_grid_launches_query_tiles_then_splits_then_batch_heads():
    sched = SplitSchedule(40, 100, 16, 10, 3, (100, 100), pack=2)  # 80 packed rows: 5 query tiles, 10 KV tiles
    ctas = split_grid(sched, 2, 1)
    assert [cta.index for cta in ctas[:7]] == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 1, 0),
                                               (0, 1, 1)]
    assert len(ctas) == 5 * 3 * 2 * 2
    assert [cta.n_steps for cta in ctas[:15:5]] == [4, 4, 2]  # 4 tiles per split, the last split 2
    assert len(combine_grid(2 * 2 * 80, 4, 3)) == 80


def test_a_short_cache_leaves_splits_empty_but_counted():
    """A 10-row cache in an allocation of 300 (T_c = 10 tiles of 32, 5 splits of 2): split 0 holds the one
    valid tile, splits 1-4 none. Every split writes its partials (O = 0, LSE = -inf) and the combine gives
    the empty ones zero weight."""
    q, k, v = _inputs(4, 1, 2, 1, 1, 300, 8)
    run = sf.flash_decoding(q, k, v, 5, 32, cache_seqlens=[10], dtype="float32", trace="stats")
    assert run.traffic.by_tensor["K"].read_bytes == 10 * 8 * 4  # only the valid rows
    assert run.traffic.by_tensor["O_partial"].write_bytes == 5 * 2 * 8 * 4
    np.testing.assert_array_equal(run.trace.combine_weights[1:], 0)
    np.testing.assert_allclose(run.trace.combine_weights[0], 1)
    np.testing.assert_allclose(run.out, reference_attention(q, k[:, :, :10], v[:, :, :10], dtype="float32"),
                               rtol=1e-5, atol=1e-6)


def test_rows_before_the_cache_output_zero_not_nan():
    """n_q = 4 new rows, causal, on a cache of 2: positions -2 and -1 see no key."""
    q, k, v = _inputs(5, 1, 2, 1, 4, 8, 4)
    for splits in (1, 2):
        run = sf.flash_decoding(q, k, v, splits, 4, causal=True, cache_seqlens=[2], trace="stats")
        assert np.isfinite(run.out.astype(np.float64)).all()
        assert not run.out[:, :, :2].any() and run.out[:, :, 2:].all()


def test_combine_weights_come_from_each_splits_final_m_and_l():
    """w_s = l_s exp(m_s) / sum_t l_t exp(m_t): the trace's last step of each split (packed rows) against
    the combine's weights (rows in the output's order)."""
    q, k, v = _inputs(6, 1, 4, 2, 2, 50, 8)
    run = sf.flash_decoding(q, k, v, 4, 8, causal=True, dtype="float32", trace="full")
    last = {(step.head, step.split): step for step in run.trace}  # steps come in order: the last one wins
    mass = np.zeros((4, 2, 4), dtype=np.float64)  # (splits, K/V heads, packed rows)
    for (h, s), step in last.items():
        mass[s, h] = step.l * np.exp(step.m.astype(np.float64))
    expected = (mass / mass.sum(axis=0)).reshape(4, 2, 2, 2).transpose(0, 1, 3, 2).reshape(4, 8)  # unpack
    np.testing.assert_allclose(run.trace.combine_weights, expected, rtol=1e-5)


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_a_decoding_trace_round_trips_through_its_file(tmp_path, suffix):
    q, k, v = _inputs(8, 2, 4, 2, 1, 40, 4)
    run = sf.flash_decoding(q, k, v, 3, 8, cache_seqlens=[40, 17], trace="full")
    path = run.trace.save(tmp_path / f"decode{suffix}")
    loaded = sf.Trace.load(path)
    assert trace_differences(run.trace, loaded) == []
    assert loaded.config["num_splits"] == 3 and list(loaded.config["cache_seqlens"]) == [40, 17]
    assert {step.split for step in loaded} == {0, 1, 2}


def test_three_dimensional_inputs_are_batch_one():
    q, k, v = _inputs(9, 1, 4, 2, 1, 30, 8)
    four = sf.flash_decoding(q, k, v, 2, 8)
    three = sf.flash_decoding(q[0], k[0], v[0], 2, 8)
    np.testing.assert_array_equal(three.out, four.out[0])
    assert three.traffic.ledger == four.traffic.ledger


def test_run_reports_the_launch():
    q, k, v = _inputs(10, 3, 4, 1, 1, 500, 16)
    run = sf.flash_decoding(q, k, v, block_kv=32)
    launch = run.decode
    assert launch == sf.model.decode_launch(500, 16, batch=3, heads=4, kv_heads=1, block_kv=32)
    assert launch.heuristic and launch.split_ctas == 3 * launch.num_splits  # one packed query tile per element
    assert run.config.num_splits == launch.num_splits and run.config.algorithm == "flash_decoding"


def test_time_model_spreads_bytes_over_the_busy_sms():
    """One split: 8 CTAs on 8 of the 132 SMs draw 8 / 132 of the calibrated bandwidth; the heuristic's 232
    CTAs fill every SM, 100 of them twice (2 rounds), 232 / 264 of the time."""
    spec = gpu_spec("H200")
    bandwidth = spec.hbm_bytes_per_s * spec.calibration["hbm_efficiency"]
    one = predict_decode(32768, 128, heads=32, kv_heads=8, num_splits=1)
    (split,) = one.kernels
    assert split.busy_sm_fraction == 8 / 132 and split.sm_rounds == 1
    assert split.dram_s == pytest.approx(one.traffic.total_bytes / (bandwidth * 8 / 132))
    best = predict_decode(32768, 128, heads=32, kv_heads=8)
    assert best.kernels[0].sm_rounds == 2 and best.kernels[0].busy_sm_fraction == pytest.approx(232 / 264)
    assert best.time_s < one.time_s / 10
    assert [k.kernel for k in best.kernels] == ["flash_decoding_split", "flash_decoding_combine"]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(num_splits=0), "num_splits must be a positive integer"),
    (dict(num_splits=5, block_kv=8), "num_splits must be at most 4"),
    (dict(num_splits=2.0), "num_splits must be a positive integer"),
    (dict(cache_seqlens=[30]), "cache_seqlens must be None or a sequence of 2 integers"),
    (dict(cache_seqlens=[30, 31]), "cache_seqlens must hold integers in 1..n_kv = 30"),
    (dict(cache_seqlens=[0, 3]), "cache_seqlens must hold integers in 1..n_kv"),
    (dict(cache_seqlens=[3, 2.5]), "cache_seqlens must hold integers"),
    (dict(cache_seqlens=7), "cache_seqlens must be None or a sequence"),
    (dict(block_kv=0), "block_kv must be a positive integer"),
    (dict(causal=True, window=(3, 2)), "window's right bound must be 0 or -1 with causal=True"),
    (dict(window=(3,)), "window must be (left, right)"),
    (dict(trace="all"), "trace must be one of"),
    (dict(pack_gqa="yes"), "pack_gqa must be True or False"),
    (dict(dtype="int8"), "dtype must be one of"),
])
def test_bad_input_names_the_argument(kwargs, message):
    q, k, v = _inputs(1, 2, 4, 2, 1, 30, 8)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        sf.flash_decoding(q, k, v, **kwargs)


@pytest.mark.parametrize(("shapes", "message"), [
    (((4, 8), (2, 30, 8), (2, 30, 8)), "q must have shape"),
    (((1, 1, 4, 1, 8), (1, 1, 2, 30, 8), (1, 1, 2, 30, 8)), "q must have shape"),
    (((1, 3, 1, 8), (1, 2, 30, 8), (1, 2, 30, 8)), "must be a multiple of k's and v's heads"),
    (((2, 4, 1, 8), (1, 2, 30, 8), (1, 2, 30, 8)), "equal leading"),
])
def test_bad_shapes_are_refused(shapes, message):
    with pytest.raises(ValueError, match=message):
        sf.flash_decoding(*(np.ones(shape) for shape in shapes))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(num_splits=0), "num_splits must be a positive integer"),
    (dict(num_splits=300), "num_splits must be at most 256"),
    (dict(cache_seqlens=[5, 5]), "cache_seqlens must be None or a sequence of 1 integers"),
    (dict(heads=6, kv_heads=4), "must be a multiple of kv_heads"),
    (dict(n_q=0), "n_q must be a positive integer"),
])
def test_closed_form_refuses_what_the_simulator_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sf.model.flash_decoding_traffic(32768, 128, **kwargs)


def test_example_numbers_are_exact_integers():
    traffic = sf.model.flash_decoding_traffic(32768, 128, heads=32, kv_heads=8, num_splits=29)
    assert all(isinstance(v, int) for flow in traffic.ledger.values() for v in (flow.read_bytes, flow.write_bytes))
    flops = sf.model.flash_decoding_flops(32768, 128, heads=32, kv_heads=8, num_splits=29)
    assert all(isinstance(v, int) for v in flops.values())
    assert flops["tensor"] == 4 * 8 * 4 * 32768 * 128  # 8 groups of 4 rows against every key, two matmuls
    assert math.isclose(sf.model.decode_launch(32768, 128, heads=32, kv_heads=8).wave_efficiency, 0.8787878787)


def test_the_viewer_says_it_does_not_step_through_decoding_runs():
    from simflash.viewer import page_data

    q, k, v = _inputs(12, 1, 2, 1, 1, 20, 4)
    run = sf.flash_decoding(q, k, v, 2, 4, trace="stats")
    with pytest.raises(ValueError, match="the viewer steps through naive, fa2, fa1 runs, not 'flash_decoding'"):
        page_data(run)
    assert run._repr_html_() is None
