"""FlashAttention-1 (Algorithm 1: KV tiles outer, normalised O, l and m round-tripped through HBM)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import simflash as sf
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.config import MiB, STATE_DTYPE, STORAGE_DTYPES
from simflash.model.traffic import FLASH_TRAFFIC
from simflash.numerics import RELATIVE_TOLERANCE, reference_attention, relative_error

DTYPES = sorted(STORAGE_DTYPES)


def random_qkv(seed, heads, n_q, n_kv, d):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((heads, n_q, d)), rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_kv, d))


def intermediate_rounding(run, dtype):
    """|round(O_i) - O_i| of every store of O but the last, summed per element: what FA-1 adds by keeping
    its normalised output in the storage dtype between KV tiles (each later step scales it by <= 1)."""
    slack = np.zeros(run.out.shape)
    for step in run.trace:
        rows = slice(step.row_start, step.row_start + step.m.size)
        if step.j != run.trace.of_tile(step.i, head=step.head)[-1].j:
            slack[step.head, rows] += np.abs(step.a.astype(STORAGE_DTYPES[dtype]).astype(np.float64) - step.a)
    return slack


def test_fa1_is_registered_with_its_closed_form():
    assert "fa1" in FLASH_ALGORITHMS and "fa1" in FLASH_TRAFFIC


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_q=st.integers(1, 40), n_kv=st.integers(1, 40), d=st.sampled_from([1, 3, 8]),
    block_q=st.integers(1, 16), block_kv=st.integers(1, 16), heads=st.integers(1, 2),
    causal=st.booleans(), causal_variant=st.sampled_from(["upper_left", "lower_right"]),
    dtype=st.sampled_from(DTYPES), write_logsumexp=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_fa1_bytes_equal_closed_form_and_output_matches_reference(
    n_q, n_kv, d, block_q, block_kv, heads, causal, causal_variant, dtype, write_logsumexp, seed
):
    q, k, v = random_qkv(seed, heads, n_q, n_kv, d)
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype)
    run = sf.flash_attention(q, k, v, block_q, block_kv, variant="fa1", trace="full",
                             write_logsumexp=write_logsumexp, **kw)

    # -- bytes: simulation == closed form, exactly, tensor by tensor
    model = sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, "fa1", n_kv=n_kv, heads=heads,
                                   causal_variant=causal_variant, write_logsumexp=write_logsumexp)
    assert dict(run.traffic.ledger) == dict(model.ledger)

    # -- numerics: no NaN; float32 within the dtype's tolerance of float64. 16-bit storage: FA-1 does what FA-2
    # does (same tiles, same roundings of P) plus one thing, it stores its normalised O between KV tiles. So its
    # error may exceed FA-2's (held to 2x naive's elsewhere) by those roundings, read off the trace, and by one
    # unit in the last place of the final store, which the perturbed value may round the other way.
    out = run.out.astype(np.float64)
    assert np.isfinite(out).all() and run.out.dtype == STORAGE_DTYPES[dtype]
    ref = reference_attention(q, k, v, **kw)
    error = relative_error(out, ref)
    if dtype == "float32":
        assert error <= RELATIVE_TOLERANCE[dtype]
    else:
        fa2 = sf.flash_attention(q, k, v, block_q, block_kv, variant="fa2", trace="none", **kw)
        ulp = float(ml_dtypes.finfo(STORAGE_DTYPES[dtype]).eps)  # relative spacing of the storage dtype
        ref_norm = np.linalg.norm(ref) or 1.0
        allowance = (np.linalg.norm(intermediate_rounding(run, dtype)) + ulp * np.linalg.norm(out)) / ref_norm
        assert error <= relative_error(fa2.out, ref) + allowance + 1e-6

    # -- the logsumexp, when asked for, agrees with FA-2's
    if write_logsumexp:
        fa2 = sf.flash_attention(q, k, v, block_q, block_kv, variant="fa2", trace="none", write_logsumexp=True, **kw)
        assert (np.isinf(run.logsumexp) == np.isinf(fa2.logsumexp)).all()  # rows that saw no key
        finite = np.isfinite(fa2.logsumexp)
        np.testing.assert_allclose(run.logsumexp[finite], fa2.logsumexp[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n", [256, 1024])
def test_fa1_within_twice_naive_error_at_the_lesson_tile_sizes(n, dtype):
    """B_r = 128, B_c = 64 on d = 64 random heads: up to 16 KV tiles, FA-1 keeps FlashAttention's 2x rule."""
    q, k, v = random_qkv(n, 1, n, n, 64)
    ref = reference_attention(q, k, v, dtype=dtype)
    fa1 = sf.flash_attention(q, k, v, 128, 64, dtype=dtype, variant="fa1", trace="none")
    naive = sf.naive_attention(q, k, v, dtype=dtype)
    assert relative_error(fa1.out, ref) <= 2 * relative_error(naive.out, ref)


