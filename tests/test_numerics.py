"""Outputs against the float64 reference; byte counts against the closed form; trace invariants."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simflash as sf
from simflash.numerics import (
    FLOAT32_UNIT_ROUNDOFF, RELATIVE_TOLERANCE, fa_rule, fa_rule_atol, max_abs_error, reference_attention,
    reference_mask, relative_error, upcast, within_tolerance,
)

DTYPES = ["float16", "bfloat16", "float32"]


def random_qkv(rng, heads, n_q, n_kv, d, magnitude=1.0):
    q = magnitude * rng.standard_normal((heads, n_q, d))
    k = magnitude * rng.standard_normal((heads, n_kv, d))
    return q, k, rng.standard_normal((heads, n_kv, d))


@given(
    n_q=st.integers(1, 48), n_kv=st.integers(1, 48), d=st.sampled_from([1, 4, 16]),
    block_q=st.integers(1, 20), block_kv=st.integers(1, 20), heads=st.integers(1, 2),
    causal=st.booleans(), causal_variant=st.sampled_from(["upper_left", "lower_right"]),
    dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1),
)
def test_flash_matches_reference_model_and_trace(n_q, n_kv, d, block_q, block_kv, heads, causal,
                                                 causal_variant, dtype, seed):
    q, k, v = random_qkv(np.random.default_rng(seed), heads, n_q, n_kv, d)
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype)
    run = sf.flash_attention(q, k, v, block_q, block_kv, trace="full", **kw)
    ref = reference_attention(q, k, v, **kw)
    naive = sf.naive_attention(q, k, v, **kw)

    # -- numerics: the dtype's tolerance, as a max error against the output scale max|V| (a tiny random
    # problem's outputs can cancel to ~0). FlashAttention's 2x rule compares maxima over many outputs,
    # so it is held in test_fa_rule_holds_at_hundreds_of_tokens, not on a 1 x 1 output.
    assert max_abs_error(run.out, ref) <= RELATIVE_TOLERANCE[dtype] * np.abs(upcast(v, dtype)).max()
    assert run.out.dtype == sf.config.STORAGE_DTYPES[dtype] and run.out.shape == q.shape
    assert np.isfinite(run.out.astype(np.float32)).all()

    # -- bytes: simulation == closed form, exactly
    model_kw = dict(n_kv=n_kv, heads=heads, causal_variant=causal_variant)
    assert run.traffic == sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, **model_kw)
    assert naive.traffic == sf.model.naive_traffic(n_q, d, dtype, causal, **model_kw)

    # -- trace: one step per visited tile; the last step of each tile is the output; l > 0 where a key is visible
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    assert len(run.trace) == heads * sum(len(sched.kv_tiles(i)) for i in range(sched.n_q_tiles))
    offset = n_kv - n_q if causal_variant == "lower_right" else 0
    visible = (np.tri(n_q, n_kv, k=offset, dtype=bool) if causal else np.ones((n_q, n_kv), bool)).any(axis=1)
    for h in range(heads):
        for i in range(sched.n_q_tiles):
            steps = run.trace.of_tile(i, head=h)
            assert [s.j for s in steps] == sched.kv_tiles(i)
            assert all(s.masked == (sched.tile_kind(i, s.j) == "masked") for s in steps)
            rows = sched.q_rows(i)
            if not steps:
                continue
            last = steps[-1]
            assert (last.l > 0).tolist() == visible[rows].tolist()
            expected = np.divide(last.a, last.l[:, None], out=np.zeros_like(last.a), where=last.l[:, None] > 0)
            np.testing.assert_array_equal(expected.astype(run.out.dtype), run.out[h, rows])
            ms = np.array([s.m for s in steps])
            assert (ms[1:] >= ms[:-1]).all()  # the running max never decreases (-inf until a key is seen)
            assert all(((s.alpha >= 0) & (s.alpha <= 1)).all() for s in steps)


def test_large_scores_do_not_overflow():
    """Scores of magnitude ~1e4: exp never sees more than 0, so nothing overflows."""
    rng = np.random.default_rng(11)
    q, k, v = random_qkv(rng, 1, 64, 64, 16, magnitude=1.0)
    q, k = q * 200.0, k * 200.0  # |q.k| / sqrt(16) ~ 1e4
    ref = reference_attention(q, k, v, dtype="float32")
    assert np.abs(q[0] @ k[0].T / 4).max() > 5e3
    for variant in sf.algorithms.FLASH_ALGORITHMS:
        run = sf.flash_attention(q, k, v, 16, 8, dtype="float32", variant=variant)
        assert np.isfinite(run.out).all()
        assert relative_error(run.out, ref) < 1e-4
    assert np.isfinite(sf.naive_attention(q, k, v, dtype="float32").out).all()


def test_rows_with_no_visible_key_give_zeros_not_nan():
    """lower_right with n_q > n_kv: the first n_q - n_kv rows see no key at all."""
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 2, 20, 6, 8)
    for run in (sf.flash_attention(q, k, v, 4, 3, causal=True, causal_variant="lower_right", trace="full"),
                sf.naive_attention(q, k, v, causal=True, causal_variant="lower_right")):
        out = run.out.astype(np.float32)
        assert np.isfinite(out).all()
        assert (out[:, :14] == 0).all() and (np.abs(out[:, 14:]) > 0).any(axis=-1).all()
    steps = sf.flash_attention(q, k, v, 4, 3, causal=True, causal_variant="lower_right", trace="stats").trace
    assert all(np.isfinite(s.l).all() and np.isfinite(s.alpha).all() for s in steps)
    assert any(np.isneginf(s.m).any() for s in steps)  # rows still waiting for a visible key keep m = -inf


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_accuracy_at_the_lesson_head_and_tile_sizes(dtype):
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 1024, 1024, 128)
    ref = reference_attention(q, k, v, causal=True, dtype=dtype)
    run = sf.flash_attention(q, k, v, causal=True, dtype=dtype, trace="none")
    assert relative_error(run.out, ref) <= RELATIVE_TOLERANCE[dtype]


@given(
    n_q=st.integers(32, 300), n_kv=st.integers(32, 300), d=st.sampled_from([16, 32, 64, 128]),
    block_q=st.sampled_from([16, 32, 64, 128]), causal=st.booleans(),
    causal_variant=st.sampled_from(["upper_left", "lower_right"]), dtype=st.sampled_from(["float16", "bfloat16"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_fa_rule_holds_at_hundreds_of_tokens(n_q, n_kv, d, block_q, causal, causal_variant, dtype, seed):
    """FA-2 with 16-bit storage, float32 running state carried over up to 19 KV tiles of 16 keys: the
    output's max error is at most 2x that of naive attention in the same dtype (FlashAttention's own
    test rule). FA-1 as the paper writes it rounds O through HBM every KV tile; its accuracy is held in
    test_flash1.py."""
    q, k, v = random_qkv(np.random.default_rng(seed), 1, n_q, n_kv, d)
    kw = dict(causal=causal, causal_variant=causal_variant, dtype=dtype)
    run = sf.flash_attention(q, k, v, block_q, 16, variant="fa2", trace="none", **kw)
    check = fa_rule(run.out, sf.naive_attention(q, k, v, **kw).out, reference_attention(q, k, v, **kw), v)
    assert check.passed, check
    assert check.atol < check.naive_error / 20  # the slack decides only ties, never the verdict


def _noisy(rng, ref, size):
    """ref plus random noise whose largest entry is exactly `size` (random signs, no zero noise)."""
    noise = rng.uniform(0.1, 1.0, ref.shape) * rng.choice([-1.0, 1.0], ref.shape)
    return ref + size * noise / np.abs(noise).max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("factor, passes", [(3.0, False), (1.5, True), (2.5, False)])
def test_the_rule_fails_3x_naive_error_and_passes_1_5x(dtype, factor, passes):
    rng = np.random.default_rng()  # fresh inputs every run
    q, k, v = random_qkv(rng, 2, 256, 192, 64)
    ref = reference_attention(q, k, v, causal=True, dtype=dtype)
    naive = sf.naive_attention(q, k, v, causal=True, dtype=dtype).out
    naive_error = max_abs_error(naive, ref)
    assert naive_error > 100 * fa_rule_atol(v) > 0
    out = _noisy(rng, ref, factor * naive_error)
    check = fa_rule(out, naive, ref, v)
    assert check.error == pytest.approx(factor * naive_error, rel=1e-12)
    assert check.passed is passes and bool(check) is passes
    # The same verdict through the relative-error form used by `simflash run` and the GPU validation.
    relative, naive_relative = relative_error(out, ref), relative_error(naive, ref)
    assert within_tolerance(3 * naive_relative, dtype, naive_relative) is False
    assert within_tolerance(1.5 * naive_relative, dtype, naive_relative) is (1.5 * naive_relative <= RELATIVE_TOLERANCE[dtype])
    assert relative > 0


def test_the_issue_s_example_errors_no_longer_pass():
    """Relative errors of 1e-3 and 3e-3 against naive's 5e-4: 2x passes, 6x fails."""
    assert within_tolerance(1e-3, "float16", 5e-4)
    assert not within_tolerance(3e-3, "float16", 5e-4)
    assert not within_tolerance(1.1e-3, "float16", 5e-4)
    assert pytest.approx(9.5367e-7, rel=1e-4) == 16 * FLOAT32_UNIT_ROUNDOFF  # 16 * 2**-24


