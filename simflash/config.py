"""Configuration as data: storage dtypes, GPU specs, causal variants."""

from __future__ import annotations

import attrs
import ml_dtypes
import numpy as np

KiB = 1024
MiB = 1024**2
GiB = 1024**3

# HBM storage dtypes by name. On-chip math and the online-softmax state are always float32.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
}
STATE_DTYPE = np.dtype(np.float32)

# PyTorch's names. upper_left: query r sees keys c <= r (SDPA is_causal).
# lower_right: query r sees keys c <= r + n_kv - n_q (FlashAttention >= 2.1).
CAUSAL_VARIANTS = ("upper_left", "lower_right")


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype for a storage-dtype name, or a ValueError naming the choices."""
    try:
        return STORAGE_DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be one of {sorted(STORAGE_DTYPES)}, got {name!r}") from None


def check_causal_variant(name: str) -> str:
    if name not in CAUSAL_VARIANTS:
        raise ValueError(f"causal_variant must be one of {CAUSAL_VARIANTS}, got {name!r}")
    return name


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@attrs.frozen
class GPUSpec:
    """Datasheet figures for one GPU (peak, dense; leads, not measurements)."""

    name: str
    peak_flops: dict[str, float]  # FLOP/s by storage dtype (tensor cores for 16-bit, plain fp32 otherwise)
    hbm_bytes_per_s: float
    l2_bytes_per_s: float  # an estimate: vendors publish no L2 bandwidth figure
    sm_count: int
    smem_carveout_bytes: int  # largest shared-memory carve-out per SM
    l2_bytes: int

    def ridge_point(self, dtype: str = "float16") -> float:
        """FLOP per HBM byte at which the roofline turns from bandwidth- to compute-bound."""
        return self.peak_flops[dtype] / self.hbm_bytes_per_s


GPUS: dict[str, GPUSpec] = {
    "A100": GPUSpec(
        name="A100 80GB SXM",
        peak_flops={"float16": 312e12, "bfloat16": 312e12, "float32": 19.5e12},
        hbm_bytes_per_s=2.039e12,
        l2_bytes_per_s=7.0e12,
        sm_count=108,
        smem_carveout_bytes=164 * KiB,
        l2_bytes=40 * MiB,
    ),
    "H100": GPUSpec(
        name="H100 SXM",
        peak_flops={"float16": 989e12, "bfloat16": 989e12, "float32": 67e12},
        hbm_bytes_per_s=3.35e12,
        l2_bytes_per_s=12.0e12,
        sm_count=132,
        smem_carveout_bytes=228 * KiB,
        l2_bytes=50 * MiB,
    ),
    "H200": GPUSpec(
        name="H200 SXM",
        peak_flops={"float16": 989e12, "bfloat16": 989e12, "float32": 67e12},
        hbm_bytes_per_s=4.8e12,
        l2_bytes_per_s=12.0e12,
        sm_count=132,
        smem_carveout_bytes=228 * KiB,
        l2_bytes=60 * MiB,
    ),
    "B200": GPUSpec(
        name="B200 SXM",
        peak_flops={"float16": 2250e12, "bfloat16": 2250e12, "float32": 80e12},
        hbm_bytes_per_s=8.0e12,
        l2_bytes_per_s=20.0e12,
        sm_count=148,
        smem_carveout_bytes=228 * KiB,
        l2_bytes=126 * MiB,
    ),
}
DEFAULT_GPU = "H200"


def gpu_spec(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {name!r}") from None