def test_fa1_error_grows_with_the_number_of_kv_tiles_fa2_does_not():
    """One rounding of O per KV tile: the more tiles, the further FA-1 drifts; FA-2 rounds once."""
    q, k, v = random_qkv(3, 1, 64, 512, 16)
    ref = reference_attention(q, k, v, dtype="float16")
    errors = {
        (variant, block_kv): relative_error(
            sf.flash_attention(q, k, v, 64, block_kv, dtype="float16", variant=variant, trace="none").out, ref)
        for variant in ("fa1", "fa2") for block_kv in (256, 4)
    }
    assert errors["fa1", 4] > 4 * errors["fa1", 256]
    assert errors["fa2", 4] < 2 * errors["fa2", 256]
    assert errors["fa1", 4] > 4 * errors["fa2", 4]


def test_lesson_configuration_bytes_by_hand():
    """N = 4096, d = 128, fp16, B_r = 128, B_c = 64: Q, O, l and m cross the bus once per KV tile (T_c = 64)."""
    n, d, b, T_c = 4096, 128, 2, 4096 // 64
    head = n * d * b  # 1 MiB: Q, K, V or O of one head
    stats = n * 4  # 16 KiB: l or m of one head, float32
    by_tensor = sf.model.flash_traffic(n, d, variant="fa1").by_tensor
    assert by_tensor["Q"] == sf.Flow(read_bytes=T_c * head)
    assert by_tensor["K"] == by_tensor["V"] == sf.Flow(read_bytes=head)  # K and V read exactly once
    assert by_tensor["O"] == sf.Flow(read_bytes=T_c * head, write_bytes=(1 + T_c) * head)  # init + per tile
    assert by_tensor["l"] == by_tensor["m"] == sf.Flow(read_bytes=T_c * stats, write_bytes=(1 + T_c) * stats)
    total = sf.model.flash_traffic(n, d, variant="fa1").total_bytes
    assert total == (3 * T_c + 3) * head + 2 * (2 * T_c + 1) * stats
    assert total / MiB > 3 * sf.model.flash_traffic(n, d, variant="fa2").total_bytes / MiB


def test_kv_tiles_outer_query_tiles_inner_and_skipped_pairs_never_visited():
    q, k, v = random_qkv(0, 2, 10, 9, 4)
    sched = sf.TileSchedule(10, 9, 4, 2, causal=True)
    run = sf.flash_attention(q, k, v, 4, 2, causal=True, dtype="float32", variant="fa1", trace="stats")
    expected = [(h, j, i) for h in range(2) for j in range(sched.n_kv_tiles) for i in range(sched.n_q_tiles)
                if sched.tile_kind(i, j) != "skipped"]
    assert [(s.head, s.j, s.i) for s in run.trace] == expected
    assert all(s.masked == (sched.tile_kind(s.i, s.j) == "masked") for s in run.trace)