def test_fa_rule_atol_is_sixteen_float32_roundoffs_of_max_v():
    v = np.array([[0.5, -3.0], [2.0, 1.0]])
    assert fa_rule_atol(v) == 3.0 * 16 * 2.0**-24


@pytest.mark.parametrize("n_q, n_kv, variant, rows", [
    (3, 3, "upper_left", ["100", "110", "111"]),
    (2, 4, "upper_left", ["1000", "1100"]),
    (2, 4, "lower_right", ["1110", "1111"]),
    (4, 2, "upper_left", ["10", "11", "11", "11"]),
    (4, 2, "lower_right", ["00", "00", "10", "11"]),
])
def test_reference_mask_by_hand(n_q, n_kv, variant, rows):
    expected = np.array([[c == "1" for c in row] for row in rows])
    assert np.array_equal(reference_mask(n_q, n_kv, True, variant), expected)
    assert reference_mask(n_q, n_kv, False, variant).all()


def test_reference_attention_by_hand():
    """One query, three keys, lower_right with n_q = 1 sees every key; upper_left sees only the first."""
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[0.0, 0.0], [2.0, 0.0], [0.0, 1.0]]])  # scores (scale 1): 0, 2, 0
    v = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    w = np.array([1.0, np.e**2, 1.0]) / (2 + np.e**2)
    ref = reference_attention(q, k, v, causal=True, causal_variant="lower_right", scale=1.0, dtype="float32")
    np.testing.assert_allclose(ref[0, 0], [w[0] + w[2], w[1] + w[2]], rtol=1e-15)
    first = reference_attention(q, k, v, causal=True, causal_variant="upper_left", scale=1.0, dtype="float32")
    np.testing.assert_array_equal(first[0, 0], [1.0, 0.0])
