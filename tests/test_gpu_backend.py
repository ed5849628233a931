"""The GPU backend's CPU side: kernel sources, the nvcc build for sm_90, configuration refusals,
the Nsight Compute CSV parser and the SDPA kernel classifier. No GPU needed."""

from __future__ import annotations

import importlib.resources
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simflash.backends import flash2, flash2_backward, naive, profile, sdpa
from simflash.backends.kernels import (
    BACKWARD_BLOCK_KV,
    BACKWARD_BLOCK_Q,
    BACKWARD_HEAD_DIMS,
    BLOCK_KV,
    BLOCK_Q,
    DECODE_BLOCK_KV,
    DECODE_SLICES,
    HEAD_DIMS,
    STORAGE_TYPES,
    DecodeCombineKernel,
    DecodeSplitKernel,
    Flash2BackwardKernels,
    Flash2Kernel,
    SoftmaxKernel,
    decode_slices,
    kernel_source,
)


KERNEL_FILES = (("flash2_forward.cu", "flash2_forward"), ("naive_softmax.cu", "naive_softmax"),
                ("flash_decoding_split.cu", "flash_decoding_split"), ("flash_decoding_combine.cu", "flash_decoding_combine"),
                ("flash2_backward_preprocess.cu", "flash2_backward_preprocess"),
                ("flash2_backward.cu", "flash2_backward"), ("flash2_backward_convert.cu", "flash2_backward_convert"))


@pytest.mark.parametrize(("name", "kernel"), KERNEL_FILES)
def test_sources_ship_as_package_data_with_includes_inlined_once(name, kernel):
    text = kernel_source(name)
    assert "__global__ void __launch_bounds__" in text and f" {kernel}(" in text
    assert '#include "' not in text  # NVRTC sees one string
    assert "mma.sync.aligned.m16n8k16" in text  # ptx.cuh came along
    assert text.count("struct Storage<FLOAT16>") == 1  # once, though flash2_tile.cuh includes it too


def test_name_expressions_and_shared_memory_follow_the_configuration():
    kernel = Flash2Kernel("bfloat16", 64, 128, 128, instrumented=True)
    assert kernel.name_expression == "flash2_forward<1, 64, 128, 128, true>"
    assert kernel.threads == 64 // 16 * 32
    assert kernel.shared_bytes == (64 + 2 * 2 * 128) * 128 * 2  # Q_i, then K_j and V_j double-buffered
    assert SoftmaxKernel("float16").name_expression == "naive_softmax<0, false>"
    backward = Flash2BackwardKernels("bfloat16", 64, 128, 64, instrumented=True)
    assert backward.name_expressions == ("flash2_backward_preprocess<1, 64, 64, true>",
                                         "flash2_backward<1, 64, 128, 64, true>", "flash2_backward_convert<1, true>")
    assert backward.threads == 128 // 16 * 32  # a warp per 16 rows of the KV tile
    # K_j, V_j; Q_i, dO_i double-buffered; P_ij, dS_ij: 2 bytes a value
    assert backward.shared_bytes == (2 * 128 * 64 + 4 * 64 * 64 + 2 * 64 * 128) * 2
    assert Flash2BackwardKernels(d=128).shared_bytes == 160 * 1024  # fits the H200's 227 KiB; B_r = 128 would not
    split = DecodeSplitKernel("bfloat16", 64, 256, 2, instrumented=True)
    assert split.name_expression == "flash_decoding_split<1, 256, 64, 2, true>"  # FA-2's 256-row KV tiles at d = 64
    assert split.shared_bytes == (64 + 3 * 2 * 256) * 64 * 2  # Q_i, then 3 stages of K_j and V_j
    # the default tiles: Q_i and the stages fit twice in an H200 SM (228 KiB, 1 KiB reserved per CTA)
    assert all(2 * (DecodeSplitKernel(d=d, block_kv=tiles[0]).shared_bytes + 1024) <= 228 * 1024
               for d, tiles in DECODE_BLOCK_KV.items())
    assert DecodeCombineKernel("float16", 128).name_expression == "flash_decoding_combine<0, 128, false>"
    assert DecodeCombineKernel.shared_bytes(7) == 7 * 4  # a weight per split


def test_a_decode_tile_s_warps_share_its_row_groups():
    assert [decode_slices(rows) for rows in (1, 4, 16, 17, 32, 33, 64)] == [4, 4, 4, 2, 2, 1, 1]


