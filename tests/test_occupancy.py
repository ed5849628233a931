"""CTA slots per SM, derived by hand from the CUDA occupancy rules.

The H200 cases agree, limit by limit, with cudaOccMaxActiveBlocksPerMultiprocessor (cuda_occupancy.h,
CUDA 13) fed the device properties read from a real H200: a sweep of 4080 launch shapes (up to 1024
threads, 255 registers per thread and 227 KiB + 1 byte of shared memory) agreed in every case, the
CTAs it refuses included.

The H200 figures used: 2048 threads, 64 warps, 32 CTAs, 65536 registers in 4 sub-partitions of
16384, registers allocated per warp in units of 256, 228 KiB = 233472 bytes of shared memory, of
which each CTA's share is rounded up to 128 bytes after adding 1 KiB reserved for the system.
"""

import numpy as np
import pytest

import simflash as sf
from simflash.config import KiB
from simflash.occupancy import LIMITS, Occupancy, occupancy, resident_ctas, waves

H200 = sf.GPUS["H200"]


def test_shared_memory_limits():
    # 256 threads = 8 warps. threads: 2048 // 256 = 8; warps: 64 // 8 = 8.
    # registers: 64 x 32 = 2048 per warp; 16384 // 2048 = 8 warps per sub-partition, 32 per SM; 32 // 8 = 4.
    # shared: 98 KiB + 1 KiB reserved = 101376 bytes (a multiple of 128); 233472 // 101376 = 2.
    occ = occupancy(H200, threads_per_cta=256, registers_per_thread=64, shared_bytes_per_cta=98 * KiB)
    assert occ == Occupancy(2, "shared memory",
                            {"threads": 8, "warps": 8, "registers": 4, "shared memory": 2, "ctas": 32})


def test_a_tie_names_the_first_limit_in_order():
    # As above with 128 registers: 4096 per warp; 16384 // 4096 = 4 warps per sub-partition, 16 per SM;
    # 16 // 8 = 2, the same as shared memory's 2. limited_by names the first of LIMITS: registers.
    occ = occupancy(H200, threads_per_cta=256, registers_per_thread=128, shared_bytes_per_cta=98 * KiB)
    assert occ.cta_slots_per_sm == 2 and occ.limited_by == "registers"
    assert occ.ctas_per_sm_by_limit["shared memory"] == 2
    assert LIMITS.index("registers") < LIMITS.index("shared memory")


def test_registers_limit():
    # 128 threads = 4 warps. registers: 255 x 32 = 8160, rounded up to a multiple of 256: 8192 per warp
    # (as if 256 per thread). 16384 // 8192 = 2 warps per sub-partition, 8 per SM; 8 // 4 = 2 CTAs.
    # shared: 64 KiB + 1 KiB = 66560 bytes; 233472 // 66560 = 3. threads: 2048 // 128 = 16; warps: 64 // 4 = 16.
    occ = occupancy(H200, threads_per_cta=128, registers_per_thread=255, shared_bytes_per_cta=64 * KiB)
    assert occ == Occupancy(2, "registers",
                            {"threads": 16, "warps": 16, "registers": 2, "shared memory": 3, "ctas": 32})


def test_registers_are_allocated_per_sub_partition():
    # 96 threads = 3 warps of 96 x 32 = 3072 registers. Each sub-partition holds 16384 // 3072 = 5 warps
    # (not 5.33), so the SM holds 20 warps and 20 // 3 = 6 CTAs. Pooling all 65536 registers would
    # give 65536 // (3 x 3072) = 7: the sub-partitions cost one CTA here.
    occ = occupancy(H200, threads_per_cta=96, registers_per_thread=96, shared_bytes_per_cta=0)
    assert occ.cta_slots_per_sm == 6 and occ.limited_by == "registers"


def test_threads_limit():
    # 1024 threads = 32 warps. threads: 2048 // 1024 = 2; warps: 64 // 32 = 2;
    # registers: 32 x 32 = 1024 per warp; 16384 // 1024 = 16 per sub-partition, 64 per SM; 64 // 32 = 2.
    # shared: 0 + 1 KiB reserved; 233472 // 1024 = 228. Three limits tie at 2; threads comes first.
    occ = occupancy(H200, threads_per_cta=1024, registers_per_thread=32, shared_bytes_per_cta=0)
    assert occ == Occupancy(2, "threads",
                            {"threads": 2, "warps": 2, "registers": 2, "shared memory": 228, "ctas": 32})


