"""The comparisons `simflash run` and `simflash run --backward` render (simflash.comparison,
simflash.backward_comparison): rows, matched baselines and derived numbers against the closed forms."""

import attrs
import pytest

import simflash as sf
from simflash.backward_comparison import compare_backward, recomputed_s_flops
from simflash.comparison import compare

N, D, BLOCK_Q, BLOCK_KV = 96, 16, 32, 16


@pytest.fixture(scope="module")
def comparison():
    return compare(N, D, "float32", BLOCK_Q, BLOCK_KV, heads=2, seed=0, fa1_o_accum="float32")


def test_rows_in_order_each_against_its_matched_baseline(comparison):
    assert [r.name for r in comparison.rows] == [
        "naive, unmasked", "fa2, unmasked", "fa1 (O in float32), unmasked",
        "naive, causal", "naive, causal, idealised N^2/2 (model)", "fa2, causal", "fa1 (O in float32), causal"]
    assert comparison.passed and all(r.model_matches is not False for r in comparison.rows)
    for row in comparison.rows:
        naive = sf.model.naive_traffic(N, D, "float32", row.causal, heads=2)
        assert row.baseline_bytes == (naive.total_bytes if row.model_matches is not None
                                      else row.traffic.total_bytes)
    fa2 = next(r for r in comparison.rows if r.name == "fa2, causal")
    closed = sf.model.flash_traffic(N, D, BLOCK_Q, BLOCK_KV, "float32", True, heads=2)
    assert fa2.traffic == closed
    assert fa2.reduction == sf.model.naive_traffic(N, D, "float32", True, heads=2).total_bytes / closed.total_bytes


def test_derived_numbers_of_the_tables(comparison):
    idealised = sf.model.idealized_causal_naive_traffic(N, D, "float32", heads=2).total_bytes
    assert comparison.idealised.traffic.total_bytes == idealised
    assert [(r.name, ratio) for r, ratio in comparison.versus_idealised()] == [
        (r.name, idealised / r.traffic.total_bytes) for r in comparison.rows[5:]]
    state = {r.name: set(tensors) for r, tensors in comparison.output_and_state_traffic()}
    assert state["fa2, unmasked"] == {"O"}
    assert {"O", "l", "m"} <= state["fa1 (O in float32), unmasked"]
    flops = dict((r.name, ratio) for r, ratio in comparison.flops_versus_naive())
    assert flops["naive, unmasked"] == flops["naive, causal"] == 1.0 and flops["fa2, unmasked"] > 1
    assert "naive, causal, idealised N^2/2 (model)" not in flops
    assert list(comparison.naive_kernels) == ["gemm_qk", "softmax", "gemm_pv"]
    assert comparison.kv_passes == (sf.model.kv_passes(N, BLOCK_Q, BLOCK_KV),
                                    sf.model.kv_passes(N, BLOCK_Q, BLOCK_KV, causal=True))
    assert comparison.to_dict()["fa1_o_accum_dtype"] == "float32"


def test_one_row_sequence_has_no_error_ratio_to_divide_by():
    """n = 1: every output equals its one value row exactly, naive's error is 0, and no ratio is made of it."""
    comparison = compare(1, 4, "float16", 1, 1, heads=1, seed=0)
    assert all(r.error in (None, 0.0) and r.versus_naive is None for r in comparison.rows)
    assert comparison.passed


def test_backward_comparison_pairs_and_ratios():
    comparison = compare_backward(64, 16, "float32", 32, 16, 32, 64, heads=1, seed=0)
    assert comparison.passed
    for causal in (False, True):
        naive, flash = comparison.pair(causal)
        assert (naive.algorithm, flash.algorithm, naive.causal, flash.causal) == ("naive", "fa2", causal, causal)
        assert comparison.versus_naive(naive) == 1.0
        assert comparison.versus_naive(flash) == naive.total_bytes / flash.total_bytes
        assert flash.error_ratios == {g: flash.errors[g] / naive.errors[g] for g in ("dq", "dk", "dv")}
        assert recomputed_s_flops(flash) == flash.backward_flops["tensor"] // 5
        assert flash.elementwise_flops == sum(
            f[kind] for f in (flash.forward_flops, flash.backward_flops) for kind in ("fp32", "div"))
    assert comparison.to_dict()["kept_for_backward"] == [
        attrs.asdict(f) for f in sf.model.footprint.backward_retention(64, 16, dtype="float32")]