def test_the_split_kernel_is_set_up_once_with_the_largest_carveout(monkeypatch):
    from simflash.backends import kernels

    calls = []

    class Function:
        preferred_shared_memory_carveout = None

    def fit(kernel, dynamic_bytes, what):
        calls.append(dynamic_bytes)
        return kernel

    monkeypatch.setattr(kernels, "compiled", lambda source, name: Function())
    monkeypatch.setattr(kernels, "_fit_shared", fit)
    kernels._decode_split_function.cache_clear()
    split = DecodeSplitKernel("float16", 128, 64, 4)
    first = split.function()
    # two CTAs' stages on an SM, as the split heuristic counts; no attribute call at a later launch
    assert all(split.function() is first for _ in range(3))
    assert calls == [split.shared_bytes] and first.preferred_shared_memory_carveout == 100
    kernels._decode_split_function.cache_clear()


def test_the_whole_chip_model_launches_the_decode_kernels_as_the_backend_does():
    from simflash.backends import kernels
    from simflash.model import decode_chip

    assert {d: tiles[0] for d, tiles in DECODE_BLOCK_KV.items()} == decode_chip.BLOCK_KV
    assert (decode_chip.STAGES, decode_chip.THREADS) == (kernels.DECODE_STAGES, kernels.DECODE_THREADS)
    for d, block_kv in decode_chip.BLOCK_KV.items():
        profile = decode_chip.SPLIT_PROFILE
        assert profile.shared_bytes(kernels.DECODE_BLOCK_Q, block_kv, d, 2) == DecodeSplitKernel(
            d=d, block_kv=block_kv).shared_bytes
        assert profile.threads(kernels.DECODE_BLOCK_Q, block_kv, d) == kernels.DECODE_THREADS


def test_a_graph_of_decode_steps_rotates_through_four_l2s_of_inputs_in_whole_rounds():
    from simflash.backends.decode_bench import DecodeBenchConfig, Inputs, graph_steps

    l2 = 60 * 2**20
    buffer = np.empty(8 * 131072 * 128, dtype=np.uint16)  # 1 x 8 K/V heads at 128k
    inputs = Inputs(buffer, buffer, None, l2)
    # 128 MiB of K/V a copy at 32k: two copies pass 4 L2s; 512 MiB at 128k: one is enough
    assert inputs.copies(DecodeBenchConfig(1, 32, 8, 32768)) == 2
    assert inputs.copies(DecodeBenchConfig(1, 32, 8, 131072)) == 1
    # 0.5 MiB at 1 x 1 head, 1k: 480 copies, as many as the buffer holds (far more here)
    assert inputs.copies(DecodeBenchConfig(1, 4, 1, 1024)) == 480
    assert Inputs(buffer[:4 * 1024 * 128], buffer, None, l2).copies(DecodeBenchConfig(1, 4, 1, 1024)) == 4
    assert graph_steps(2, 0.04) == 50 and graph_steps(480, 0.01) == 480 and graph_steps(1, 4.0) == 4
    assert graph_steps(3, 0.5) == 6  # 4 steps wanted, rounded up to whole rounds of 3


@pytest.mark.parametrize(
    ("change", "argument"),
    [(dict(d=96), "d"), (dict(block_q=100), "block_q"), (dict(block_kv=48), "block_kv"),
     (dict(dtype="float32"), "dtype"), (dict(block_q=True), "block_q")],
)
def test_configurations_not_built_are_refused_naming_the_argument(change, argument):
    kwargs = dict(dtype="float16", block_q=128, block_kv=64, d=64) | change
    with pytest.raises(ValueError, match=rf"^{argument} must be one of .* for the GPU kernel"):
        Flash2Kernel(**kwargs)


@pytest.mark.parametrize(
    ("change", "argument"),
    [(dict(d=256), "d"), (dict(block_q=32), "block_q"), (dict(block_kv=64), "block_kv"), (dict(dtype="float32"), "dtype")],
)
def test_backward_configurations_not_built_are_refused_naming_the_argument(change, argument):
    kwargs = dict(dtype="float16", block_q=64, block_kv=128, d=64) | change
    with pytest.raises(ValueError, match=rf"^{argument} must be one of .* for the GPU kernel"):
        Flash2BackwardKernels(**kwargs)


