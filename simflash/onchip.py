"""What one FlashAttention-2 CTA holds on chip, as the backend kernel allocates it, and which tiles fit.

backends/flash2_forward.cu (and `flash2_cta`) keep, per CTA of B_r query rows:

    shared memory   Q_i (B_r, d) and kv_stages x (K_j, V_j) (B_c, d) at the storage dtype; the kernel
                    double-buffers K and V (kv_stages = 2: K_{j+1}, V_{j+1} load while tile j computes)
    registers       m_i, l_i (B_r,), a_i (B_r, d) and S_ij (B_r, B_c), all float32; P_ij overwrites
                    S_ij in the same registers, so it costs nothing more (p_registers="overwrite_s", kernel
                    versions 1 and 2), or P_ij (B_r, B_c) in the storage dtype has registers of its own,
                    kept until the next tile's S_ij is done (p_registers="own", version 3, FlashAttention-3:
                    the P V product of tile j runs beside S_{i,j+1} = Q_i K_{j+1}^T)

over B_r / 16 warps (one warp per 16 query rows; `Flash2Kernel.threads`). The register count is the
state's share per thread: a lower bound on what the compiler gives the kernel, which also needs
addresses, loop counters and the Q_i fragments (`simflash gpu info` reads the real count).

`tile_candidates` walks B_r and B_c in steps of 16 and reports, for each B_r, the largest B_c that fits
a GPU's shared memory per CTA and register file, and which limit stops the next B_c.
"""

from __future__ import annotations

import attrs

from simflash.config import KiB, STATE_DTYPE, GPUSpec, check_positive_int, gpu_spec, storage_dtype
from simflash.memory import SRAMOverflowError

KV_STAGES = (1, 2)
DEFAULT_KV_STAGES = 2  # the backend kernel double-buffers K_j and V_j
P_REGISTERS = ("overwrite_s", "own")  # where P_ij waits for the P V product (see the module's text)
DEFAULT_P_REGISTERS = "overwrite_s"
TILE_STEP = 16  # B_r and B_c are multiples of 16 on the tensor cores (one m16n8k16 fragment)
WARP_ROWS = 16  # query rows per warp
WARP_THREADS = 32
REGISTER_BYTES = 4  # one 32-bit register

# The limits a tile configuration can break, in the order they are checked and reported.
LIMITS = ("threads per CTA", "shared memory per CTA", "registers per thread", "register file")


class TileFitError(SRAMOverflowError):
    """A tile configuration whose on-chip state does not fit the GPU (names block_q, block_kv, d)."""


def check_kv_stages(kv_stages: object) -> int:
    if isinstance(kv_stages, bool) or kv_stages not in KV_STAGES:
        raise ValueError(f"kv_stages must be one of {list(KV_STAGES)} (K_j, V_j buffers in shared memory), "
                         f"got {kv_stages!r}")
    return int(kv_stages)


def check_p_registers(p_registers: object) -> str:
    if p_registers not in P_REGISTERS:
        raise ValueError(f"p_registers must be one of {list(P_REGISTERS)} (P_ij over S_ij's registers, or its own), "
                         f"got {p_registers!r}")
    return str(p_registers)


