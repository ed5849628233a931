"""How two traces differ: the comparison behind the golden-trace check."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

if TYPE_CHECKING:
    from simflash.trace import Trace
    from simflash.trace_backward import BackwardTrace
    from simflash.trace_backward_step import BackwardStep
    from simflash.trace_step import TileStep


def _same(x: object, y: object, rtol: float, atol: float) -> bool:
    """Equal values; arrays of one dtype and shape within rtol/atol (NaN equal to NaN)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
                and np.allclose(y, x, rtol=rtol, atol=atol, equal_nan=True))
    return x == y


def trace_differences(expected: Trace | BackwardTrace, actual: Trace | BackwardTrace, rtol: float = 0.0,
                      atol: float = 0.0) -> list[str]:
    """How `actual` differs from `expected` (two forward or two backward traces): structure exactly,
    arrays within rtol/atol.

    Every field of every step is compared, and the trace's own arrays (a split-KV run's
    combine_weights). Infinities must sit in the same places with the same sign; the default
    tolerances demand bit-for-bit equality. An empty list means the traces agree.
    """
    if type(expected) is not type(actual):
        return [f"a {type(actual).__name__} is not a {type(expected).__name__}"]
    problems = []
    if expected.level != actual.level:
        problems.append(f"level {actual.level!r} != {expected.level!r}")
    if dict(expected.config) != dict(actual.config):
        problems.append(f"config {dict(actual.config)} != {dict(expected.config)}")
    for field in attrs.fields(type(expected)):
        if field.name not in ("level", "steps", "config") and not _same(
                getattr(expected, field.name), getattr(actual, field.name), rtol, atol):
            problems.append(f"{field.name} differ")
    if len(expected) != len(actual):
        return [*problems, f"{len(actual)} steps != {len(expected)}"]
    pairs: list[tuple[TileStep | BackwardStep, TileStep | BackwardStep]] = list(zip(expected.steps, actual.steps))
    for n, (want, got) in enumerate(pairs):
        for field in attrs.fields(type(want)):
            if not _same(getattr(want, field.name), getattr(got, field.name), rtol, atol):
                problems.append(f"step {n} (head {want.head}, i {want.i}, j {want.j}): {field.name} differs")
    return problems
