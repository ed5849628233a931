"""round_to_storage against NumPy's cast, bit for bit: every tie and its neighbours, the special values, random arrays.

Every check also runs on the elements in float16's normal range alone and on those below its overflow
alone, so that each of the helper's paths (it picks one per array) sees every value it may be given.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from simflash.numerics import round_to_storage

FLOAT16, BFLOAT16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
ROUNDED_DTYPES = [FLOAT16, BFLOAT16]
FLOAT16_MIN_NORMAL, FLOAT16_OVERFLOW = 2.0**-14, 65520.0  # 65520 is the first magnitude that rounds to inf


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit patterns, or NaN in both (NaN payloads aside)."""
    assert got.dtype == np.float32 and got.shape == want.shape
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"first differing input: {want[~same][:1]} -> {got[~same][:1]}"


def check(x: np.ndarray, storage: np.dtype) -> None:
    """round_to_storage(x) is NumPy's round trip through `storage`, on x and on each path's share of x."""
    x = np.asarray(x, dtype=np.float32)
    magnitude = np.abs(x)
    normal = (magnitude >= FLOAT16_MIN_NORMAL) & (magnitude < FLOAT16_OVERFLOW)
    for part in (x, x[normal], x[magnitude < FLOAT16_OVERFLOW]):  # NaN compares False: left out of the last two
        with np.errstate(over="ignore", invalid="ignore"):  # NumPy's cast warns of overflow, as before the helper
            want = part.astype(storage).astype(np.float32)
            got = round_to_storage(part, storage)
        assert_same_bits(got, want)


def finite_values(storage: np.dtype) -> np.ndarray:
    """Every finite non-negative value of a 16-bit storage dtype, ascending, in float64."""
    inf_bits = 0x7C00 if storage == FLOAT16 else 0x7F80
    return np.arange(inf_bits, dtype=np.uint16).view(storage).astype(np.float64)


@pytest.mark.parametrize("storage", ROUNDED_DTYPES, ids=str)
def test_every_tie_and_its_neighbours(storage):
    values = finite_values(storage)
    # the value past the largest: where rounding to inf begins (2**128 for bfloat16, inf as a float32)
    following = np.append(values[1:], 2 * values[-1] - values[-2])
    midpoints = ((values + following) / 2).astype(np.float32)  # exact: one bit more than the storage keeps
    below = np.nextafter(midpoints, np.float32(0))
    above = np.nextafter(midpoints, np.float32(np.inf))
    positive = np.concatenate([values.astype(np.float32), midpoints, below, above])
    check(np.concatenate([positive, -positive]), storage)


@pytest.mark.parametrize("storage", ROUNDED_DTYPES, ids=str)
def test_special_values(storage):
    float32 = np.finfo(np.float32)
    smallest_subnormal = float(np.finfo(np.float32).smallest_subnormal)
    specials = np.array([
        0.0, np.inf, np.nan, smallest_subnormal, float32.smallest_normal - smallest_subnormal, float32.smallest_normal,
        float32.max, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-14, 65504.0, FLOAT16_OVERFLOW, 65536.0,
        float(ml_dtypes.finfo(BFLOAT16).max), np.uint32(0x7F7F8000).view(np.float32),  # bfloat16's largest; halfway
    ], dtype=np.float32)                                                               # from it to 2**128
    with np.errstate(over="ignore"):  # float32's largest steps up to inf
        around = np.concatenate([specials, np.nextafter(specials, np.float32(0)),
                                 np.nextafter(specials, np.float32(np.inf))])
    check(np.concatenate([around, -around]), storage)


def test_nan_stays_nan_and_float32_storage_is_the_identity():
    x = np.array([np.nan, -np.nan, 1.0, 0.1], dtype=np.float32)
    assert np.isnan(round_to_storage(x, FLOAT16)[:2]).all()
    assert round_to_storage(x, np.dtype(np.float32)) is x


@pytest.mark.parametrize("storage", [*ROUNDED_DTYPES, np.dtype(np.float32)], ids=str)
def test_float64_rounds_once_as_the_cast_does(storage):
    """float64 just above a float16 tie: straight to float16 it rounds up, through float32 (to the tie) down."""
    x = np.array([1 + 2.0**-11 + 2.0**-40, 0.1, -3.0], dtype=np.float64)
    assert_same_bits(round_to_storage(x, storage), x.astype(storage).astype(np.float32))


@pytest.mark.parametrize("storage", ROUNDED_DTYPES, ids=str)
@given(bits=arrays(np.uint32, array_shapes(max_dims=2, max_side=40)))
def test_random_bit_patterns(storage, bits):
    check(bits.view(np.float32), storage)


@pytest.mark.parametrize("storage", ROUNDED_DTYPES, ids=str)
@given(x=arrays(np.float32, array_shapes(max_dims=2, max_side=40), elements=st.floats(width=32)))
def test_random_floats(storage, x):
    check(x, storage)


@pytest.mark.parametrize("storage", ROUNDED_DTYPES, ids=str)
@given(seed=st.integers(0, 2**32 - 1), spread=st.sampled_from([0.5, 1.0, 4.0, 20.0]))
def test_random_probability_tiles(storage, seed, spread):
    """What the kernels round: P = exp(S - rowmax S), rows with float16 subnormals and zeros as spread grows."""
    scores = spread * np.random.default_rng(seed).standard_normal((128, 64), dtype=np.float32)
    check(np.exp(scores - scores.max(axis=1, keepdims=True)), storage)
