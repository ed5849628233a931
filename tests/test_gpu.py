"""The GPU kernels on a real GPU, fresh random inputs each run: output vs float64 reference (and
FlashAttention's 2x-naive rule), counted bytes vs the simulator and the closed form, m/l trace vs
the simulator, the naive three-kernel path. Skipped where CuPy or an NVIDIA GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest

import simflash as sf
from simflash.backends import flash2, naive
from simflash.backends.kernels import gpu_available
from simflash.numerics import reference_attention, relative_error, within_tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs CuPy and an NVIDIA GPU")]

CASES = [  # n_q, n_kv, d, causal, causal_variant, dtype, block_q, block_kv
    (1, 1, 64, False, "upper_left", "float16", 128, 64),
    (17, 17, 128, True, "upper_left", "bfloat16", 128, 64),
    (300, 300, 64, True, "lower_right", "float16", 64, 32),
    (333, 100, 128, True, "lower_right", "float16", 128, 64),  # early query tiles see no key
    (100, 333, 128, True, "upper_left", "bfloat16", 64, 128),
    (1000, 1000, 128, False, "upper_left", "float16", 128, 128),
]


@pytest.fixture
def rng():
    return np.random.default_rng()


def _inputs(rng, heads, n_q, n_kv, d):
    return (rng.standard_normal((heads, n_q, d), dtype=np.float32),
            rng.standard_normal((heads, n_kv, d), dtype=np.float32),
            rng.standard_normal((heads, n_kv, d), dtype=np.float32))


@pytest.mark.parametrize("version", list(flash2.VERSIONS))
@pytest.mark.parametrize(("n_q", "n_kv", "d", "causal", "variant", "dtype", "block_q", "block_kv"), CASES)
def test_fa2_kernel_matches_reference_simulator_and_model(rng, n_q, n_kv, d, causal, variant, dtype, block_q, block_kv,
                                                          version):
    q, k, v = _inputs(rng, 2, n_q, n_kv, d)
    common = dict(causal=causal, causal_variant=variant, dtype=dtype)
    tile = sf.TileSchedule(n_q, n_kv, block_q, block_kv).n_q_tiles - 1
    run = flash2.flash_attention(q, k, v, block_q, block_kv, **common, trace_head=1, trace_tile=tile, version=version)
    sim = sf.flash_attention(q, k, v, block_q, block_kv, **common, trace_heads=[1], trace_tiles=[tile])
    ref = reference_attention(q, k, v, causal, variant, dtype=dtype)

    error = relative_error(run.out, ref)
    assert np.isfinite(run.out.astype(np.float32)).all()
    assert within_tolerance(error, dtype, relative_error(sf.naive_attention(q, k, v, **common).out, ref))
    assert run.traffic == sim.traffic
    assert run.traffic == sf.model.flash_traffic(n_q, d, block_q, block_kv, dtype, causal, n_kv=n_kv, heads=2,
                                                 causal_variant=variant)
    assert [s.j for s in run.trace] == [s.j for s in sim.trace]
    for mine, theirs in zip(run.trace, sim.trace):
        np.testing.assert_allclose(mine.m, theirs.m, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(mine.l, theirs.l, rtol=1e-3)


@pytest.mark.parametrize("version", list(flash2.VERSIONS))
def test_timed_build_writes_the_same_bits_and_counts_nothing(rng, version):
    q, k, v = _inputs(rng, 3, 257, 190, 64)
    counted = flash2.flash_attention(q, k, v, causal=True, causal_variant="lower_right", version=version)
    timed = flash2.flash_attention(q, k, v, causal=True, causal_variant="lower_right", instrumented=False,
                                   version=version)
    assert np.array_equal(counted.out.view(np.uint16), timed.out.view(np.uint16))
    assert timed.traffic is None and counted.traffic.total_bytes > 0


@pytest.mark.parametrize(("causal", "variant", "dtype"),
                         [(False, "upper_left", "float16"), (True, "upper_left", "bfloat16"),
                          (True, "lower_right", "float16")])
def test_naive_path_materialises_s_and_p_with_the_models_bytes(rng, causal, variant, dtype):
    n_q, n_kv, d, heads = 130, 200, 64, 2
    q, k, v = _inputs(rng, heads, n_q, n_kv, d)
    run = naive.naive_attention(q, k, v, causal, variant, dtype=dtype)
    ref = reference_attention(q, k, v, causal, variant, dtype=dtype)
    assert within_tolerance(relative_error(run.out, ref), dtype)
    model = sf.model.naive_traffic(n_q, d, dtype, causal, n_kv=n_kv, heads=heads, causal_variant=variant)
    dense = sf.model.naive_traffic(n_q, d, dtype, False, n_kv=n_kv, heads=heads)
    for key, flow in run.traffic.ledger.items():
        # The softmax moves exactly the permitted entries; cuBLAS's GEMMs are dense.
        assert flow == (model.ledger[key] if key[0] == "softmax" else dense.ledger[key])
    if not causal:
        assert run.traffic == model


def test_a_row_of_s_too_long_for_shared_memory_is_refused(rng):
    q, k, v = _inputs(rng, 1, 1, 150_000, 64)
    with pytest.raises(ValueError, match="needs .* bytes of shared memory per CTA; this GPU allows"):
        naive.naive_attention(q, k, v)


def test_sdpa_check_sees_the_fused_flash_kernel():
    pytest.importorskip("torch")
    from simflash.backends.sdpa import sdpa_check

    result = sdpa_check(256, 64, causal=True, heads=2)
    verdicts = {entry["backend"]: entry["verdict"] for entry in result["backends"]}
    assert verdicts["FLASH_ATTENTION"] == "fused" and verdicts["MATH"] == "math"
    assert all(verdict != "FALLBACK TO MATH" for verdict in verdicts.values())