def test_flash_attention_checks_inputs_before_touching_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # any CuPy import now fails
    q = np.random.default_rng().standard_normal((2, 40, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="d must be one of"):
        flash2.flash_attention(q[..., :48], q[..., :48], q[..., :48])
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash2.flash_attention(q, q, q[:, :10])
    with pytest.raises(ValueError, match="need instrumented=True"):
        flash2.flash_attention(q, q, q, instrumented=False, trace_head=0, trace_tile=0)
    with pytest.raises(ValueError, match=r"trace_head must be in \[0, 2\)"):
        flash2.flash_attention(q, q, q, trace_head=2, trace_tile=0)
    with pytest.raises(ValueError, match="naive GPU path"):
        naive.naive_attention(q, q, q, dtype="float32")
    with pytest.raises(RuntimeError, match=r"needs CuPy.*simflash\[cuda13\]"):
        flash2.flash_attention(q, q, q)
    with pytest.raises(ValueError, match="write_logsumexp must be True or False"):
        flash2.flash_attention(q, q, q, write_logsumexp="yes")


def test_flash_attention_backward_checks_inputs_before_touching_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 40, 64), dtype=np.float32)
    with pytest.raises(ValueError, match=r"do must have the shape of q \(2, 40, 64\), got \(2, 40, 32\)"):
        flash2_backward.flash_attention_backward(q, q, q, q[..., :32])
    with pytest.raises(ValueError, match="do must be finite"):
        flash2_backward.flash_attention_backward(q, q, q, np.full_like(q, np.nan))
    with pytest.raises(ValueError, match="do has values beyond the range of float16"):
        flash2_backward.flash_attention_backward(q, q, q, np.full_like(q, 1e6))
    with pytest.raises(ValueError, match="as many heads as q"):
        flash2_backward.flash_attention_backward(q, q[:1], q[:1], q)
    with pytest.raises(ValueError, match="d must be one of"):
        flash2_backward.flash_attention_backward(q[..., :48], q[..., :48], q[..., :48], q[..., :48])
    with pytest.raises(ValueError, match="causal must be True or False"):
        flash2_backward.flash_attention_backward(q, q, q, q, causal=1)
    with pytest.raises(RuntimeError, match=r"needs CuPy"):
        flash2_backward.flash_attention_backward(q, q, q, q)


def test_the_supported_set_is_what_the_docs_promise():
    assert list(STORAGE_TYPES) == ["float16", "bfloat16"]
    assert HEAD_DIMS == (64, 128, 256) and BLOCK_Q == (64, 128) and BLOCK_KV == (32, 64, 128)
    assert 128 in BLOCK_Q and 64 in BLOCK_KV  # the simulator's default tiles are built
    assert BACKWARD_HEAD_DIMS == (64, 128) and BACKWARD_BLOCK_Q == (64, 128) and BACKWARD_BLOCK_KV == (128,)
    assert Flash2BackwardKernels().block_q == 64 and Flash2BackwardKernels().block_kv == 128  # the API's default
    assert DECODE_BLOCK_KV == {64: (128, 256), 128: (64, 128)} and DECODE_SLICES == (1, 2, 4)


@pytest.mark.parametrize(("kernel", "change", "argument"),
                         [(DecodeSplitKernel, dict(d=256), "d"), (DecodeSplitKernel, dict(slices=3), "slices"),
                          (DecodeSplitKernel, dict(d=64, block_kv=64), "block_kv"),
                          (DecodeCombineKernel, dict(dtype="float32"), "dtype")])
