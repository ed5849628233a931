"""The GPU kernels on a real GPU, fresh random inputs each run: output vs float64 reference (and
FlashAttention's 2x-naive rule), counted bytes vs the simulator and the closed form, m/l trace vs
the simulator, the naive three-kernel path; grouped-query heads and windows (and the logsumexp L the
forward writes for the backward); the Flash-Decoding kernels against the reference, the simulator and
its closed form; the backward's gradients vs float64 (the same rule, and SDPA flash's), its counted
bytes vs the ledger. Skipped where CuPy or an NVIDIA GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest

import simflash as sf
from simflash.backends import flash2, naive
from simflash.backends.flash2_backward import flash_attention_backward
from simflash.backends.kernels import DECODE_BLOCK_KV, gpu_available
from simflash.backends.validate import equal_bytes
from simflash.backends.validate_backward import (
    BackwardConfig,
    defined_traffic,
    gradient_atol,
    model_traffic,
    naive_backward,
    reference_backward,
    sdpa_gradients,
)
from simflash.config import STORAGE_DTYPES as STORAGE
from simflash.numerics import fa_rule, max_abs_error, reference_attention, relative_error, upcast, within_tolerance

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


@pytest.mark.parametrize(("version", "n_q", "n_kv", "d", "causal", "variant", "dtype", "block_q", "block_kv"),
                         [(version, *case) for version in flash2.VERSIONS for case in CASES
                          if flash2.builds(version, case[6], case[7], case[2])])
def test_fa2_kernel_matches_reference_simulator_and_model(rng, version, n_q, n_kv, d, causal, variant, dtype, block_q,
                                                          block_kv):
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
    with pytest.raises(ValueError, match=r"needs .* bytes of shared memory per CTA; this GPU allows"):
        naive.naive_attention(q, k, v)


def test_sdpa_check_sees_the_fused_flash_kernel():
    pytest.importorskip("torch")
    from simflash.backends.sdpa import sdpa_check

    result = sdpa_check(256, 64, causal=True, heads=2)
    verdicts = {entry["backend"]: entry["verdict"] for entry in result["backends"]}
    assert verdicts["FLASH_ATTENTION"] == "fused" and verdicts["MATH"] == "math"
    assert all(verdict != "FALLBACK TO MATH" for verdict in verdicts.values())


BACKWARD_CASES = [  # n_q, n_kv, d, causal, causal_variant, dtype, block_q
    (1, 1, 64, False, "upper_left", "float16", 64),
    (200, 200, 64, True, "upper_left", "float16", 64),
    (333, 100, 128, True, "lower_right", "bfloat16", 64),  # early query rows see no key
    (100, 333, 128, True, "upper_left", "float16", 64),  # late KV tiles seen by no query tile
    (300, 777, 64, False, "upper_left", "bfloat16", 128),
]


@pytest.mark.parametrize(("n_q", "n_kv", "d", "causal", "variant", "dtype", "block_q"), BACKWARD_CASES)
def test_backward_kernels_match_float64_within_the_2x_naive_rule_and_count_the_ledger(
        rng, n_q, n_kv, d, causal, variant, dtype, block_q):
    q, k, v = _inputs(rng, 2, n_q, n_kv, d)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    common = dict(causal=causal, causal_variant=variant, dtype=dtype)
    run = flash_attention_backward(q, k, v, do, block_q, 128, **common)
    _, _, *ref = reference_backward(q, k, v, do, **common)
    naive = naive_backward(q, k, v, do, **common)
    atol = gradient_atol(upcast(v, dtype), upcast(do, dtype))
    for name, mine, theirs, exact in zip(("dq", "dk", "dv"), (run.dq, run.dk, run.dv), naive, ref):
        assert np.isfinite(mine.astype(np.float32)).all(), name
        assert max_abs_error(mine, exact) <= 2 * max_abs_error(theirs, exact) + atol, name
    assert run.traffic == defined_traffic(n_q, n_kv, d, block_q, 128, dtype, causal, variant, heads=2)
    model = model_traffic(BackwardConfig(n_q, n_kv, d, 2, causal, variant, dtype, block_q=block_q))
    assert model is None or run.traffic == model
    sim = sf.flash_attention(q, k, v, 128, 64, **common, write_logsumexp=True, trace="none")
    assert run.forward.traffic == sim.traffic
    np.testing.assert_allclose(run.forward.logsumexp, sim.logsumexp, rtol=1e-4)  # +inf where a row sees no key


def test_backward_timed_build_writes_the_same_dk_dv_and_counts_nothing(rng):
    q, k, v = _inputs(rng, 3, 257, 190, 64)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    counted = flash_attention_backward(q, k, v, do, causal=True, causal_variant="lower_right")
    timed = flash_attention_backward(q, k, v, do, causal=True, causal_variant="lower_right", instrumented=False)
    # each CTA owns its KV tile: dK, dV bit for bit; dQ is summed by atomics in no fixed order
    assert np.array_equal(counted.dk.view(np.uint16), timed.dk.view(np.uint16))
    assert np.array_equal(counted.dv.view(np.uint16), timed.dv.view(np.uint16))
    np.testing.assert_allclose(counted.dq.astype(np.float32), timed.dq.astype(np.float32), rtol=1e-2, atol=1e-3)
    assert timed.traffic is None and counted.traffic.total_bytes > 0


@pytest.mark.parametrize(("causal", "dtype"), [(False, "float16"), (True, "bfloat16")])
def test_backward_kernels_agree_with_sdpa_flash_backward(rng, causal, dtype):
    pytest.importorskip("torch")
    q, k, v = _inputs(rng, 2, 512, 512, 128)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    common = dict(causal=causal, dtype=dtype)
    run = flash_attention_backward(q, k, v, do, **common)
    sdpa = sdpa_gradients(q, k, v, do, causal, 1 / np.sqrt(128), dtype)
    _, _, *ref = reference_backward(q, k, v, do, **common)
    naive = naive_backward(q, k, v, do, **common)
    atol = gradient_atol(upcast(v, dtype), upcast(do, dtype))
    for mine, theirs, slow, exact in zip((run.dq, run.dk, run.dv), sdpa, naive, ref):
        bound = 2 * max_abs_error(slow, exact) + atol
        # ours within the rule, and SDPA's within twice its slack of ours
        assert max_abs_error(mine, exact) <= bound and max_abs_error(mine, theirs) <= 2 * bound


@pytest.mark.parametrize(("kv_heads", "pack_gqa", "window", "causal", "variant", "dtype"),
                         [(2, False, (256, 0), False, "upper_left", "float16"),
                          (2, True, (128, 128), False, "lower_right", "bfloat16"),
                          (1, True, (-1, -1), True, "lower_right", "float16"),
                          (8, False, (-1, 0), False, "upper_left", "bfloat16")])
def test_fa2_kernel_takes_grouped_query_heads_and_windows(rng, kv_heads, pack_gqa, window, causal, variant, dtype):
    q = rng.standard_normal((2, 8, 300, 64), dtype=np.float32)
    k, v = (rng.standard_normal((2, kv_heads, 700, 64), dtype=np.float32) for _ in range(2))
    common = dict(causal=causal, causal_variant=variant, dtype=dtype, window=window, pack_gqa=pack_gqa)
    run = flash2.flash_attention(q, k, v, **common)
    sim = sf.flash_attention(q, k, v, **common, trace="none")
    naive_out = sf.naive_attention(q, k, v, causal=causal, causal_variant=variant, dtype=dtype, window=window).out
    ref = reference_attention(q, k, v, causal, variant, dtype=dtype, window=window)
    assert fa_rule(run.out, naive_out, ref, v.astype(STORAGE[dtype]))
    assert run.traffic == sim.traffic == sf.model.flash_traffic(
        300, 64, causal=causal, n_kv=700, heads=16, causal_variant=variant, window=window, kv_heads=2 * kv_heads,
        pack_gqa=pack_gqa, dtype=dtype)


@pytest.mark.parametrize(("batch", "kv_heads", "n_q", "num_splits", "pack_gqa", "cache_seqlens", "causal", "window", "d"),
                         [(1, 2, 1, None, True, None, False, (-1, -1), 128),
                          (2, 8, 1, 32, True, (4096, 100), False, (-1, -1), 128),
                          (3, 1, 4, 5, True, (1, 1500, 4096), True, (256, 0), 64),
                          (2, 4, 8, 1, False, (8, 4096), True, (-1, -1), 128)])
def test_flash_decoding_kernels_match_reference_simulator_and_model(rng, batch, kv_heads, n_q, num_splits, pack_gqa,
                                                                    cache_seqlens, causal, window, d):
    from simflash.backends.decoding import flash_decoding, split_schedule

    q = rng.standard_normal((batch, 8, n_q, d), dtype=np.float32)
    k, v = (rng.standard_normal((batch, kv_heads, 4096, d), dtype=np.float32) for _ in range(2))
    splits = split_schedule(batch, 8 * batch, kv_heads * batch, n_q, 4096, d, num_splits, None, pack_gqa).num_splits
    common = dict(pack_gqa=pack_gqa, cache_seqlens=cache_seqlens, causal=causal, window=window)
    run = flash_decoding(q, k, v, splits, **common)
    timed = flash_decoding(q, k, v, splits, **common, instrumented=False)
    sim = sf.flash_decoding(q, k, v, splits, DECODE_BLOCK_KV[d][0], **common)
    seqlens = cache_seqlens or (4096,) * batch
    masks = dict(causal=causal, causal_variant="lower_right", window=window)
    ref = np.stack([reference_attention(q[b], k[b, :, :n], v[b, :, :n], **masks) for b, n in enumerate(seqlens)])
    naive_out = np.stack([sf.naive_attention(q[b], k[b, :, :n], v[b, :, :n], **masks).out for b, n in enumerate(seqlens)])
    assert fa_rule(run.out, naive_out, ref, v.astype(np.float16))
    assert np.array_equal(run.out.view(np.uint16), timed.out.view(np.uint16))
    assert equal_bytes(run.traffic, sim.traffic)
    assert equal_bytes(run.traffic, sf.model.flash_decoding_traffic(
        4096, d, batch=batch, heads=8, kv_heads=kv_heads, n_q=n_q, num_splits=splits, block_kv=DECODE_BLOCK_KV[d][0],
        pack_gqa=pack_gqa, cache_seqlens=cache_seqlens, causal=causal, window=window))


def test_a_decode_step_captured_in_a_cuda_graph_writes_what_the_eager_launches_write(rng):
    import cupy

    from simflash.backends.decoding import DecodePath, split_schedule

    q = rng.standard_normal((8, 1, 128), dtype=np.float32).astype(np.float16)
    k, v = (rng.standard_normal((2, 3000, 128), dtype=np.float32).astype(np.float16) for _ in range(2))
    Q, K, V = (cupy.asarray(x).view(cupy.uint16) for x in (q, k, v))
    sched = split_schedule(1, 8, 2, 1, 3000, 128, 7)
    eager, captured = (DecodePath(Q, K, V, 1, sched, 128 ** -0.5) for _ in range(2))
    eager.run()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        captured.run()
        graph = stream.end_capture()
    assert np.isnan(captured.O_partial.get()).all()  # captured, not run
    graph.launch(stream)
    stream.synchronize()
    assert np.array_equal(captured.O.get(), eager.O.get()) and not np.isnan(captured.O_partial.get()).any()


def test_logsumexp_follows_o_s_rows_with_packed_grouped_query_heads(rng):
    q = rng.standard_normal((2, 8, 300, 64), dtype=np.float32)
    k, v = (rng.standard_normal((2, 2, 700, 64), dtype=np.float32) for _ in range(2))
    common = dict(causal=True, causal_variant="lower_right", window=(128, 0), pack_gqa=True)
    run = flash2.flash_attention(q, k, v, **common, write_logsumexp=True)
    sim = sf.flash_attention(q, k, v, **common, write_logsumexp=True, trace="none")
    assert run.logsumexp.shape == q.shape[:-1]
    np.testing.assert_allclose(run.logsumexp, sim.logsumexp, rtol=1e-4)
    assert run.traffic == sim.traffic  # ("flash2_forward", "L"): n_q x 4 bytes per query head
