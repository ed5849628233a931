"""The whole-chip model of Flash-Decoding (simflash.model.decode_chip): its programs move the closed
form's bytes, and the L2 turns them into DRAM bytes where a block is read again."""

from __future__ import annotations

import pytest

import simflash as sf
from simflash.model.decode_chip import COMBINE_KERNEL, SPLIT_KERNEL, predict_decode_dram


@pytest.mark.parametrize("kwargs", [
    dict(n_kv=32768, d=128, heads=32, kv_heads=8),
    dict(n_kv=4096, d=128, batch=16, heads=32, kv_heads=8, num_splits=2),
    dict(n_kv=3000, d=64, batch=2, heads=8, kv_heads=2, pack_gqa=False, num_splits=5),
    dict(n_kv=2000, d=128, batch=3, heads=8, kv_heads=1, n_q=4, num_splits=3, cache_seqlens=(2000, 999, 1),
         causal=True),
    dict(n_kv=3000, d=64, heads=8, kv_heads=4, n_q=20, num_splits=2, window=(700, -1)),
    dict(n_kv=1000, d=128, heads=8, kv_heads=8, n_q=5, num_splits=1, window=(100, 100)),
])
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_the_programs_move_the_closed_form_s_logical_bytes(kwargs, cache):
    predicted = predict_decode_dram(**kwargs, cache=cache)
    c = predicted.config
    ledger = sf.model.flash_decoding_traffic(
        kwargs["n_kv"], kwargs["d"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"], n_q=c["n_q"],
        num_splits=c["num_splits"], block_kv=c["block_kv"], pack_gqa=c["pack_gqa"],
        cache_seqlens=kwargs.get("cache_seqlens"), causal=kwargs.get("causal", False),
        window=kwargs.get("window", (-1, -1))).ledger
    seen = {}
    for kernel in predicted.kernels:
        for tensor, flow in kernel.by_tensor.items():
            seen[kernel.kernel, tensor] = (flow.read_bytes, flow.write_bytes)
            assert flow.dram_read_bytes + flow.hit_bytes == flow.read_bytes  # DRAM: what the L2 did not serve
    assert seen == {key: (flow.read_bytes, flow.write_bytes) for key, flow in ledger.items()}
    assert [k.kernel for k in predicted.kernels] == [SPLIT_KERNEL] + [COMBINE_KERNEL] * (c["num_splits"] > 1)


def test_packed_k_and_v_far_beyond_the_l2_come_from_dram_once_as_the_ledger_says():
    # 1 x 8 K/V heads at 128k: 512 MiB of K/V, each tile read by one CTA only
    predicted = predict_decode_dram(131072, 128, heads=32, kv_heads=8, num_splits=29)
    split = predicted.kernel(SPLIT_KERNEL)
    assert (split.ctas, split.resident_ctas) == (232, 264)  # 8 K/V heads x 29 splits; two CTAs an SM
    for tensor in ("K", "V"):
        flow = split.by_tensor[tensor]
        assert flow.dram_read_bytes == flow.read_bytes == 8 * 131072 * 128 * 2 and flow.hit_bytes == 0
    # Q_i: the 29 split CTAs of a K/V head read the same 4 packed rows; the first from DRAM
    assert split.by_tensor["Q"].read_bytes == 29 * 32 * 128 * 2
    assert split.by_tensor["Q"].dram_read_bytes == 32 * 128 * 2
    # the partials stay in the L2, dirty, at the split kernel's end; flushed (cold), the combine reads them
    assert split.flow.dram_write_bytes == 0 and split.flow.dirty_at_end_bytes == split.flow.write_bytes
    combine = predicted.kernel(COMBINE_KERNEL)
    assert combine.ctas == 32 and combine.flow.dram_read_bytes == combine.flow.read_bytes


def test_unpacked_query_heads_of_a_group_share_their_k_and_v_through_the_l2():
    logical = sf.model.flash_decoding_traffic(32768, 128, heads=32, kv_heads=8, num_splits=7, block_kv=64,
                                              pack_gqa=False)
    kv = logical.by_tensor["K"].read_bytes + logical.by_tensor["V"].read_bytes
    # 224 CTAs, all resident: the 4 CTAs of a group read each tile together, the first from DRAM
    split = predict_decode_dram(32768, 128, heads=32, kv_heads=8, num_splits=7, pack_gqa=False).kernel(SPLIT_KERNEL)
    dram = split.by_tensor["K"].dram_read_bytes + split.by_tensor["V"].dram_read_bytes
    assert split.ctas == 224 and dram * 4 == kv
    # 928 CTAs on 264 slots: a group's CTAs are 29 apart in launch order, some of them in another wave;
    # the L2 still serves most re-reads, not all
    split = predict_decode_dram(32768, 128, heads=32, kv_heads=8, num_splits=29, pack_gqa=False).kernel(SPLIT_KERNEL)
    dram = split.by_tensor["K"].dram_read_bytes + split.by_tensor["V"].dram_read_bytes
    assert split.ctas == 928 and kv // 4 < dram < kv // 2


def test_warm_the_combine_finds_the_partials_where_the_split_kernel_left_them():
    cold, warm = (predict_decode_dram(32768, 128, heads=32, kv_heads=8, cache=cache) for cache in ("cold", "warm"))
    assert cold.kernel(COMBINE_KERNEL).flow.dram_read_bytes == cold.kernel(COMBINE_KERNEL).flow.read_bytes > 0
    assert warm.kernel(COMBINE_KERNEL).flow.dram_read_bytes == 0
    assert warm.kernel(SPLIT_KERNEL).flow == cold.kernel(SPLIT_KERNEL).flow  # both start from an empty L2


def test_the_default_split_count_is_the_gpu_backend_s():
    # FA-2's heuristic on the backend's 64-row KV tiles at d = 128 (512 tiles at 32k), 8 CTA heads
    assert predict_decode_dram(32768, 128, heads=32, kv_heads=8).config["num_splits"] == sf.model.num_splits_heuristic(
        8, 264, 512)


@pytest.mark.parametrize(("kwargs", "argument"), [(dict(cache="hot"), "cache"), (dict(d=96), "d"),
                                                  (dict(kv_heads=3), "heads"), (dict(pack_gqa=1), "pack_gqa")])
def test_bad_arguments_are_refused_by_name(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        predict_decode_dram(**{"n_kv": 1024, "d": 128, "heads": 8, "kv_heads": 2, **kwargs})
