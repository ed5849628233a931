"""The whole chip a kernel runs on: how many CTAs are resident at once, and its L2.

A kernel implementation is described by what the occupancy rules need (threads, registers, shared
memory per CTA) and the order it launches its query tiles in. Two FA-2 implementations are known:
simflash's own CUDA kernel (backends/flash2_forward.cu) and FlashAttention-2 as PyTorch SDPA ships it.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from simflash.algorithms import flash2
from simflash.algorithms.naive import GEMM_TILE_ROWS, KERNELS
from simflash.config import GPUSpec
from simflash.l2 import L2, L2Cache, L2Mixture, L2Sets
from simflash.occupancy import occupancy


@attrs.frozen
class KernelProfile:
    """One FA-2 kernel implementation, as the occupancy rules and the L2 see it."""

    name: str
    threads: Callable[[int, int, int], int]  # (block_q, block_kv, d) -> threads per CTA
    registers: Callable[[int], int]  # d -> registers per thread
    shared_bytes: Callable[[int, int, int, int], int]  # (block_q, block_kv, d, itemsize) -> per CTA
    longest_first: bool  # blockIdx.x = T_r - 1 - i (longest causal rows first)
    kv_descending: bool  # each CTA walks its KV tiles from the last down
    spills: bool  # compiled with a stack frame in local memory: its DRAM writes include spills
    tiles: Callable[[int], tuple[int, int]]  # d -> the (block_q, block_kv) it uses by default


KERNEL_PROFILES = {
    # backends/flash2_forward.cu: one warp per 16 query rows; Q_i and double-buffered K_j, V_j in
    # shared memory; registers as the compiler gave them (`simflash gpu info` on the H200).
    "simflash": KernelProfile(
        "simflash", threads=lambda bq, bkv, d: bq // 16 * 32, registers=lambda d: 232 if d > 64 else 128,
        shared_bytes=lambda bq, bkv, d, b: (bq + 4 * bkv) * d * b, longest_first=True, kv_descending=False,
        spills=False, tiles=lambda d: (128, 64)),
    # FlashAttention-2 in PyTorch (Flash_fwd_kernel_traits<d, 128, 64 or 128, 4 warps>, as ncu names the
    # kernel): Q_i, K_j and V_j in shared memory, 255 registers and a stack frame (spills); query tiles
    # in ascending order, each CTA's KV tiles from the last down (flash_fwd_kernel.h).
    "sdpa_flash": KernelProfile(
        "sdpa_flash", threads=lambda bq, bkv, d: 128, registers=lambda d: 255,
        shared_bytes=lambda bq, bkv, d, b: (bq + 2 * bkv) * d * b, longest_first=False,
        kv_descending=True, spills=True, tiles=lambda d: (128, 64) if d > 64 else (128, 128)),
}


def kernel_profile(name: str) -> KernelProfile:
    try:
        return KERNEL_PROFILES[name]
    except KeyError:
        raise ValueError(f"kernel must be one of {sorted(KERNEL_PROFILES)}, got {name!r}") from None


def resident_ctas(gpu: GPUSpec, profile: KernelProfile, block_q: int, block_kv: int, d: int, itemsize: int) -> int:
    """CTA slots on the whole chip for this kernel and tile configuration."""
    shared = profile.shared_bytes(block_q, block_kv, d, itemsize)
    if shared > gpu.max_shared_bytes_per_cta:
        raise ValueError(f"block_q={block_q} and block_kv={block_kv} at d={d}, {itemsize}-byte elements need "
                         f"{shared} bytes of shared memory per CTA of the {profile.name} kernel, over the "
                         f"{gpu.name}'s {gpu.max_shared_bytes_per_cta}: expected smaller tiles")
    occ = occupancy(gpu, profile.threads(block_q, block_kv, d), profile.registers(d), shared)
    return occ.cta_slots_per_sm * gpu.sm_count


def gemm_pv_wave_rows(gpu: GPUSpec) -> int:
    """Rows of O one wave of cuBLAS's P V GEMM computes: a CTA of GEMM_TILE_ROWS rows on every SM (its
    tile's operand stages fill the SM's shared memory)."""
    return gpu.sm_count * GEMM_TILE_ROWS


# backends/naive_softmax.cu: a CTA of 256 threads a row of S, the row in shared memory beside 96 bytes of reduction
# scratch, 32 registers a thread as the H200's compiler gave them (benchmarks/gpu/naive_warm/softmax_lead.json).
SOFTMAX_THREADS, SOFTMAX_REGISTERS, SOFTMAX_STATIC_SHARED_BYTES = 256, 32, 96


def softmax_resident_rows(gpu: GPUSpec, n_kv: int, itemsize: int) -> int:
    """Rows of S the naive softmax holds at once on the whole chip: one CTA a row, as many an SM as the occupancy
    rules allow (8 on the H200, by its threads, up to rows of 14,000 16-bit scores)."""
    shared = n_kv * itemsize + SOFTMAX_STATIC_SHARED_BYTES
    if shared > gpu.max_shared_bytes_per_cta:
        raise ValueError(f"n_kv={n_kv}: the naive softmax holds a row of S in shared memory, {shared} bytes, over the "
                         f"{gpu.name}'s {gpu.max_shared_bytes_per_cta} a CTA: expected n_kv of at most "
                         f"{(gpu.max_shared_bytes_per_cta - SOFTMAX_STATIC_SHARED_BYTES) // itemsize}")
    occ = occupancy(gpu, SOFTMAX_THREADS, SOFTMAX_REGISTERS, shared)
    return occ.cta_slots_per_sm * gpu.sm_count


def kernel_figures(gpu: GPUSpec, figure: str) -> dict[str, float]:
    """An L2 figure the machine file gives kernels of their own (`l2_<kernel>_<figure>`), by kernel."""
    return {kernel: gpu.calibration[f"l2_{kernel}_{figure}"] for kernel in (*KERNELS, flash2.KERNEL)
            if f"l2_{kernel}_{figure}" in gpu.calibration}


def l2_cache(gpu: GPUSpec) -> L2:
    """The L2 one kernel's stream sees: the fitted effective capacity, read-fill and cohort weights, flush residue
    where the machine file has them, the nameplate size (plain LRU) otherwise; divided into hashed sets where
    the machine file gives a set count (each set an LRU of its share, the flush residue shared alike), or an
    equal mixture of LRU caches a capacity spread smaller and larger than the effective one."""
    capacity = gpu.calibration.get("l2_effective_bytes", gpu.l2_bytes)
    spread = gpu.calibration.get("l2_capacity_spread_bytes", 0.0)
    sets = int(gpu.calibration.get("l2_sets", 1))
    window = gpu.calibration.get("l2_dirty_read_window_bytes")

    def lru(size: float) -> L2Cache:
        return L2Cache(size, gpu.calibration.get("l2_read_fill_weight", 1.0),
                       int(gpu.calibration.get("l2_flush_residue_bytes", 0)) // sets,
                       gpu.calibration.get("l2_residue_ramp_bytes", 0.0) / sets,
                       gpu.calibration.get("l2_cohort_weight", 1.0), kernel_figures(gpu, "read_weight"),
                       kernel_figures(gpu, "clean_age_factor"), kernel_figures(gpu, "write_weight"),
                       None if window is None else window * size / capacity)  # a set sees its share of the reads

    if sets > 1:
        return L2Sets(tuple(lru(capacity / sets) for _ in range(sets)), int(gpu.calibration["l2_stripe_bytes"]))
    return L2Mixture((lru(capacity - spread), lru(capacity + spread))) if spread else lru(capacity)
