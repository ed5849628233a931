"""FlashAttention-1 (Algorithm 1: KV tiles outer, normalised O, l and m round-tripped through HBM)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import simflash as sf
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.config import MiB, STATE_DTYPE, STORAGE_DTYPES
from simflash.model.traffic import FLASH_TRAFFIC
from simflash.numerics import RELATIVE_TOLERANCE, fa_rule, reference_attention, relative_error

DTYPES = sorted(STORAGE_DTYPES)


def random_qkv(seed, heads, n_q, n_kv, d):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((heads, n_q, d)), rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_kv, d))


def fa1_fa2_difference_bound(v, sched, dtype, o_accum_dtype):
    """An upper bound, from first principles, on |FA-1 - FA-2| per output element, both run on the same
    inputs in a 16-bit storage dtype.

    - P enters the second matmul rounded to the storage dtype, by at most eps/2 of each entry. FA-1 rounds
      P~_ij = exp(S_ij - m~_ij), FA-2 exp(S_ij - m_i): different numbers, so different roundings. Each
      kernel's output is a convex combination of V's rows, so its P roundings move it by at most
      eps/2 x max |V| of the head; the two kernels differ by at most eps x max |V|.
    - With the running O in the storage dtype, each store but the last rounds O_i by at most eps/2 x max |V|
      (O_i is a convex combination of V's rows) and later steps scale it by <= 1:
      (KV tiles visited - 1) x eps/2 x max |V|.
    """
    eps = float(ml_dtypes.finfo(STORAGE_DTYPES[dtype]).eps)
    heads, n_q = v.shape[0], sched.n_q
    bound = np.zeros((heads, n_q, v.shape[-1]))
    v_max = np.abs(v.astype(STORAGE_DTYPES[dtype]).astype(np.float64)).max(axis=(1, 2))  # (heads,)
    for i in range(sched.n_q_tiles):
        stores = max(len(sched.kv_tiles(i)) - 1, 0) if o_accum_dtype == "storage" else 0
        bound[:, sched.q_rows(i)] = (1 + stores / 2) * eps * v_max[:, None, None]
    return bound


def test_fa1_is_registered_with_its_closed_form():
    assert "fa1" in FLASH_ALGORITHMS and "fa1" in FLASH_TRAFFIC


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_q=st.integers(1, 40), n_kv=st.integers(1, 40), d=st.sampled_from([1, 3, 8]),
    block_q=st.integers(1, 16), block_kv=st.integers(1, 16), heads=st.integers(1, 2),
    causal=st.booleans(), causal_variant=st.sampled_from(["upper_left", "lower_right"]),
    dtype=st.sampled_from(DTYPES), write_logsumexp=st.booleans(), seed=st.integers(0, 2**32 - 1),
    o_accum_dtype=st.sampled_from(["storage", "float32"]),
)
@example(n_q=1, n_kv=32, d=1, block_q=1, block_kv=2, heads=1, causal=False, causal_variant="upper_left",
         dtype="bfloat16", write_logsumexp=False, seed=120, o_accum_dtype="float32")  # P~ and P round apart
def test_fa1_bytes_equal_closed_form_and_output_matches_reference(
    n_q, n_kv, d, block_q, block_kv, heads, causal, causal_variant, dtype, write_logsumexp, seed, o_accum_dtype
):
    q, k, v = random_qkv(seed, heads, n_q, n_kv, d)
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype)
    run = sf.flash_attention(q, k, v, block_q, block_kv, variant="fa1", trace="full",
                             write_logsumexp=write_logsumexp, o_accum_dtype=o_accum_dtype, **kw)

    # -- bytes and FLOPs by kind: simulation == closed form, exactly, tensor by tensor
    model = sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, "fa1", n_kv=n_kv, heads=heads,
                                   causal_variant=causal_variant, write_logsumexp=write_logsumexp,
                                   o_accum_dtype=o_accum_dtype)
    assert dict(run.traffic.ledger) == dict(model.ledger)
    assert run.flops_by_kind == sf.model.flops_by_kind(n_q, d, "fa1", causal, block_q, block_kv, n_kv=n_kv,
                                                       heads=heads, causal_variant=causal_variant)
    if o_accum_dtype == "float32":  # the final conversion, and nothing else, rounds to the storage dtype
        o32 = np.zeros(run.out.shape, dtype=np.float32)
        for step in run.trace:
            o32[step.head, step.row_start:step.row_start + step.m.size] = step.a
        np.testing.assert_array_equal(run.out, o32.astype(STORAGE_DTYPES[dtype]))

    # -- numerics: no NaN; float32 within the dtype's tolerance of float64. 16-bit storage: FA-1's error may
    # exceed FA-2's (held to 2x naive's elsewhere) by at most |FA-1 - FA-2|, bounded from first principles, and
    # by one unit in the last place of the final store, which the perturbed value may round the other way.
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
        sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal=causal, causal_variant=causal_variant)
        difference = fa1_fa2_difference_bound(np.asarray(v), sched, dtype, o_accum_dtype)
        fa2_out = fa2.out.astype(np.float64)  # both final stores round, each by <= eps/2 of its value
        assert (np.abs(out - fa2_out) <= difference + ulp * np.maximum(np.abs(out), np.abs(fa2_out))).all()
        allowance = (np.linalg.norm(difference) + ulp * np.linalg.norm(out)) / ref_norm
        assert error <= relative_error(fa2.out, ref) + allowance + 1e-6

    # -- the logsumexp, when asked for, agrees with FA-2's
    if write_logsumexp:
        fa2 = sf.flash_attention(q, k, v, block_q, block_kv, variant="fa2", trace="none", write_logsumexp=True, **kw)
        assert (np.isposinf(run.logsumexp) == np.isposinf(fa2.logsumexp)).all()  # rows that saw no key: +inf
        finite = np.isfinite(fa2.logsumexp)
        np.testing.assert_allclose(run.logsumexp[finite], fa2.logsumexp[finite], rtol=1e-5, atol=1e-5)


@given(
    n_q=st.integers(32, 300), n_kv=st.integers(32, 300), d=st.sampled_from([16, 32, 64, 128]),
    block_q=st.sampled_from([16, 32, 64, 128]), causal=st.booleans(),
    causal_variant=st.sampled_from(["upper_left", "lower_right"]), dtype=st.sampled_from(["float16", "bfloat16"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_fa1_accumulating_o_in_16_bits_keeps_its_bound_at_hundreds_of_tokens(n_q, n_kv, d, block_q, causal,
                                                                            causal_variant, dtype, seed):
    """FA-1 as the paper writes it, O rounded to the storage dtype after each of up to 19 KV tiles of 16
    keys: every output within the first-principles bound of FA-2's (itself held to 2x naive's error)."""
    q, k, v = random_qkv(seed, 1, n_q, n_kv, d)
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype)
    fa1 = sf.flash_attention(q, k, v, block_q, 16, variant="fa1", trace="none", **kw)
    fa2 = sf.flash_attention(q, k, v, block_q, 16, variant="fa2", trace="none", **kw)
    assert fa1.traffic == sf.model.flash_traffic(n_q, d, block_q, 16, dtype, causal, "fa1", n_kv=n_kv,
                                                 causal_variant=causal_variant)
    sched = sf.TileSchedule(n_q, n_kv, block_q, 16, causal=causal, causal_variant=causal_variant)
    bound = fa1_fa2_difference_bound(v, sched, dtype, "storage")
    out, fa2_out = fa1.out.astype(np.float64), fa2.out.astype(np.float64)
    ulp = float(ml_dtypes.finfo(STORAGE_DTYPES[dtype]).eps)  # both final stores round
    assert np.isfinite(out).all()
    assert (np.abs(out - fa2_out) <= bound + ulp * np.maximum(np.abs(out), np.abs(fa2_out))).all()
    assert fa_rule(fa2.out, sf.naive_attention(q, k, v, **kw).out, reference_attention(q, k, v, **kw), v)


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
    # the init write and the first tile's read of the known zeros are labelled "(init)"; then one round trip per tile
    assert by_tensor["O (init)"] == sf.Flow(read_bytes=head, write_bytes=head)
    assert by_tensor["O"] == sf.Flow(read_bytes=(T_c - 1) * head, write_bytes=T_c * head)
    assert by_tensor["l (init)"] == by_tensor["m (init)"] == sf.Flow(read_bytes=stats, write_bytes=stats)
    assert by_tensor["l"] == by_tensor["m"] == sf.Flow(read_bytes=(T_c - 1) * stats, write_bytes=T_c * stats)
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


def algorithm_1_float64(q, k, v, block_q, block_kv, scale, visible):
    """Algorithm 1 of the FA-1 paper, lines 10-12, in float64 with plain loops: for every visited (j, i),
    (m~, l~, m_new, l_new, alpha, beta, O_new). No simflash code: tiles, mask and order built here."""
    n_q, n_kv = visible.shape
    O, l, m = np.zeros(q.shape), np.zeros(n_q), np.full(n_q, -np.inf)
    steps = {}
    for j0 in range(0, n_kv, block_kv):
        cols = slice(j0, min(j0 + block_kv, n_kv))
        for i0 in range(0, n_q, block_q):
            rows = slice(i0, min(i0 + block_q, n_q))
            S = np.where(visible[rows, cols], q[rows] @ k[cols].T * scale, -np.inf)
            m_t = S.max(axis=1)
            with np.errstate(invalid="ignore"):
                P_t = np.nan_to_num(np.exp(S - m_t[:, None]))  # a row with no key here: all zeros
            l_t = P_t.sum(axis=1)
            m_new = np.maximum(m[rows], m_t)
            with np.errstate(invalid="ignore"):
                alpha = np.nan_to_num(np.exp(m[rows] - m_new))  # -inf - -inf: nothing seen yet, factor 0
                beta = np.nan_to_num(np.exp(m_t - m_new))
            l_new = alpha * l[rows] + beta * l_t
            with np.errstate(invalid="ignore", divide="ignore"):
                O_new = np.nan_to_num((l[rows, None] * alpha[:, None] * O[rows] + beta[:, None] * (P_t @ v[cols]))
                                      / l_new[:, None])
            steps[i0 // block_q, j0 // block_kv] = (m_t, l_t, m_new, l_new, alpha, beta, O_new)
            O[rows], l[rows], m[rows] = O_new, l_new, m_new
    return steps


def test_trace_follows_algorithm_1_recomputed_in_float64():
    """m~, l~, both factors, m_new, l_new and the normalised O_i of every step against an independent
    float64 run of Algorithm 1's lines 10-12 on the same (float32) inputs."""
    q, k, v = random_qkv(2, 1, 12, 13, 5)
    q, k, v = (x.astype(np.float32).astype(np.float64) for x in (q, k, v))
    fa1 = sf.flash_attention(q, k, v, 4, 3, causal=True, causal_variant="lower_right", dtype="float32",
                             variant="fa1", trace="full")
    visible = np.tri(12, 13, k=13 - 12, dtype=bool)  # lower_right: row r sees keys c <= r + 1
    expected = algorithm_1_float64(q[0], k[0], v[0], 4, 3, 1 / np.sqrt(5), visible)
    assert len(fa1.trace) > 0
    for s in fa1.trace:
        assert all(x.dtype == STATE_DTYPE for x in (s.m, s.alpha, s.l, s.a, s.m_tile, s.l_tile, s.beta))
        m_t, l_t, m_new, l_new, alpha, beta, O_new = expected[s.i, s.j]
        np.testing.assert_allclose(s.m_tile, m_t, rtol=1e-6)
        np.testing.assert_allclose(s.l_tile, l_t, rtol=1e-5)
        np.testing.assert_allclose(s.m, m_new, rtol=1e-6)
        np.testing.assert_allclose(s.l, l_new, rtol=1e-5)
        np.testing.assert_allclose(s.alpha, alpha, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s.beta, beta, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s.a, O_new, rtol=1e-5, atol=1e-6)
    for i in range(3):
        np.testing.assert_array_equal(fa1.trace.of_tile(i)[-1].a, fa1.out[0, 4 * i:4 * i + 4])


