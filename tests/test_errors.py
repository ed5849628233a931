"""Bad input gets a clear error naming the argument and what was expected."""

import numpy as np
import pytest

import simflash as sf


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 16, 8)) for _ in range(3)]


@pytest.mark.parametrize("attention", [sf.flash_attention, sf.naive_attention])
class TestBadInputs:
    def test_head_dim_mismatch(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="q and k must have the same head dim"):
            attention(q, k[..., :4], v[..., :4])

    def test_k_v_shape_mismatch(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="k and v must have the same shape"):
            attention(q, k, v[:, :10])

    def test_leading_dims_mismatch(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="leading"):
            attention(q[None], np.stack([k, k]), np.stack([v, v]))  # batch 1 against batch 2

    def test_query_heads_not_a_multiple_of_kv_heads(self, attention, qkv):
        q, k, v = qkv  # 2 heads each
        with pytest.raises(ValueError, match=r"q's heads \(H_q = 3\) must be a multiple of k's and v's heads \(H_kv = 2\)"):
            attention(np.concatenate([q, q[:1]]), k, v)

    def test_window_values_below_minus_one(self, attention, qkv):
        with pytest.raises(ValueError, match=r"window must be \(left, right\), two integers >= -1"):
            attention(*qkv, window=(-2, 0))

    def test_causal_with_a_right_window(self, attention, qkv):
        with pytest.raises(ValueError, match="window's right bound must be 0 or -1 with causal=True"):
            attention(*qkv, causal=True, window=(4, 3))

    def test_too_few_dimensions(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="q must have shape"):
            attention(q[0, 0], k, v)

    def test_empty_sequence(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="k must have positive sizes"):
            attention(q, k[:, :0], v[:, :0])

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_inputs(self, attention, qkv, bad):
        q, k, v = qkv
        v[1, 3, 2] = bad
        with pytest.raises(ValueError, match="v must be finite"):
            attention(q, k, v)

    def test_overflow_of_the_storage_dtype(self, attention, qkv):
        q, k, v = qkv
        q[0, 0, 0] = 1e6
        with pytest.raises(ValueError, match="q has values beyond the range of float16"):
            attention(q, k, v)

    def test_unknown_dtype(self, attention, qkv):
        with pytest.raises(ValueError, match="dtype must be one of"):
            attention(*qkv, dtype="float8")

    def test_unknown_causal_variant(self, attention, qkv):
        with pytest.raises(ValueError, match="causal_variant must be one of"):
            attention(*qkv, causal=True, causal_variant="bottom_right")

    @pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), "big"])
    def test_bad_scale(self, attention, qkv, scale):
        with pytest.raises(ValueError, match="scale must be a finite positive number"):
            attention(*qkv, scale=scale)

    def test_non_numeric_input(self, attention, qkv):
        q, k, v = qkv
        with pytest.raises(ValueError, match="q must hold real numbers"):
            attention(q.astype(str), k, v)


def test_bfloat16_inputs_are_accepted(qkv):
    import ml_dtypes

    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in qkv)
    run = sf.flash_attention(q, k, v, dtype="bfloat16")
    np.testing.assert_array_equal(run.out, sf.flash_attention(*qkv, dtype="bfloat16").out)


def test_unknown_variant(qkv):
    with pytest.raises(ValueError, match="variant must be one of"):
        sf.flash_attention(*qkv, variant="fa3")


@pytest.mark.parametrize("name", ["block_q", "block_kv"])
@pytest.mark.parametrize("value", [0, -4, 2.5, True])
def test_bad_block_sizes(qkv, name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        sf.flash_attention(*qkv, **{name: value})


def test_unknown_trace_level(qkv):
    with pytest.raises(ValueError, match="trace must be one of"):
        sf.flash_attention(*qkv, trace="everything")


def test_trace_tiles_out_of_range(qkv):
    with pytest.raises(ValueError, match=r"trace_tiles must hold indices in \[0, 1\)"):
        sf.flash_attention(*qkv, trace_tiles=[1])


def test_oversized_default_trace_is_refused_not_truncated():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4096, 64))
    with pytest.raises(ValueError, match="trace_tiles"):
        sf.flash_attention(q, q, q, trace="full")
    run = sf.flash_attention(q[:256], q[:256], q[:256], trace="full", trace_tiles=[1])
    assert {s.i for s in run.trace} == {1}


def test_tiles_that_do_not_fit_in_sram(qkv):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((512, 256))
    with pytest.raises(sf.SRAMOverflowError, match=r"do not fit in shared memory.*block_q/block_kv"):
        sf.flash_attention(q, q, q, block_q=256, block_kv=256, trace="none")
    with pytest.raises(ValueError, match="sram_bytes must be a positive integer"):
        sf.flash_attention(*qkv, sram_bytes=0)
    with pytest.raises(sf.SRAMOverflowError, match="capacity 1 KiB"):
        sf.flash_attention(*qkv, sram_bytes=1024)


def test_unknown_gpu(qkv):
    with pytest.raises(ValueError, match="gpu must be one of"):
        sf.flash_attention(*qkv, gpu="V100")


def test_steps_generator_checks_inputs_before_the_first_step(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="head dim"):
        sf.flash_attention_steps(q, k[..., :4], v[..., :4])
