"""Byte counts: simulation == closed form == the lesson's hand-derived numbers, exactly."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import simflash as sf
from simflash.config import MiB

N, D = 4096, 128  # the lesson's configuration: fp16, B_r = 128, B_c = 64


def random_inputs(heads=1, n=N, d=D, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(3))


@pytest.fixture(scope="module")
def lesson_runs():
    q, k, v = random_inputs()
    return {
        ("naive", False): sf.naive_attention(q, k, v),
        ("naive", True): sf.naive_attention(q, k, v, causal=True),
        ("fa2", False): sf.flash_attention(q, k, v, trace="none"),
        ("fa2", True): sf.flash_attention(q, k, v, causal=True, trace="none"),
    }


def test_naive_unmasked_matches_lesson_section_1_1(lesson_runs):
    traffic = lesson_runs["naive", False].traffic
    assert (traffic.read_bytes, traffic.write_bytes, traffic.total_bytes) == (70_254_592, 68_157_440, 138_412_032)
    assert traffic.total_bytes == 132 * MiB
    by_kernel = {k: f.total_bytes for k, f in traffic.by_kernel.items()}
    assert by_kernel == {"gemm_qk": 34 * MiB, "softmax": 64 * MiB, "gemm_pv": 34 * MiB}
    assert traffic.by_tensor["S"] == sf.Flow(read_bytes=32 * MiB, write_bytes=32 * MiB)
    assert traffic == sf.model.naive_traffic(N, D)


def test_fa2_unmasked_matches_lesson_section_4_1(lesson_runs):
    traffic = lesson_runs["fa2", False].traffic
    assert (traffic.read_bytes, traffic.write_bytes) == (65 * MiB, 1 * MiB)
    assert traffic.total_bytes == 69_206_016 == 66 * MiB
    assert traffic.by_tensor["K"].read_bytes == traffic.by_tensor["V"].read_bytes == 32 * MiB
    assert "S" not in traffic.by_tensor and "P" not in traffic.by_tensor  # never in HBM: zero bytes
    assert traffic == sf.model.flash_traffic(N, D)
    assert lesson_runs["naive", False].traffic.total_bytes / traffic.total_bytes == 2.0


def test_fa2_causal_matches_lesson_section_4_2(lesson_runs):
    traffic = lesson_runs["fa2", True].traffic
    assert traffic.total_bytes == 36_700_160 == 35 * MiB
    assert (traffic.read_bytes, traffic.write_bytes) == (34 * MiB, 1 * MiB)
    assert sf.model.kv_passes(N, causal=True) == 16.5 and sf.model.kv_passes(N) == 32
    assert traffic == sf.model.flash_traffic(N, D, causal=True)


def test_causal_naive_exact_and_idealised(lesson_runs):
    exact = lesson_runs["naive", True].traffic
    assert exact == sf.model.naive_traffic(N, D, causal=True)
    triangle = N * (N + 1) // 2 * 2  # permitted entries (diagonal included) x 2 bytes
    assert exact.by_tensor["S"] == sf.Flow(read_bytes=triangle, write_bytes=triangle)
    idealised = sf.model.idealized_causal_naive_traffic(N, D)
    assert (idealised.read_bytes, idealised.write_bytes, idealised.total_bytes) == (35 * MiB, 33 * MiB, 68 * MiB)
    assert exact.total_bytes - idealised.total_bytes == 4 * (triangle - N * N)  # the diagonal, 4 crossings
    assert round(idealised.total_bytes / lesson_runs["fa2", True].traffic.total_bytes, 2) == 1.94


def test_heads_multiply_traffic():
    q, k, v = random_inputs(heads=3, n=100, d=16)
    run = sf.flash_attention(q, k, v, block_q=32, block_kv=16, trace="none")
    assert run.traffic == sf.model.flash_traffic(100, 16, 32, 16).times(3)
    assert run.traffic == sf.model.flash_traffic(100, 16, 32, 16, heads=3)


def test_logsumexp_write_adds_4_bytes_per_row():
    q, k, v = random_inputs(n=256, d=32)
    plain = sf.flash_attention(q, k, v, trace="none")
    with_lse = sf.flash_attention(q, k, v, trace="none", write_logsumexp=True)
    assert with_lse.traffic.total_bytes - plain.traffic.total_bytes == 256 * 4
    assert with_lse.traffic == sf.model.flash_traffic(256, 32, write_logsumexp=True)
    ref = np.log(np.exp((q[0].astype(np.float16).astype(np.float64) @ k[0].astype(np.float16).astype(np.float64).T)
                        / np.sqrt(32)).sum(axis=1))
    np.testing.assert_allclose(with_lse.logsumexp[0], ref, rtol=1e-5)


def test_model_is_instant_at_a_million_tokens():
    import time

    start = time.perf_counter()
    traffic = sf.model.flash_traffic(2**20, 128, causal=True)
    naive = sf.model.naive_traffic(2**20, 128, causal=True, causal_variant="lower_right")
    assert time.perf_counter() - start < 1.0
    t_r = 2**20 // 128
    kv_tiles = sum(2 * (i + 1) for i in range(t_r))  # tile i visits 2(i+1) KV tiles of 64 rows
    assert traffic.by_tensor["K"].read_bytes == kv_tiles * 64 * 128 * 2
    assert naive.by_tensor["S"].write_bytes == 2**20 * (2**20 + 1) // 2 * 2


@pytest.mark.parametrize("n_q, n_kv, variant", [(7, 7, "upper_left"), (5, 9, "upper_left"), (9, 5, "upper_left"),
                                               (5, 9, "lower_right"), (9, 5, "lower_right"), (1, 1, "lower_right")])
def test_permitted_entries_match_a_brute_force_mask(n_q, n_kv, variant):
    rows, cols = np.indices((n_q, n_kv))
    offset = 0 if variant == "upper_left" else n_kv - n_q
    brute = cols <= rows + offset  # the definition, entry by entry
    assert np.array_equal(np.tri(n_q, n_kv, k=offset, dtype=bool), brute)
    assert np.array_equal(sf.TileSchedule(n_q, n_kv, n_q, n_kv, causal=True, causal_variant=variant).mask(0, 0), brute)
    assert sf.model.permitted_entries(n_q, n_kv, True, variant) == brute.sum()


@pytest.mark.parametrize("bad", [dict(n=0), dict(d=-1), dict(dtype="float8"), dict(variant="fa3"),
                                 dict(block_q=0), dict(causal_variant="diagonal")])
def test_model_rejects_bad_arguments(bad):
    args = dict(n=64, d=16) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        sf.model.flash_traffic(**args)


def test_flops_by_kind_at_the_lesson_configuration(lesson_runs):
    """The lesson's runs against the closed form, and the counts derived by hand: naive's softmax does
    ~5 N^2 (max, subtract, exp, sum, divide) plus the scale; FA-2 adds per-tile rescales and exps."""
    T_c, T_r = N // 64, N // 128
    for (variant, causal), run in lesson_runs.items():
        assert run.flops_by_kind == sf.model.flops_by_kind(N, D, variant, causal)
        assert run.flops == run.flops_by_kind["tensor"]
    naive = lesson_runs["naive", False].flops_by_kind
    assert naive == {"tensor": 4 * N * N * D, "exp": N * N, "fp32": 4 * N * N, "div": N * N}
    fa2 = lesson_runs["fa2", False].flops_by_kind
    assert fa2["exp"] == N * N + T_c * N  # P_ij and one alpha per row per KV tile
    fa1 = sf.model.flops_by_kind(N, D, "fa1")
    assert fa1["div"] == T_c * N * D  # Algorithm 1 divides the (B_r, d) tile on every visited (j, i)
    assert fa1["exp"] == N * N + 2 * T_c * N and fa1["tensor"] == fa2["tensor"]
    assert T_r * 128 == N


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_q=st.integers(1, 30), n_kv=st.integers(1, 30), d=st.sampled_from([1, 4, 8]), block_q=st.integers(1, 12),
       block_kv=st.integers(1, 12), heads=st.integers(1, 2), causal=st.booleans(),
       causal_variant=st.sampled_from(["upper_left", "lower_right"]), variant=st.sampled_from(["naive", "fa1", "fa2"]))
def test_flops_by_kind_closed_form_equals_the_simulation(n_q, n_kv, d, block_q, block_kv, heads, causal,
                                                          causal_variant, variant):
    rng = np.random.default_rng(n_q * 131 + n_kv)
    q, k, v = rng.standard_normal((heads, n_q, d)), rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_kv, d))
    kw = dict(causal=causal, causal_variant=causal_variant, dtype="float32")
    run = (sf.naive_attention(q, k, v, **kw) if variant == "naive"
           else sf.flash_attention(q, k, v, block_q, block_kv, variant=variant, trace="none", **kw))
    assert run.flops_by_kind == sf.model.flops_by_kind(n_q, d, variant, causal, block_q, block_kv, n_kv=n_kv,
                                                       heads=heads, causal_variant=causal_variant)
