"""The float64 reference, the error rules every output is held to, and the kernels' rounding to a storage dtype."""

from __future__ import annotations

import math

import attrs
import ml_dtypes
import numpy as np

from simflash.config import STATE_DTYPE, check_causal_variant, check_window, storage_dtype

# Largest relative error ||out - ref|| / ||ref|| accepted per storage dtype (inputs already rounded).
RELATIVE_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5}


def upcast(x, dtype: str) -> np.ndarray:
    """x as HBM stores it (rounded to `dtype`), in float64: the reference sees the same inputs."""
    return np.asarray(x).astype(storage_dtype(dtype)).astype(np.float64)


# float32 bit patterns (sign cleared): float16's smallest normal, 2**-14, and 65520, halfway from float16's
# largest finite value 65504 to 65536, the smallest magnitude that rounds to inf
_FLOAT16_MIN_NORMAL_BITS = 0x38800000
_FLOAT16_OVERFLOW_BITS = 0x477FF000
_FLOAT32_MAGNITUDE, _FLOAT32_SIGN = np.uint32(0x7FFFFFFF), np.uint32(0x80000000)
_FLOAT32_EXPONENT = np.uint32(0x7F800000)
_FLOAT16_DROPPED_BITS = 23 - 10  # float32's significand bits that float16's lacks
# Veltkamp's splitter 2**13 + 1: s = x (2**13 + 1), then s - (s - x) is x cut to 24 - 13 = 11 significant
# bits, float16's, rounded to nearest even (checked on every float32 of float16's normal range, both signs)
_FLOAT16_SPLITTER = np.float32(2**_FLOAT16_DROPPED_BITS + 1)


def round_to_storage(x: np.ndarray, storage: np.dtype) -> np.ndarray:
    """x rounded to the storage dtype and back to float32: bitwise `x.astype(storage).astype(np.float32)`
    (a NaN stays a NaN, payload aside; a float32 x with float32 storage comes back itself).

    Why not that cast: NumPy converts float32 to float16 and back one element at a time (~35 us for a
    128 x 64 tile, five times that when many values are float16 subnormals), and the kernels round every
    P tile before P V. Here float16 takes a few whole-array operations (~11 us). bfloat16 keeps
    ml_dtypes' cast, which is vectorised already and faster than such operations."""
    if x.dtype == STATE_DTYPE and storage == STATE_DTYPE:
        return x
    # A float64 x (scores scaled by a NumPy float64) must round once, straight to storage, as the cast does
    if x.dtype != STATE_DTYPE or storage != np.float16:
        return x.astype(storage).astype(STATE_DTYPE)
    # Is every |x| in float16's normal range [2**-14, 65520)? Shifted left, the bit pattern loses its sign;
    # less 2**-14's pattern (shifted too), smaller magnitudes, zero among them, wrap around past the bound.
    from_min_normal = (x.view(np.uint32) << 1) - np.uint32(2 * _FLOAT16_MIN_NORMAL_BITS)
    if from_min_normal.max(initial=0) < 2 * (_FLOAT16_OVERFLOW_BITS - _FLOAT16_MIN_NORMAL_BITS):
        split = x * _FLOAT16_SPLITTER
        return split - (split - x)
    return _round_to_float16_anywhere(x)


def _round_to_float16_anywhere(x: np.ndarray) -> np.ndarray:
    """`round_to_storage` to float16 for x with zeros, subnormals or values that overflow float16."""
    bits = x.view(np.uint32)
    magnitude = bits & _FLOAT32_MAGNITUDE
    if magnitude.max(initial=0) >= _FLOAT16_OVERFLOW_BITS:  # inf, NaN or a float16 overflow: rare, so NumPy's cast
        return x.astype(np.float16).astype(STATE_DTYPE)
    # float16's spacing in the binade [2**e, 2**(e+1)) is 2**(e-10), and 2**-24 below 2**-14 (its
    # subnormals): the float32 spacing above c = 2**(max(e, -14) + 13). So |x| + c rounds |x| to float16,
    # ties to even (c's significand is even), subtracting c is exact, and the sign goes back on as a bit.
    binade = np.maximum(magnitude & _FLOAT32_EXPONENT, _FLOAT16_MIN_NORMAL_BITS)  # 2**max(e, -14), as bits
    c = binade + np.uint32(_FLOAT16_DROPPED_BITS << 23)  # times 2**13: 13 more in the exponent field
    rounded = magnitude.view(np.float32) + c.view(np.float32)
    rounded -= c.view(np.float32)
    rounded_bits = rounded.view(np.uint32)
    rounded_bits |= bits & _FLOAT32_SIGN
    return rounded


