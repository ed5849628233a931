"""How many CTAs fit on one SM at once, by the CUDA occupancy calculator's rules.

Each SM resource allows some number of resident CTAs; the smallest wins (the rules of
cudaOccMaxActiveBlocksPerMultiprocessor in the CUDA toolkit's cuda_occupancy.h):

    threads        max_threads_per_sm // threads_per_cta
    warps          max_warps_per_sm // warps, with warps = ceil(threads_per_cta / 32)
    registers      a warp gets registers_per_thread * 32 registers, rounded up to
                   register_alloc_unit_per_warp; each of the SM's sub-partitions holds a share of
                   the register file and a whole number of warps, so the SM holds
                   sub_partitions_per_sm * (registers_per_sm / sub_partitions_per_sm // registers_per_warp)
                   warps, and that // warps CTAs
    shared memory  shared_bytes_per_sm // round_up(shared_bytes_per_cta + shared_reserved_bytes_per_cta,
                   shared_alloc_unit_bytes), against the largest carve-out
    ctas           max_ctas_per_sm
"""

from __future__ import annotations

import attrs
import numpy as np

from simflash.config import GPUSpec, check_positive_int

WARP_THREADS = 32

# The limits in the order they are reported: on a tie, limited_by names the first.
LIMITS = ("threads", "warps", "registers", "shared memory", "ctas")

# Each argument's largest value for one CTA, by GPUSpec field.
CTA_MAXIMUMS = {
    "threads_per_cta": "max_threads_per_cta", "registers_per_thread": "max_registers_per_thread",
    "shared_bytes_per_cta": "max_shared_bytes_per_cta",
}

# The argument whose size each limit measures, for the error when a limit admits no CTA.
LIMIT_ARGUMENTS = {
    "threads": "threads_per_cta", "warps": "threads_per_cta", "registers": "registers_per_thread",
    "shared memory": "shared_bytes_per_cta",
}


@attrs.frozen
class Occupancy:
    cta_slots_per_sm: int  # CTAs resident on one SM at once
    limited_by: str  # the first of LIMITS that allows only cta_slots_per_sm
    ctas_per_sm_by_limit: dict[str, int]  # CTAs per SM each limit alone allows, keyed by LIMITS


def _check_non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(gpu: GPUSpec, threads_per_cta: int, registers_per_thread: int, shared_bytes_per_cta: int) -> Occupancy:
    """CTA slots per SM for a kernel's launch shape; ValueError for a CTA that cannot fit on an SM at all."""
    if not isinstance(gpu, GPUSpec):
        raise ValueError(f"gpu must be a GPUSpec (such as simflash.GPUS['H200']), got {gpu!r}")
    threads_per_cta = check_positive_int("threads_per_cta", threads_per_cta)
    registers_per_thread = check_positive_int("registers_per_thread", registers_per_thread)
    shared_bytes_per_cta = _check_non_negative_int("shared_bytes_per_cta", shared_bytes_per_cta)
    arguments = {"threads_per_cta": threads_per_cta, "registers_per_thread": registers_per_thread,
                 "shared_bytes_per_cta": shared_bytes_per_cta}
    for argument, maximum in CTA_MAXIMUMS.items():
        if arguments[argument] > getattr(gpu, maximum):
            raise ValueError(f"{argument}={arguments[argument]} is over the {gpu.name}'s {maximum} of "
                             f"{getattr(gpu, maximum)}")

    warps_per_cta = -(-threads_per_cta // WARP_THREADS)
    registers_per_warp = _round_up(registers_per_thread * WARP_THREADS, gpu.register_alloc_unit_per_warp)
    warps_per_sub_partition = gpu.registers_per_sm // gpu.sub_partitions_per_sm // registers_per_warp
    shared_bytes_allocated = _round_up(shared_bytes_per_cta + gpu.shared_reserved_bytes_per_cta,
                                       gpu.shared_alloc_unit_bytes)
    ctas_per_sm_by_limit = {
        "threads": gpu.max_threads_per_sm // threads_per_cta,
        "warps": gpu.max_warps_per_sm // warps_per_cta,
        "registers": warps_per_sub_partition * gpu.sub_partitions_per_sm // warps_per_cta,
        "shared memory": gpu.shared_bytes_per_sm // shared_bytes_allocated,
        "ctas": gpu.max_ctas_per_sm,
    }
    limited_by = min(LIMITS, key=ctas_per_sm_by_limit.__getitem__)  # min keeps the first of equals
    if ctas_per_sm_by_limit[limited_by] == 0:
        argument = LIMIT_ARGUMENTS[limited_by]
        raise ValueError(
            f"{argument}={arguments[argument]} does not fit on one SM of the {gpu.name}: its {limited_by} limit "
            f"admits no CTA of {threads_per_cta} threads x {registers_per_thread} registers "
            f"with {shared_bytes_per_cta} shared bytes")
    return Occupancy(ctas_per_sm_by_limit[limited_by], limited_by, ctas_per_sm_by_limit)


def resident_ctas(gpu: GPUSpec, occ: Occupancy) -> int:
    """CTAs resident on the whole chip at once: one wave."""
    return occ.cta_slots_per_sm * gpu.sm_count


def waves(n_ctas: int, gpu: GPUSpec, occ: Occupancy) -> float:
    """How many full chips' worth of resident CTAs a grid of n_ctas makes (1.5: one wave and a half)."""
    return check_positive_int("n_ctas", n_ctas) / resident_ctas(gpu, occ)