def test_tile_local_max_differs_from_the_running_max_and_beta_rescales_the_tile():
    """Scores rise then fall: the second tile's own max is below the running max, so beta < 1 there."""
    q = np.array([[1.0, 0.0]])
    k = np.array([[8.0, 0.0], [6.0, 0.0], [10.0, 0.0], [7.0, 0.0], [3.0, 0.0], [2.0, 0.0]])
    v = np.arange(12, dtype=float).reshape(6, 2)
    run = sf.flash_attention(q, k, v, 1, 2, scale=1.0, dtype="float32", variant="fa1", trace="stats")
    third = run.trace[2]
    assert third.m_tile[0] == 3.0 and third.m[0] == 10.0
    np.testing.assert_allclose(third.beta[0], np.exp(3.0 - 10.0), rtol=1e-6)
    np.testing.assert_allclose(third.alpha[0], 1.0)
    np.testing.assert_allclose(third.l_tile[0], 1 + np.exp(-1.0), rtol=1e-6)


def test_ledger_labels_what_the_released_kernel_skips():
    """The init writes and the first-visit reads of the known initial values carry "(init)"; the rest is O, l, m."""
    n, d = 256, 16
    traffic = sf.model.flash_traffic(n, d, 128, 64, variant="fa1").by_tensor
    assert traffic["O (init)"] == sf.Flow(read_bytes=n * d * 2, write_bytes=n * d * 2)
    assert traffic["l (init)"] == traffic["m (init)"] == sf.Flow(read_bytes=n * 4, write_bytes=n * 4)
    T_c = n // 64
    assert traffic["O"] == sf.Flow(read_bytes=(T_c - 1) * n * d * 2, write_bytes=T_c * n * d * 2)
    wide = sf.model.flash_traffic(n, d, 128, 64, variant="fa1", o_accum_dtype="float32").by_tensor
    assert wide["O"] == sf.Flow(read_bytes=T_c * n * d * 4, write_bytes=T_c * n * d * 4)  # + the final read
    assert wide["out"] == sf.Flow(write_bytes=n * d * 2)
    with pytest.raises(ValueError, match="o_accum_dtype"):
        sf.model.flash_traffic(n, d, variant="fa2", o_accum_dtype="float32")
    q, k, v = random_qkv(0, 1, 8, 8, 4)
    with pytest.raises(ValueError, match=r"o_accum_dtype.*fa1"):
        sf.flash_attention(q, k, v, variant="fa2", o_accum_dtype="float32")
    with pytest.raises(ValueError, match="o_accum_dtype"):
        sf.flash_attention(q, k, v, variant="fa1", o_accum_dtype="float64")


def test_float32_accumulation_rounds_once():
    """With the running O in float32 FA-1 no longer drifts with the number of KV tiles."""
    q, k, v = random_qkv(3, 1, 64, 512, 16)
    ref = reference_attention(q, k, v, dtype="float16")
    errors = {acc: relative_error(sf.flash_attention(q, k, v, 64, 4, dtype="float16", variant="fa1", trace="none",
                                                     o_accum_dtype=acc).out, ref) for acc in ("storage", "float32")}
    assert errors["float32"] < errors["storage"] / 4


def test_rows_with_no_visible_key_end_as_zero_not_nan():
    q, k, v = random_qkv(4, 1, 9, 3, 4)  # lower_right, n_q > n_kv: rows 0..5 see no key
    for dtype in DTYPES:
        run = sf.flash_attention(q, k, v, 2, 2, causal=True, causal_variant="lower_right", dtype=dtype,
                                 variant="fa1", write_logsumexp=True)
        out = run.out.astype(np.float64)
        assert (out[0, :6] == 0).all() and np.isfinite(out).all()
        assert np.isposinf(run.logsumexp[0, :6]).all() and np.isfinite(run.logsumexp[0, 6:]).all()


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
