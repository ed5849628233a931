"""How two traces differ: the comparison behind the golden-trace check."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simflash.trace_schema import OPTIONAL_FIELDS, SPLIT_FIELD, STEP_FIELDS

if TYPE_CHECKING:
    from simflash.trace import Trace


def trace_differences(expected: Trace, actual: Trace, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """How `actual` differs from `expected`: structure exactly, state arrays within rtol/atol.

    Infinities must sit in the same places with the same sign; the default tolerances demand
    bit-for-bit equality. An empty list means the traces agree.
    """
    problems = []
    if expected.level != actual.level:
        problems.append(f"level {actual.level!r} != {expected.level!r}")
    if dict(expected.config) != dict(actual.config):
        problems.append(f"config {dict(actual.config)} != {dict(expected.config)}")
    x, y = expected.combine_weights, actual.combine_weights
    if x is None or y is None:
        weights_differ = x is not y
    else:
        weights_differ = not (x.shape == y.shape and np.allclose(y, x, rtol=rtol, atol=atol))
    if weights_differ:
        problems.append("combine_weights differ")
    if len(expected) != len(actual):
        return [*problems, f"{len(actual)} steps != {len(expected)}"]
    for n, (want, got) in enumerate(zip(expected, actual)):
        for name in (*STEP_FIELDS, *OPTIONAL_FIELDS, SPLIT_FIELD):
            x, y = getattr(want, name), getattr(got, name)
            if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
                same = (x.dtype == y.dtype and x.shape == y.shape
                        and np.allclose(y, x, rtol=rtol, atol=atol, equal_nan=True))
            else:
                same = x is None and y is None if name in ("a", *OPTIONAL_FIELDS) else x == y
            if not same:
                problems.append(f"step {n} (head {want.head}, i {want.i}, j {want.j}): {name} differs")
    return problems