def test_decode_configurations_not_built_are_refused_naming_the_argument(kernel, change, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must be one of .* for the GPU kernel"):
        kernel(**change)


INSTANTIATIONS = [
    Flash2Kernel(dtype, 128, 64 if d <= 128 else 32, d, instrumented)
    for dtype in STORAGE_TYPES for d in HEAD_DIMS for instrumented in (False, True)
] + [Flash2Kernel("float16", 64, 32, 64), Flash2Kernel("bfloat16", 64, 128, 64)]
# d = 256 is built with B_c = 32: its accumulator alone takes 128 registers per thread, and wider
# KV tiles spill.
# B_c = 128 at d = 128 holds 64 fp32 scores per thread besides the 64 of a_i: ptxas spills there
# (40 to 140 bytes); the validation records every kernel's local memory.
SIGNATURE = ("(const storage_t*, const storage_t*, const storage_t*, storage_t*, int, int, float, int, int, int, int, "
             "int, u64*, int, int, float*, float*, float*)")
SPLIT_SIGNATURE = ("(const storage_t*, const storage_t*, const storage_t*, storage_t*, float*, float*, const int*, int, "
                   "int, float, int, int, int, int, int, int, u64*)")
SPLITS = [DecodeSplitKernel(dtype, d, block_kv, slices, instrumented) for dtype in STORAGE_TYPES
          for d, tiles in DECODE_BLOCK_KV.items() for block_kv in tiles for slices in DECODE_SLICES
          for instrumented in (False, True)]
COMBINES = [DecodeCombineKernel(dtype, d, instrumented) for dtype in STORAGE_TYPES for d in DECODE_BLOCK_KV
            for instrumented in (False, True)]
# The backward's: every instantiation validated or timed, both builds. B_r = 128 at d = 128 needs 256 KiB of
# shared memory and is refused at launch, so it is not built here.
BACKWARD_INSTANTIATIONS = [
    Flash2BackwardKernels(dtype, block_q, 128, d, instrumented)
    for dtype in STORAGE_TYPES for block_q, d in ((64, 64), (64, 128), (128, 64)) for instrumented in (False, True)
]
BACKWARD_SIGNATURES = ("(const storage_t*, const storage_t*, float*, float*, int, u64*)",
                       "(const storage_t*, const storage_t*, const storage_t*, const storage_t*, const float*, "
                       "const float*, float*, storage_t*, storage_t*, int, int, float, int, int, u64*)",
                       "(const float*, storage_t*, long long, u64*)")


def _backward_units(source: str) -> list[str]:
    """Explicit instantiations of one backward source for BACKWARD_INSTANTIATIONS, each once."""
    which = ("flash2_backward_preprocess.cu", "flash2_backward.cu", "flash2_backward_convert.cu").index(source)
    expressions = dict.fromkeys(k.name_expressions[which] for k in BACKWARD_INSTANTIATIONS)
    return [f"template __global__ void {expression}{BACKWARD_SIGNATURES[which]};" for expression in expressions]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize(
    ("source", "instantiations"),
    [("flash2_forward.cu", [f"template __global__ void {k.name_expression}{SIGNATURE};" for k in INSTANTIATIONS]),
     ("naive_softmax.cu", [f"template __global__ void naive_softmax<{dt}, {b}>(const storage_t*, storage_t*, int, "
                           f"int, int, int, u64*);" for dt in (0, 1) for b in ("false", "true")]),
     ("flash_decoding_split.cu", [f"template __global__ void {k.name_expression}{SPLIT_SIGNATURE};" for k in SPLITS]),
     ("flash_decoding_combine.cu", [f"template __global__ void {k.name_expression}(const float*, const float*, "
                                    f"storage_t*, int, int, u64*);" for k in COMBINES]),
     *((source, _backward_units(source))
       for source in ("flash2_backward_preprocess.cu", "flash2_backward.cu", "flash2_backward_convert.cu"))],
)
def test_nvcc_builds_the_kernels_for_sm90_without_spills(tmp_path, source, instantiations):
    package = Path(str(importlib.resources.files("simflash.backends")))
    unit = tmp_path / "unit.cu"
    unit.write_text(f'#include "{source}"\n' + "\n".join(instantiations) + "\n")
    done = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", f"-I{package}", "-o",
                           str(tmp_path / "unit.cubin"), str(unit)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert len(spills) == len(instantiations)
    assert all(stores == "0" and loads == "0" for stores, loads in spills), done.stderr[-3000:]


NCU_CSV = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","nvjet_gemm_a","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,024"
"0","1","python3","h","nvjet_gemm_a","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","2,048"
"0","1","python3","h","nvjet_gemm_a","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1000"
"1","1","python3","h","splitk_reduce","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","10"
"1","1","python3","h","splitk_reduce","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","n/a"
"2","1","python3","h","void naive_softmax<0, 0>(const unsigned short *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","64"
"3","1","python3","h","nvjet_gemm_b","1","7","(128, 1, 1)","(4, 4, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","5"
"4","1","python3","h","void flash2_forward<0, 128, 64, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","7"
"5","1","python3","h","void flash2_forward<0, 128, 64, 128, 0>(const unsigned short *)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","9"
==PROF== Disconnected from process 1
'''


def test_ncu_csv_is_parsed_in_launch_order_with_thousands_separators_and_missing_values():
    kernels = profile.parse_ncu_csv(NCU_CSV)
    assert [k["name"][:12] for k in kernels] == ["nvjet_gemm_a", "splitk_reduc", "void naive_s", "nvjet_gemm_b",
                                                  "void flash2_", "void flash2_"]
    assert kernels[0]["metrics"] == {"dram__bytes_read.sum": 1024.0, "dram__bytes_write.sum": 2048.0,
                                     "gpu__time_duration.sum": 1000.0}
    assert kernels[1]["metrics"] == {"dram__bytes_read.sum": 10.0}  # "n/a" left out, not zero


def test_kernels_are_assigned_to_stages_by_position_around_our_named_kernels():
    kernels = profile.parse_ncu_csv(NCU_CSV)
    configs = [profile.ProfileConfig(64, naive=True), profile.ProfileConfig(64, naive=False)]
    first, second = profile.assign_stages(kernels, configs)
    assert [k["name"] for k in first["gemm_qk"]] == ["nvjet_gemm_a", "splitk_reduce"]  # cuBLAS may launch two
    assert [k["name"] for k in first["gemm_pv"]] == ["nvjet_gemm_b"]
    assert first["flash2_forward"][0]["metrics"]["dram__bytes_read.sum"] == 7
    assert second["flash2_forward"][0]["metrics"]["dram__bytes_read.sum"] == 9
    with pytest.raises(RuntimeError, match="left over"):
        profile.assign_stages(kernels, configs[:1])
    with pytest.raises(RuntimeError, match="expected a naive_softmax kernel"):
        profile.assign_stages(kernels[3:], configs[:1])


def test_measured_bytes_add_up_over_a_stage_and_sectors_become_bytes():
    metrics = {"dram_read_bytes": "dram__bytes_read.sum", "dram_write_bytes": "dram__bytes_write.sum",
               "l2_sm_read_sectors": "r", "l2_sm_write_sectors": "w", "l2_sm_read_hit_sectors": "h",
               "time_ns": "gpu__time_duration.sum"}
    kernels = [{"name": "a", "metrics": {"dram__bytes_read.sum": 3, "dram__bytes_write.sum": 4, "r": 10, "w": 2, "h": 5,
                                         "gpu__time_duration.sum": 7}},
               {"name": "b", "metrics": {"dram__bytes_read.sum": 1, "r": 10, "h": 10}}]
    measured = profile._measured(kernels, metrics)
    assert measured["dram_bytes"] == 3 + 4 + 1
    assert measured["l2_sm_bytes"] == (10 + 2 + 10) * profile.SECTOR_BYTES
    assert measured["l2_read_hit_rate"] == pytest.approx(15 / 20)
    assert measured["time_ns"] == 7


def test_profile_configurations_are_checked():
    with pytest.raises(ValueError, match="d must be one of"):
        profile.ProfileConfig(4096, d=80)
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        profile.ProfileConfig(4096, heads=0)
    sweep = profile.sweep_configs()
    assert {c.heads for c in sweep} >= {1, 2, 4, 8, 16, 32, 64}
    assert {c.n for c in sweep} >= {1024, 4096, 16384} and any(c.causal for c in sweep)
    assert all(c.naive == (c.n <= 8192) for c in sweep)


@pytest.mark.parametrize(
    ("backend", "kernels", "verdict"),
    [("FLASH_ATTENTION", ["void pytorch_flash::flash_fwd_kernel<...>"], "fused"),
     ("EFFICIENT_ATTENTION", ["fmha_cutlassF_f16_aligned_64x128_rf_sm80"], "fused"),
     ("FLASH_ATTENTION", ["sm90_xmma_gemm_f16", "cunn_SoftMaxForward", "sm90_xmma_gemm_f16"], "FALLBACK TO MATH"),
     ("MATH", ["sm90_xmma_gemm_f16", "cunn_SoftMaxForward"], "math")],
)
def test_sdpa_kernel_names_are_classified(backend, kernels, verdict):
    assert sdpa.classify(backend, kernels) == verdict


def test_docs_tables_are_refilled_in_place_and_unknown_ones_refused():
    from simflash.backends.report import update_page

    tables = {"a": (["x"], [["1"]]), "b": (["y", "z"], [["2", "a|b"]])}
    page = "intro\n<!-- gpu-table: a -->\n<!-- /gpu-table -->\ntext\n<!-- gpu-table: b -->\nstale\n<!-- /gpu-table -->\n"
    once = update_page(page, tables)
    assert once == ("intro\n<!-- gpu-table: a -->\n| x |\n|---|\n| 1 |\n<!-- /gpu-table -->\ntext\n"
                    "<!-- gpu-table: b -->\n| y | z |\n|---|---|\n| 2 | a/b |\n<!-- /gpu-table -->\n")
    assert update_page(once, tables) == once
    with pytest.raises(ValueError, match=r"\['c'\]"):
        update_page("<!-- gpu-table: c -->\n<!-- /gpu-table -->\n", tables)


def test_version_2_writes_no_logsumexp_and_says_so():
    q = np.ones((1, 8, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="v2 writes no logsumexp"):
        flash2.flash_attention(q, q, q, version="v2", write_logsumexp=True)
