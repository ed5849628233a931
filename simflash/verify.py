"""The causal checks behind `simflash verify`: masked tiled attention equals direct masked attention,
dropping the mask (skip bound kept) is caught on exactly the rows it should be, and the lesson's
exercise 4 asked of `TileSchedule`."""

from __future__ import annotations

import attrs
import numpy as np

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.api import run_tiled
from simflash.config import DEFAULT_GPU, gpu_spec
from simflash.memory import SimulatedGPU
from simflash.numerics import reference_attention
from simflash.schedule import TileSchedule


@attrs.frozen
class Check:
    name: str
    passed: bool
    detail: str


@attrs.frozen
class NoMaskSchedule(TileSchedule):
    """The skip bound without the mask: the same tiles are visited, but every row sees every loaded key."""

    def mask(self, i: int, j: int) -> np.ndarray:
        rows, cols = self.q_rows(i), self.kv_cols(j)
        return np.ones((rows.stop - rows.start, cols.stop - cols.start), dtype=bool)


def run_algorithm(variant: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray, sched: TileSchedule,
                  scale: float) -> np.ndarray:
    """Run a registered algorithm on a fresh simulated GPU with this schedule; the O it leaves in HBM."""
    gpu = SimulatedGPU.build(sram_bytes=gpu_spec(DEFAULT_GPU).smem_carveout_bytes)
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        gpu.hbm.place(name, x[None], x.dtype)
    gpu.hbm.allocate("O", (1, *Q.shape), Q.dtype)
    for _ in run_tiled(gpu, variant, sched, scale):
        pass
    return gpu.hbm.inspect("O")[0]


# Small causal problems with diagonal tiles: (n_q, n_kv, causal_variant), at d = 8, B_r = 4, B_c = 2.
CAUSAL_PROBLEMS = ((16, 16, "upper_left"), (12, 16, "lower_right"))


def causal_checks(seed: int = 0, d: int = 8, block_q: int = 4, block_kv: int = 2,
                  tolerance: float = 1e-5) -> list[Check]:
    """Masked tiled attention equals direct masked attention; dropping the mask (skip bound kept) does not."""
    rng = np.random.default_rng(seed)
    checks = []
    for n_q, n_kv, causal_variant in CAUSAL_PROBLEMS:
        Q = rng.standard_normal((n_q, d)).astype(np.float32)  # (n_q, d)
        K, V = (rng.standard_normal((n_kv, d)).astype(np.float32) for _ in range(2))  # (n_kv, d)
        scale = 1.0 / np.sqrt(d)
        sched = TileSchedule(n_q, n_kv, block_q, block_kv, causal=True, causal_variant=causal_variant)
        kinds = sched.kind_map()
        reference = reference_attention(Q, K, V, True, causal_variant, scale, "float32")  # (n_q, d) float64
        # Rows that the skip bound lets see a future key: only the mask removes it.
        last_tile = np.array([(sched.kv_tiles(r // block_q) or [-1])[-1] for r in range(n_q)])
        last_loaded_col = np.minimum((last_tile + 1) * block_kv, n_kv) - 1
        sees_future = last_loaded_col > np.arange(n_q) + sched.diagonal_offset
        problem = (f"{n_q} x {n_kv}, B_r = {block_q}, B_c = {block_kv}, {causal_variant}: "
                   f"{np.sum(kinds == 'full')} full, {np.sum(kinds == 'masked')} masked (diagonal), "
                   f"{np.sum(kinds == 'skipped')} skipped tiles")
        for variant in FLASH_ALGORITHMS:
            error = np.abs(run_algorithm(variant, Q, K, V, sched, scale) - reference).max()
            checks.append(Check(
                f"{variant} causal, {problem}",
                bool(error <= tolerance and np.any(kinds == "masked")),
                f"max |O - direct masked attention (float64)| = {error:.1e} (tolerance {tolerance:g})",
            ))
            unmasked = NoMaskSchedule(n_q, n_kv, block_q, block_kv, causal=True, causal_variant=causal_variant)
            wrong = np.abs(run_algorithm(variant, Q, K, V, unmasked, scale) - reference).max(axis=1)  # (n_q,)
            differs = wrong > tolerance
            checks.append(Check(
                f"{variant} without the mask, skip bound kept, {n_q} x {n_kv} {causal_variant}",
                bool(np.any(differs) and np.array_equal(differs, sees_future)),
                f"{np.sum(differs)} of {n_q} rows differ from direct masked attention (by up to {wrong.max():.3f}): "
                f"exactly the {np.sum(sees_future)} rows whose loaded tiles hold keys in their future",
            ))
    return checks


def exercise4_checks() -> list[Check]:
    """The lesson's exercise 4, asked of TileSchedule: B_r = 128, B_c = 64, N = 4096, causal, query tile i = 5."""
    n, block_q, block_kv, lesson_tile = 4096, 128, 64, 5
    sched = TileSchedule(n, n, block_q, block_kv, causal=True)
    i = lesson_tile - 1  # the lesson counts tiles from 1
    rows = sched.q_rows(i)
    kinds = [sched.tile_kind(i, j) for j in range(sched.n_kv_tiles)]
    # Element-level truth: a tile is full if the mask permits all of it, skipped if none, masked otherwise.
    derived = ["full" if m.all() else "masked" if m.any() else "skipped"
               for m in (sched.mask(i, j) for j in range(sched.n_kv_tiles))]
    loads = sched.kv_tiles(i)
    full = [j + 1 for j in loads if kinds[j] == "full"]
    masked = [j + 1 for j in loads if kinds[j] == "masked"]
    half = block_q // 2
    last = sched.mask(i, loads[-1])
    second_last = sched.mask(i, loads[-2])
    return [
        Check(
            f"exercise 4: query tile i = {lesson_tile} (0-based {i}, rows {rows.start + 1}-{rows.stop}), "
            f"B_r = {block_q}, B_c = {block_kv}, N = {n}, causal",
            loads == list(range(2 * lesson_tile)) and kinds == derived,
            f"loads j = {loads[0] + 1}..{loads[-1] + 1} (skip bound j <= 2i = {2 * lesson_tile}); "
            f"j = {full[0]}..{full[-1]} full, j = {', '.join(map(str, masked))} masked; "
            "tile kinds agree with the element mask",
        ),
        Check(
            f"exercise 4: the upper {half} rows of tile {lesson_tile} see nothing of j = {loads[-1] + 1}",
            bool(not last[:half].any() and last[half:].any() and second_last[half:].all()
                 and not second_last[:half].all()),
            f"j = {loads[-1] + 1} is loaded but permits 0 entries in rows {rows.start + 1}-{rows.start + half}; "
            f"j = {loads[-2] + 1} is fully permitted for rows {rows.start + half + 1}-{rows.stop} and "
            f"triangular for rows {rows.start + 1}-{rows.start + half}",
        ),
    ]
