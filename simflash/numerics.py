"""The float64 reference and the error rules every output is held to."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from simflash.config import storage_dtype
from simflash.schedule import TileSchedule

# Largest relative error ||out - ref|| / ||ref|| accepted per storage dtype (inputs already rounded).
RELATIVE_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5}


def upcast(x, dtype: str) -> np.ndarray:
    """x as HBM stores it (rounded to `dtype`), in float64: the reference sees the same inputs."""
    return np.asarray(x).astype(storage_dtype(dtype)).astype(np.float64)


def reference_attention(q, k, v, causal: bool = False, causal_variant: str = "upper_left",
                        scale: float | None = None, dtype: str = "float16") -> np.ndarray:
    """Direct masked softmax attention in float64 on the storage-rounded inputs."""
    q, k, v = (upcast(x, dtype) for x in (q, k, v))
    n_q, n_kv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    S = q @ k.swapaxes(-1, -2) * scale  # (..., n_q, n_kv)
    visible = TileSchedule(n_q, n_kv, n_q, n_kv, causal, causal_variant).mask(0, 0)
    S = np.where(visible, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = E.sum(axis=-1, keepdims=True)  # noqa: E741
    return np.divide(E, l, out=np.zeros_like(E), where=l > 0) @ v  # rows with no visible key: 0


def relative_error(out, ref, scale: float | None = None) -> float:
    """||out - ref|| / ||ref|| in float64 (absolute error when ref is all zeros).

    On tiny problems an output can cancel to near zero and make that ratio meaningless: pass
    `scale=value_scale(v, ref)` to measure against the size outputs can take instead.
    """
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    diff = float(np.linalg.norm(out - ref))
    norm = float(np.linalg.norm(ref)) if scale is None else scale
    return diff / norm if norm > 0 else diff


def value_scale(v, ref) -> float:
    """The norm `ref` would have if every output reached max|v|: outputs are convex combinations of V's rows."""
    return float(np.sqrt(np.size(ref)) * np.abs(np.asarray(v, dtype=np.float64)).max())


def unit_roundoff(dtype: str) -> float:
    """Half the spacing of the storage dtype at 1: the relative error of storing one value."""
    return float(ml_dtypes.finfo(storage_dtype(dtype)).eps) / 2  # ml_dtypes.finfo knows bfloat16 too


def within_tolerance(error: float, dtype: str, naive_error: float | None = None) -> bool:
    """The dtype's tolerance and, for 16-bit storage, FlashAttention's rule: at most 2x the error of
    naive attention in the same dtype, plus the rounding of the output itself (one unit roundoff,
    which decides on tiny problems where naive's roundings happen to cancel)."""
    ok = error <= RELATIVE_TOLERANCE[dtype]
    if naive_error is not None and dtype != "float32":
        ok = ok and error <= 2 * naive_error + unit_roundoff(dtype)
    return ok