def reference_mask(n_q: int, n_kv: int, causal: bool = False, causal_variant: str = "upper_left",
                   window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """Boolean (n_q, n_kv), True where query row r may see key column c, from the definition alone
    (independent of `TileSchedule`, which is checked against it): r + off - left <= c <= r + off + right,
    with off 0 when the mask is aligned to the top-left corner and n_kv - n_q when aligned to the
    bottom-right; causal means right = 0, and -1 leaves a side unbounded."""
    check_causal_variant(causal_variant)
    left, right = check_window(window)
    right = 0 if causal else right
    offset = 0 if causal_variant == "upper_left" else n_kv - n_q
    visible = np.ones((n_q, n_kv), dtype=bool)
    if right >= 0:
        visible &= np.tri(n_q, n_kv, k=offset + right, dtype=bool)  # c <= r + off + right
    if left >= 0:
        visible &= ~np.tri(n_q, n_kv, k=offset - left - 1, dtype=bool)  # not c <= r + off - left - 1
    return visible


def reference_attention(q, k, v, causal: bool = False, causal_variant: str = "upper_left",
                        scale: float | None = None, dtype: str = "float16",
                        window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """Direct masked softmax attention in float64 on the storage-rounded inputs. k, v may have fewer
    heads than q (grouped-query): each is repeated over its group of H_q / H_kv query heads."""
    q, k, v = (upcast(x, dtype) for x in (q, k, v))
    if q.ndim > 2 and k.shape[-3] != q.shape[-3]:
        k, v = (np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3) for x in (k, v))
    n_q, n_kv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    S = q @ k.swapaxes(-1, -2) * scale  # (..., n_q, n_kv)
    visible = reference_mask(n_q, n_kv, causal, causal_variant, window)
    S = np.where(visible, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = E.sum(axis=-1, keepdims=True)
    return np.divide(E, l, out=np.zeros_like(E), where=l > 0) @ v  # rows with no visible key: 0


@attrs.frozen(eq=False)
class ReferenceGradients:
    """The float64 gradients of attention, and beside each the same sum taken over absolute terms."""

    dq: np.ndarray  # shape of q
    dk: np.ndarray  # shape of k
    dv: np.ndarray  # shape of v
    # |dS| -> P o (|dP| + |D|), |K| for K, ...: the size of what is summed, which a float32 computation's
    # roundoffs scale with even where the terms cancel (a row that sees one key has dS = 0 exactly)
    dq_terms: np.ndarray
    dk_terms: np.ndarray
    dv_terms: np.ndarray


def reference_attention_backward(q, k, v, do, causal: bool = False, causal_variant: str = "upper_left",
                                 scale: float | None = None, dtype: str = "float16",
                                 window: tuple[int, int] = (-1, -1)) -> ReferenceGradients:
    """The analytic gradients of softmax attention in float64, on the storage-rounded inputs and output
    gradient do. With S = scale Q K^T (-inf where masked), P = softmax(S), O = P V:

        dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D) with D = rowsum(dP o P),  dQ = scale dS K,
        dK = scale dS^T Q.

    Grouped-query k, v: computed for each query head on its group's K/V head, then dk and dv summed
    over the group."""
    q, k, v, do = (upcast(x, dtype) for x in (q, k, v, do))
    group = q.shape[-3] // k.shape[-3] if q.ndim > 2 else 1
    k_q, v_q = (np.repeat(x, group, axis=-3) for x in (k, v))  # each query head's K and V
    n_q, n_kv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    S = np.where(reference_mask(n_q, n_kv, causal, causal_variant, window), q @ k_q.swapaxes(-1, -2) * scale, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = E.sum(axis=-1, keepdims=True)
    P = np.divide(E, l, out=np.zeros_like(E), where=l > 0)  # rows with no visible key: 0
    dP = do @ v_q.swapaxes(-1, -2)
    D = (dP * P).sum(axis=-1, keepdims=True)
    dS, dS_terms = P * (dP - D), P * (np.abs(dP) + np.abs(D))

    def group_sum(x: np.ndarray) -> np.ndarray:
        return x.reshape(*k.shape[:-3], k.shape[-3], group, n_kv, d).sum(axis=-3) if q.ndim > 2 else x

    def gradients(dS, P, Q, K, dO) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return scale * dS @ K, group_sum(scale * dS.swapaxes(-1, -2) @ Q), group_sum(P.swapaxes(-1, -2) @ dO)

    return ReferenceGradients(*gradients(dS, P, q, k_q, do), *gradients(dS_terms, P, np.abs(q), np.abs(k_q),
                                                                      np.abs(do)))


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (absolute error when ref is all zeros)."""
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    diff = float(np.linalg.norm(out - ref))
    norm = float(np.linalg.norm(ref))
    return diff / norm if norm > 0 else diff


def unit_roundoff(dtype: str) -> float:
    """Half the spacing of the storage dtype at 1: the relative error of storing one value."""
    return float(ml_dtypes.finfo(storage_dtype(dtype)).eps) / 2  # ml_dtypes.finfo knows bfloat16 too


# FlashAttention's rule for 16-bit storage: max |out - ref| <= 2 max |naive - ref| + atol, with
#   atol = ATOL_ROUNDOFFS * u(float32) * max |V|   (u = float32 unit roundoff, 2**-24 ~ 6e-8).
# Why this atol: every output is a convex combination of V's rows, so max |V| is the output scale. A
# tiled kernel keeps its running state in float32 and rounds once to the storage dtype at the end;
# the nearest storage value to ref is at least as close as any storage value naive can produce, so
# the tiled kernel can lose to naive only where its float32 result sits within a few float32 roundoffs
# of a rounding midpoint. 16 float32 roundoffs (~1e-6 of max |V|) is two orders of magnitude below
# naive's max error in float16 (a few 1e-4 of max |V| at hundreds of tokens; ~10x more in bfloat16), so
# it decides only those ties (and problems so small that naive is exact, e.g. one key) and cannot let a
# 3x-naive error through. The rule compares maxima over many outputs: on a handful of outputs naive
# can be luckier than 2x by chance, so it is a test for problems of realistic size.
ATOL_ROUNDOFFS = 16
FLOAT32_UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2


def fa_rule_atol(v) -> float:
    """The absolute slack of FlashAttention's rule: ATOL_ROUNDOFFS float32 roundoffs of the output scale max |V|."""
    scale = float(np.abs(np.asarray(v, dtype=np.float64)).max(initial=0.0))
    return ATOL_ROUNDOFFS * FLOAT32_UNIT_ROUNDOFF * scale


def max_abs_error(out, ref) -> float:
    """max |out - ref| in float64 (0 for empty arrays)."""
    diff = np.abs(np.asarray(out, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    return float(diff.max(initial=0.0))


@attrs.frozen
class RuleCheck:
    """FlashAttention's rule on one output: max |out - ref| <= 2 max |naive - ref| + atol."""

    error: float  # max |out - ref|
    naive_error: float  # max |naive - ref|, naive attention computed in the same storage dtype
    atol: float

    @property
    def bound(self) -> float:
        return 2 * self.naive_error + self.atol

    @property
    def passed(self) -> bool:
        return self.error <= self.bound

    def __bool__(self) -> bool:
        return self.passed


def fa_rule(out, naive_out, ref, v) -> RuleCheck:
    """FlashAttention's test rule: `out`'s max error against the float64 `ref` is at most twice that of
    naive attention (`naive_out`, same storage dtype), plus `fa_rule_atol(v)` (see ATOL_ROUNDOFFS).

    v sets the output's scale: V for attention's output; for a gradient, the sum it takes over
    absolute terms (`ReferenceGradients.dq_terms`, ...)."""
    return RuleCheck(max_abs_error(out, ref), max_abs_error(naive_out, ref), fa_rule_atol(v))


def within_tolerance(error: float, dtype: str, naive_error: float | None = None) -> bool:
    """The dtype's tolerance on a relative error ||out - ref|| / ||ref|| and, for 16-bit storage when
    naive's relative error is given, FlashAttention's 2x rule on those errors with the same small slack
    as `fa_rule` (ATOL_ROUNDOFFS float32 roundoffs, here relative to the output's own size). Prefer
    `fa_rule` on the outputs themselves: it uses max |out - ref| as FlashAttention's tests do."""
    ok = error <= RELATIVE_TOLERANCE[dtype]
    if naive_error is not None and dtype != "float32":
        ok = ok and error <= 2 * naive_error + ATOL_ROUNDOFFS * FLOAT32_UNIT_ROUNDOFF
    return ok
