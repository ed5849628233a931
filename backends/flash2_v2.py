"""FA-2 forward, version 2: the kernel of flash2_forward_v2.cu, FlashAttention-2's own layout of the
version 1 kernel (4 warps of 32 query rows, one staggered K and V buffer, two CTAs per SM, the
masked KV tiles in a loop of their own). Same arguments, schedule and byte counts as version 1, so
flash2.launch runs it unchanged.

On the host, the compiled function and its shared-memory limit are set up once per configuration:
a timed launch is the kernel call alone, with no device query or attribute call in it.
"""

from __future__ import annotations

import functools

import attrs

from simflash.backends.kernels import STORAGE_TYPES, Flash2Kernel, _choice, _fit_shared, compiled

SOURCE = "flash2_forward_v2.cu"
HEAD_DIMS = (64, 128)  # 32 rows of a_i per warp: d = 256 would not fit the register file
BLOCK_Q = (64, 128)  # B_r: a multiple of 32, one warp per 32 rows
BLOCK_KV = (32, 64, 128)  # B_c: a multiple of 16
CHOICES: dict[str, list] = {"dtype": list(STORAGE_TYPES), "d": list(HEAD_DIMS), "block_q": list(BLOCK_Q), "block_kv": list(BLOCK_KV)}


@functools.cache
def _function(name_expression: str, dynamic_bytes: int, what: str):
    kernel = _fit_shared(compiled(SOURCE, name_expression), dynamic_bytes, what)
    kernel.preferred_shared_memory_carveout = 100  # the most shared memory: two CTAs' tiles on one SM
    return kernel


@attrs.frozen
class Flash2V2Kernel(Flash2Kernel):
    """One instantiation of flash2_forward_v2.cu: storage dtype, B_r, B_c, head dim, and the build."""

    def __attrs_post_init__(self) -> None:
        for name, choices in CHOICES.items():
            _choice(name, getattr(self, name), choices)

    @property
    def name_expression(self) -> str:
        build = "true" if self.instrumented else "false"
        return f"flash2_forward_v2<{STORAGE_TYPES[self.dtype]}, {self.block_q}, {self.block_kv}, {self.d}, {build}>"

    @property
    def threads(self) -> int:
        return self.block_q

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: Q_i, K_j and V_j, rows padded by 8 values, 2 bytes a value."""
        return (self.block_q + 2 * self.block_kv) * (self.d + 8) * 2

    def function(self):
        """The compiled kernel, its shared-memory limit raised once per configuration."""
        what = f"flash2_forward_v2 with block_q={self.block_q}, block_kv={self.block_kv}, d={self.d}"
        return _function(self.name_expression, self.shared_bytes, what)


def supported() -> dict:
    """The configurations version 2 is instantiated for, by argument."""
    return {name: list(choices) for name, choices in CHOICES.items()}