def cta_threads(block_q: int) -> int:
    """Threads of one CTA: one warp per 16 query rows (`Flash2Kernel.threads`; a partial warp counts whole)."""
    return -(-check_positive_int("block_q", block_q) // WARP_ROWS) * WARP_THREADS


@attrs.frozen
class CTAResources:
    """Shared memory and register-held state of one FA-2 CTA, by buffer, in bytes."""

    block_q: int
    block_kv: int
    d: int
    dtype: str
    kv_stages: int
    shared_by_buffer: dict[str, int]  # Q_i, and K_j and V_j per stage
    register_by_buffer: dict[str, int]  # m_i, l_i, a_i, S_ij (float32); P_ij (storage dtype) if its own

    @property
    def threads(self) -> int:
        return cta_threads(self.block_q)

    @property
    def shared_bytes(self) -> int:
        """Q_i + kv_stages x (K_j + V_j): the kernel's dynamic shared memory (`Flash2Kernel.shared_bytes`)."""
        b = self.shared_by_buffer
        return b["Q_i"] + self.kv_stages * (b["K_j"] + b["V_j"])

    @property
    def register_bytes(self) -> int:
        return sum(self.register_by_buffer.values())

    @property
    def registers_per_thread(self) -> int:
        """The register-held state's share of one thread, in 32-bit registers (rounded up)."""
        return -(-self.register_bytes // (REGISTER_BYTES * self.threads))

    def describe_shared(self) -> str:
        b = self.shared_by_buffer
        stages = f"{self.kv_stages} x " if self.kv_stages > 1 else ""
        return (f"Q_i {b['Q_i'] / KiB:g} KiB + {stages}(K_j {b['K_j'] / KiB:g} KiB + V_j {b['V_j'] / KiB:g} KiB)"
                f" = {self.shared_bytes / KiB:g} KiB")

    def describe_registers(self) -> str:
        held = " + ".join(f"{name} {n / KiB:g} KiB" for name, n in self.register_by_buffer.items())
        return f"{held} = {self.register_bytes / KiB:g} KiB ({STATE_DTYPE})"


def cta_resources(block_q: int, block_kv: int, d: int, dtype: str = "float16",
                  kv_stages: int = DEFAULT_KV_STAGES, p_registers: str = DEFAULT_P_REGISTERS) -> CTAResources:
    """What one CTA of B_r = block_q rows and B_c = block_kv keys holds, as the backend kernel does."""
    B_r, B_c = check_positive_int("block_q", block_q), check_positive_int("block_kv", block_kv)
    d = check_positive_int("d", d)
    b, s = storage_dtype(dtype).itemsize, STATE_DTYPE.itemsize
    shared = {"Q_i": B_r * d * b, "K_j": B_c * d * b, "V_j": B_c * d * b}
    registers = {"m_i": B_r * s, "l_i": B_r * s, "a_i": B_r * d * s, "S_ij": B_r * B_c * s}
    if check_p_registers(p_registers) == "own":
        registers["P_ij"] = B_r * B_c * b
    return CTAResources(B_r, B_c, d, dtype, check_kv_stages(kv_stages), shared, registers)


def register_capacity_bytes(gpu: GPUSpec, block_q: int) -> int:
    """Register bytes one CTA of block_q rows may hold: its threads x the per-thread maximum, at most
    the SM's register file."""
    registers = min(gpu.registers_per_sm, cta_threads(block_q) * gpu.max_registers_per_thread)
    return registers * REGISTER_BYTES


def broken_limits(res: CTAResources, gpu: GPUSpec, shared_capacity_bytes: int | None = None) -> dict[str, str]:
    """Each limit of LIMITS the CTA breaks on `gpu`, with what it needs against what is there.

    shared_capacity_bytes defaults to the GPU's opt-in maximum per CTA (`max_shared_bytes_per_cta`)."""
    shared_cap = gpu.max_shared_bytes_per_cta if shared_capacity_bytes is None else shared_capacity_bytes
    broken = {}
    if res.threads > gpu.max_threads_per_cta:
        broken["threads per CTA"] = f"{res.threads} threads > {gpu.max_threads_per_cta}"
    if res.shared_bytes > shared_cap:
        broken["shared memory per CTA"] = f"{res.describe_shared()} > capacity {shared_cap / KiB:g} KiB"
    if res.registers_per_thread > gpu.max_registers_per_thread:
        broken["registers per thread"] = (f"{res.describe_registers()} over {res.threads} threads = "
                                          f"{res.registers_per_thread} > {gpu.max_registers_per_thread}")
    if res.registers_per_thread * res.threads > gpu.registers_per_sm:
        broken["register file"] = (f"{res.registers_per_thread} x {res.threads} threads = "
                                   f"{res.registers_per_thread * res.threads} registers > {gpu.registers_per_sm}")
    return broken


def check_fits(res: CTAResources, gpu: GPUSpec, shared_capacity_bytes: int | None = None) -> None:
    """TileFitError naming block_q, block_kv and d when the CTA's on-chip state does not fit `gpu`."""
    broken = broken_limits(res, gpu, shared_capacity_bytes)
    if broken:
        reasons = "; ".join(f"{limit} ({why})" for limit, why in broken.items())
        larger = " or a larger sram_bytes" if "shared memory per CTA" in broken else ""
        raise TileFitError(
            f"tiles do not fit in {reasons} of the {gpu.name} for block_q={res.block_q}, block_kv={res.block_kv}, "
            f"d={res.d} ({res.dtype}, kv_stages={res.kv_stages}); choose smaller block_q/block_kv{larger} "
            f"(`simflash tiles --d {res.d}` lists the largest that fit)")


@attrs.frozen
class TileCandidate:
    """For one B_r: the largest B_c that fits (None: not even B_c = 16), and what stops the next."""

    block_q: int
    block_kv: int | None
    resources: CTAResources | None  # at (block_q, block_kv), when some B_c fits
    stopped_by: tuple[str, ...]  # the limits B_c + 16 (or B_c = 16) breaks


@attrs.frozen
class TileReport:
    gpu: str
    d: int
    dtype: str
    kv_stages: int
    shared_capacity_bytes: int
    candidates: tuple[TileCandidate, ...]

    @property
    def largest(self) -> TileCandidate | None:
        """The fitting candidate with the most B_r x B_c (the larger B_r on a tie)."""
        fitting = [(c.block_q * c.block_kv, c.block_q, c) for c in self.candidates if c.block_kv is not None]
        return max(fitting, key=lambda f: f[:2], default=(0, 0, None))[2]

    def to_dict(self) -> dict:
        largest = self.largest
        return {
            "gpu": self.gpu, "d": self.d, "dtype": self.dtype, "kv_stages": self.kv_stages,
            "shared_capacity_bytes": self.shared_capacity_bytes,
            "largest": None if largest is None else {"block_q": largest.block_q, "block_kv": largest.block_kv},
            "candidates": [
                {"block_q": c.block_q, "block_kv": c.block_kv, "stopped_by": list(c.stopped_by),
                 "threads": cta_threads(c.block_q),
                 "shared_bytes": None if c.resources is None else c.resources.shared_bytes,
                 "register_bytes": None if c.resources is None else c.resources.register_bytes,
                 "registers_per_thread": None if c.resources is None else c.resources.registers_per_thread}
                for c in self.candidates],
        }


def tile_candidates(d: int, gpu: str = "H200", dtype: str = "float16", kv_stages: int = DEFAULT_KV_STAGES,
                    max_tile: int = 1024) -> TileReport:
    """B_r = 16, 32, ... up to the first B_r where no B_c fits (or max_tile): the largest B_c for each."""
    spec = gpu_spec(gpu)
    d, max_tile = check_positive_int("d", d), check_positive_int("max_tile", max_tile)
    kv_stages = check_kv_stages(kv_stages)
    storage_dtype(dtype)
    candidates = []
    for B_r in range(TILE_STEP, max_tile + 1, TILE_STEP):
        best: CTAResources | None = None
        stopped: tuple[str, ...] = ()
        for B_c in range(TILE_STEP, max_tile + TILE_STEP + 1, TILE_STEP):
            res = cta_resources(B_r, B_c, d, dtype, kv_stages)
            broken = broken_limits(res, spec)
            if broken:
                stopped = tuple(broken)
                break
            best = res
        candidates.append(TileCandidate(B_r, None if best is None else best.block_kv, best, stopped))
        if best is None:
            break
    return TileReport(spec.name, d, dtype, kv_stages, spec.max_shared_bytes_per_cta, tuple(candidates))


def lesson_tile_sizes(block_q: int = 128, block_kv: int = 64, d: int = 128, dtype: str = "float16") -> dict[str, int]:
    """The lesson's section 2 tile sizes, named as what they are: Q_i, K_j, V_j at the storage dtype,
    and S_ij as it would be if it were stored at the storage dtype (the kernel keeps it in float32 registers)."""
    b = storage_dtype(dtype).itemsize
    return {"Q_i tile": block_q * d * b, "K_j tile": block_kv * d * b, "V_j tile": block_kv * d * b,
            f"S_ij if it were stored at {dtype}": block_q * block_kv * b}


__all__ = [
    "DEFAULT_KV_STAGES", "KV_STAGES", "LIMITS", "CTAResources", "TileCandidate", "TileFitError", "TileReport",
    "broken_limits", "check_fits", "check_kv_stages", "cta_resources", "cta_threads", "lesson_tile_sizes",
    "register_capacity_bytes", "tile_candidates"
]