def test_warps_limit():
    # 100 threads take 4 whole warps. threads: 2048 // 100 = 20; warps: 64 // 4 = 16;
    # registers: 16 x 32 = 512 per warp; 16384 // 512 = 32 per sub-partition, 128 per SM; 128 // 4 = 32.
    occ = occupancy(H200, threads_per_cta=100, registers_per_thread=16, shared_bytes_per_cta=0)
    assert occ.cta_slots_per_sm == 16 and occ.limited_by == "warps"
    assert occ.ctas_per_sm_by_limit["threads"] == 20


def test_ctas_limit():
    # 32 threads = 1 warp. threads: 64; warps: 64; registers: 512 per warp, 128 warps per SM; 128;
    # shared: 228. The SM's 32 CTA slots are the limit.
    occ = occupancy(H200, threads_per_cta=32, registers_per_thread=16, shared_bytes_per_cta=0)
    assert occ == Occupancy(32, "ctas",
                            {"threads": 64, "warps": 64, "registers": 128, "shared memory": 228, "ctas": 32})


def test_shared_memory_rounds_up_to_the_allocation_unit():
    # 1 byte + 1 KiB reserved = 1025, rounded up to 1152; 233472 // 1152 = 202.
    assert occupancy(H200, 32, 16, 1).ctas_per_sm_by_limit["shared memory"] == 202


def test_the_largest_cta_fits_once():
    # 227 KiB + 1 KiB reserved = 228 KiB: exactly the carve-out.
    occ = occupancy(H200, threads_per_cta=256, registers_per_thread=32, shared_bytes_per_cta=227 * KiB)
    assert occ.cta_slots_per_sm == 1 and occ.limited_by == "shared memory"


def test_a100_has_a_smaller_carve_out():
    a100 = sf.GPUS["A100"]
    assert occupancy(a100, 256, 32, 163 * KiB).cta_slots_per_sm == 1
    with pytest.raises(ValueError, match="shared_bytes_per_cta=167936 is over the A100 80GB SXM's "
                                         "max_shared_bytes_per_cta of 166912"):
        occupancy(a100, 256, 32, 164 * KiB)


class TestRefusals:
    def test_too_much_shared_memory(self):
        with pytest.raises(ValueError, match="shared_bytes_per_cta=235520 is over the H200 SXM's "
                                             "max_shared_bytes_per_cta of 232448"):
            occupancy(H200, threads_per_cta=128, registers_per_thread=64, shared_bytes_per_cta=230 * KiB)

    def test_too_many_threads(self):
        with pytest.raises(ValueError, match="threads_per_cta=1025 is over the H200 SXM's max_threads_per_cta of 1024"):
            occupancy(H200, 1025, 32, 0)

    def test_too_many_registers_per_thread(self):
        with pytest.raises(ValueError, match="registers_per_thread=256 is over the H200 SXM's "
                                             "max_registers_per_thread of 255"):
            occupancy(H200, 128, 256, 0)

    def test_register_file_too_small_for_the_cta(self):
        # 1024 threads x 255 registers: 32 warps of 8192; a sub-partition holds 2 of them, the SM 8.
        with pytest.raises(ValueError, match="registers_per_thread=255 does not fit on one SM of the H200 SXM: "
                                             "its registers limit admits no CTA"):
            occupancy(H200, 1024, 255, 0)


@pytest.mark.parametrize("argument, value", [
    ("threads_per_cta", 0), ("threads_per_cta", True), ("threads_per_cta", 128.0), ("threads_per_cta", "128"),
    ("registers_per_thread", -1), ("registers_per_thread", False),
    ("shared_bytes_per_cta", -1), ("shared_bytes_per_cta", True), ("shared_bytes_per_cta", 1024.0),
])
def test_bad_arguments(argument, value):
    arguments = {"threads_per_cta": 128, "registers_per_thread": 64, "shared_bytes_per_cta": 0, argument: value}
    with pytest.raises(ValueError, match=f"{argument} must be a"):
        occupancy(H200, **arguments)


def test_numpy_integers_are_integers():
    assert occupancy(H200, np.int64(128), np.int32(255), np.int64(64 * KiB)) == occupancy(H200, 128, 255, 64 * KiB)


def test_gpu_must_be_a_spec():
    with pytest.raises(ValueError, match="gpu must be a GPUSpec"):
        occupancy("H200", 128, 64, 0)


def test_resident_ctas_and_waves():
    occ = occupancy(H200, threads_per_cta=128, registers_per_thread=255, shared_bytes_per_cta=64 * KiB)
    assert resident_ctas(H200, occ) == 2 * 132
    assert waves(264, H200, occ) == 1.0
    assert waves(396, H200, occ) == 1.5
    assert waves(1, H200, occ) == 1 / 264
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="n_ctas must be a positive integer"):
            waves(bad, H200, occ)
