"""Outputs against the float64 reference; byte counts against the closed form; trace invariants."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import simflash as sf
from simflash.numerics import RELATIVE_TOLERANCE, reference_attention, relative_error, value_scale, within_tolerance

DTYPES = ["float16", "bfloat16", "float32"]


def random_qkv(rng, heads, n_q, n_kv, d, magnitude=1.0):
    q = magnitude * rng.standard_normal((heads, n_q, d))
    k = magnitude * rng.standard_normal((heads, n_kv, d))
    return q, k, rng.standard_normal((heads, n_kv, d))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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

    # -- numerics: the dtype's tolerance and, for 16-bit storage, at most 2x naive's error
    scale = value_scale(v, ref)  # tiny random problems can cancel to ~0: measure against V's size
    error, naive_error = relative_error(run.out, ref, scale), relative_error(naive.out, ref, scale)
    assert within_tolerance(error, dtype, naive_error), (error, naive_error)
    assert run.out.dtype == sf.config.STORAGE_DTYPES[dtype] and run.out.shape == q.shape
    assert np.isfinite(run.out.astype(np.float32)).all()

    # -- bytes: simulation == closed form, exactly
    model_kw = dict(n_kv=n_kv, heads=heads, causal_variant=causal_variant)
    assert run.traffic == sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, **model_kw)
    assert naive.traffic == sf.model.naive_traffic(n_q, d, dtype, causal, **model_kw)

    # -- trace: one step per visited tile; the last step of each tile is the output; l > 0 where a key is visible
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal, causal_variant)
    assert len(run.trace) == heads * sum(len(sched.kv_tiles(i)) for i in range(sched.n_q_tiles))
    visible = sched.__class__(n_q, n_kv, n_q, n_kv, causal, causal_variant).mask(0, 0).any(axis=1)
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
