"""Memory footprints, each with its scope: a per-head allocation is not the memory you will see.

Three families, after the lesson: the naive baseline's S and P (per head, one layer with its
heads in parallel, every layer retained for training); what the fused kernel holds instead (no S or
P in HBM, tile-sized buffers in one CTA); and the short-sequence case, where one head's S is small
next to each GPU's L2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
import numpy as np

from simflash.config import GPUS, STATE_DTYPE, StorageDtypeName, check_positive_int, gpu_spec
from simflash.memory import OnChipStats
from simflash.model.traffic import flash_traffic, naive_traffic
from simflash.onchip import DEFAULT_P_REGISTERS, check_kv_stages, cta_resources, lesson_tile_sizes


@attrs.frozen
class Footprint:
    """Bytes held under one stated scope and assumption."""

    scope: str
    assumption: str
    size_bytes: int


def intermediate_bytes_per_head(n: int, dtype: str = "float16") -> int:
    """S plus P of one head, as the naive baseline writes them to HBM (from the closed-form ledger)."""
    by_tensor = naive_traffic(n, 1, dtype).by_tensor
    return by_tensor["S"].write_bytes + by_tensor["P"].write_bytes


def intermediate_footprints(
    n: int = 4096, heads: int = 32, layers: int = 32, dtype: str = "float16",
) -> list[Footprint]:
    """The lesson's section 1.2 scopes for the naive baseline's S and P."""
    heads, layers = check_positive_int("heads", heads), check_positive_int("layers", layers)
    per_head = intermediate_bytes_per_head(n, dtype)
    return [
        Footprint("S + P, one head", f"both live in {dtype}, N = {n}", per_head),
        Footprint("Inference peak, one layer",
                  f"{heads} heads of the active layer run in parallel; S and P both live", heads * per_head),
        Footprint("Training retention, all layers",
                  f"no activation checkpointing: {layers} layers x {heads} heads kept for backprop",
                  layers * heads * per_head),
    ]


def backward_retention(
    n: int = 4096, d: int = 128, heads: int = 32, layers: int = 32, dtype: str = "float16",
) -> list[Footprint]:
    """What each forward keeps in HBM for its backward besides Q, K, V (which both keep), unmasked: per
    head, and over every layer's heads with no activation checkpointing (the lesson's section 1.2 scale).

    The lesson's 64.0 GiB counts an implementation that saves both S and P; the softmax's backward
    needs only P (dS = P o (dP - rowsum(dP o P))), which is what simflash's naive backward reads.
    FlashAttention-2 keeps the output O and the logsumexp L, and recomputes P from them."""
    heads, layers = check_positive_int("heads", heads), check_positive_int("layers", layers)
    naive = naive_traffic(n, d, dtype).by_tensor
    fused = flash_traffic(n, d, dtype=dtype, write_logsumexp=True).by_tensor
    kept = {
        "naive, S + P (the lesson's count)": (naive["S"].write_bytes + naive["P"].write_bytes, f"N x N each, {dtype}"),
        "naive, P (what its backward reads)": (naive["P"].write_bytes, f"N x N, {dtype}"),
        "FA-2, O + L": (fused["O"].write_bytes + fused["L"].write_bytes, f"O N x d in {dtype}, L N in float32"),
    }
    footprints = []
    for what, (per_head, sizes) in kept.items():
        footprints.append(Footprint(f"{what}, one head", f"{sizes}, N = {n}, d = {d}", per_head))
        footprints.append(Footprint(f"{what}, all layers",
                                    f"no activation checkpointing: {layers} layers x {heads} heads kept for backprop",
                                    layers * heads * per_head))
    return footprints


def cta_on_chip(d: int = 128, block_q: int = 128, block_kv: int = 64, dtype: StorageDtypeName = "float16",
                gpu: str = "H200", kv_stages: int = 2, p_registers: str = DEFAULT_P_REGISTERS) -> OnChipStats:
    """Peak shared-memory tiles and register state of one CTA, measured by simulating one query tile
    against kv_stages KV tiles (every K/V stage buffer filled once)."""
    from simflash.api import flash_attention  # the simulator builds on the model package, not the reverse

    d = check_positive_int("d", d)
    rng = np.random.default_rng(0)  # values do not change what one CTA holds; sizes do
    q = rng.standard_normal((check_positive_int("block_q", block_q), d))
    k, v = rng.standard_normal((2, check_positive_int("block_kv", block_kv) * kv_stages, d))
    on_chip = flash_attention(q, k, v, block_q=block_q, block_kv=block_kv, dtype=dtype, gpu=gpu, trace="none",
                              kv_stages=kv_stages, p_registers=p_registers).on_chip
    assert on_chip is not None  # fa2 measures its CTAs' occupancy
    return on_chip


def _held(buffers: Mapping[str, int]) -> str:
    return " + ".join(f"{buffer} {nbytes / 1024:g} KiB" for buffer, nbytes in buffers.items())


def fused_footprints(n: int = 4096, d: int = 128, block_q: int = 128, block_kv: int = 64,
                     dtype: StorageDtypeName = "float16",
                     gpu: str = "H200", kv_stages: int = 2, p_registers: str = DEFAULT_P_REGISTERS) -> list[Footprint]:
    """What the fused kernel holds instead: nothing quadratic in HBM, tile-sized buffers on chip.

    Shared memory and registers are those of one simulated CTA, which hold what the backend kernel
    allocates (`Flash2Kernel.shared_bytes`); the last row is the lesson's single-buffered tile set,
    with S_ij as it would be if it were stored at the storage dtype."""
    n = check_positive_int("n", n)
    block_q, block_kv = min(check_positive_int("block_q", block_q), n), min(check_positive_int("block_kv", block_kv), n)
    kv_stages = check_kv_stages(kv_stages)
    on_chip = cta_on_chip(d, block_q, block_kv, dtype, gpu, kv_stages, p_registers)  # tiles never exceed the sequence
    shared, registers = on_chip.shared, on_chip.registers
    fused = flash_traffic(n, d, block_q, block_kv, dtype).by_tensor
    resources = cta_resources(block_q, block_kv, d, dtype, kv_stages, p_registers)
    lesson = lesson_tile_sizes(block_q, block_kv, d, dtype)

    return [
        Footprint("S + P in HBM, fused kernel, one head", "never materialised off chip",
                  sum(fused[t].total_bytes for t in ("S", "P") if t in fused)),
        Footprint("Shared-memory tiles, one CTA", f"{resources.describe_shared()}: peak of {_held(shared.peak_by_buffer)}",
                  shared.peak_bytes),
        Footprint("Register state, one CTA",
                  f"peak of {_held(registers.peak_by_buffer)} ({STATE_DTYPE}; "
                  f"{'P_ij overwrites S_ij' if p_registers == 'overwrite_s' else 'P_ij in the storage dtype'}) "
                  f"over {resources.threads} threads: {resources.registers_per_thread} registers each, at least",
                  registers.peak_bytes),
        Footprint("The lesson's tile set (section 2)",
                  f"single-buffered, S_ij stored on chip: {_held(lesson)}", sum(lesson.values())),
    ]


@attrs.frozen
class L2Fit:
    """One head's score matrix S against one GPU's L2: fitting is not the same as hitting."""

    gpu: str
    n: int
    s_bytes: int
    l2_bytes: int

    @property
    def fraction_of_l2(self) -> float:
        return self.s_bytes / self.l2_bytes

    @property
    def fits(self) -> bool:
        return self.s_bytes <= self.l2_bytes


def short_sequence(n: int = 256, dtype: str = "float16", gpus: Iterable[str] = tuple(GPUS)) -> list[L2Fit]:
    """The lesson's section 6 case: one head's S at a short N against each GPU's L2 size."""
    s_bytes = naive_traffic(n, 1, dtype).by_tensor["S"].write_bytes
    return [L2Fit(gpu, n, s_bytes, gpu_spec(gpu).l2_bytes) for gpu in gpus]
