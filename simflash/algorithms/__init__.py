"""The tiled attention algorithms, by variant name. The CLI's choices come from this registry.

Each algorithm is the work of one CTA (`cta`), the CTAs of its grid (`grid`) and, where a
traffic-only run is supported, the same CTA's transfers without values (`program`).
"""

from collections.abc import Callable

import attrs

from simflash.algorithms import flash1, flash2


@attrs.frozen
class TiledAlgorithm:
    kernel: str  # the ledger's kernel name
    grid: Callable  # (sched, heads, longest_first, group) -> [CTA] in launch order
    cta: Callable  # (gpu, sched, scale, trace, cta, write_logsumexp) -> iterator of TileStep | None
    program: Callable | None = None  # (sched, cta, d, itemsize, write_logsumexp) -> CTAProgram
    row_state: tuple[str, ...] = ()  # float32 per-row statistics the algorithm keeps in HBM
    # Where the running output may live between KV tiles; an algorithm with more than "storage"
    # takes `o_accum_dtype` in `cta` and `allocate`, and names its finished output with `output`.
    o_accum_dtypes: tuple[str, ...] = ("storage",)
    allocate: Callable | None = None  # (hbm, o_accum_dtype) -> None: the HBM tensors besides Q, K, V, O
    output: Callable = lambda o_accum_dtype: "O"  # the tensor holding the storage-dtype output
    kernel_model: bool = False  # its on-chip state is the GPU kernel's (simflash.onchip): kv_stages, fit check


FLASH_ALGORITHMS = {
    "fa2": TiledAlgorithm(flash2.KERNEL, flash2.flash2_grid, flash2.flash2_cta, flash2.flash2_program,
                          kernel_model=True),
    "fa1": TiledAlgorithm(flash1.KERNEL, flash1.flash1_grid, flash1.flash1_cta, o_accum_dtypes=flash1.O_ACCUM_DTYPES,
                          allocate=flash1.flash1_allocate, output=flash1.flash1_output),
}