def test_a_kv_tile_no_query_tile_visits_is_never_loaded():
    """upper_left with n_kv > n_q: keys past the last query row are in everyone's future."""
    q, k, v = random_qkv(1, 1, 8, 20, 4)
    run = sf.flash_attention(q, k, v, 4, 4, causal=True, dtype="float16", variant="fa1")
    assert run.traffic.by_tensor["K"].read_bytes == 8 * 4 * 2  # key tiles 0 and 1 only: columns 0..7
    np.testing.assert_allclose(run.out.astype(np.float64), reference_attention(q, k, v, causal=True), atol=3e-3)


def test_trace_holds_the_normalised_output_and_the_same_statistics_as_fa2():
    q, k, v = random_qkv(2, 1, 12, 13, 5)
    kw = dict(causal=True, causal_variant="lower_right", dtype="float32")
    fa1 = sf.flash_attention(q, k, v, 4, 3, variant="fa1", trace="full", **kw)
    fa2 = sf.flash_attention(q, k, v, 4, 3, variant="fa2", trace="full", **kw)
    assert all(s.m.dtype == s.alpha.dtype == s.l.dtype == s.a.dtype == STATE_DTYPE for s in fa1.trace)
    for i in range(3):
        one, two = fa1.trace.of_tile(i), fa2.trace.of_tile(i)
        assert [s.j for s in one] == [s.j for s in two]
        for s1, s2 in zip(one, two):  # same tiles folded in the same order: same m, alpha, l; a = O_i = a / l
            np.testing.assert_allclose(s1.m, s2.m, rtol=1e-6)
            np.testing.assert_allclose(s1.alpha, s2.alpha, rtol=1e-6)
            np.testing.assert_allclose(s1.l, s2.l, rtol=1e-6)
            normalised = np.divide(s2.a, s2.l[:, None], out=np.zeros_like(s2.a), where=s2.l[:, None] > 0)
            np.testing.assert_allclose(s1.a, normalised, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(one[-1].a, fa1.out[0, 4 * i:4 * i + 4])


def test_rows_with_no_visible_key_end_as_zero_not_nan():
    q, k, v = random_qkv(4, 1, 9, 3, 4)  # lower_right, n_q > n_kv: rows 0..5 see no key
    for dtype in DTYPES:
        run = sf.flash_attention(q, k, v, 2, 2, causal=True, causal_variant="lower_right", dtype=dtype,
                                 variant="fa1", write_logsumexp=True)
        out = run.out.astype(np.float64)
        assert (out[0, :6] == 0).all() and np.isfinite(out).all()
        assert np.isneginf(run.logsumexp[0, :6]).all() and np.isfinite(run.logsumexp[0, 6:]).all()


def test_sram_holds_the_tiles_of_algorithm_1_and_the_same_flops_as_fa2():
    q, k, v = random_qkv(5, 1, 256, 256, 128)
    fa1 = sf.flash_attention(q, k, v, 128, 64, variant="fa1", trace="none")
    fa2 = sf.flash_attention(q, k, v, 128, 64, variant="fa2", trace="none")
    shared = fa1.on_chip.shared.peak_by_buffer
    assert shared == {"K_j": 64 * 128 * 2, "V_j": 64 * 128 * 2, "Q_i": 128 * 128 * 2, "O_i": 128 * 128 * 2,
                      "l_i": 128 * STATE_DTYPE.itemsize, "m_i": 128 * STATE_DTYPE.itemsize, "S_ij": 128 * 64 * 2}
    assert fa1.on_chip.shared.peak_bytes == sum(shared.values())
    assert fa1.flops == fa2.flops


def test_steps_can_be_stepped_through_live():
    q, k, v = random_qkv(6, 1, 8, 8, 4)
    steps = sf.flash_attention_steps(q, k, v, 4, 4, dtype="float32", variant="fa1")
    first = next(steps)
    assert (first.j, first.i) == (0, 0) and first.a.shape == (4, 4)
    rest = list(steps)
    assert [(s.j, s.i) for s in rest] == [(0, 1), (1, 0), (1, 1)]
