"""The online softmax walked through tile by tile, as data: what `simflash trace` prints (or gives as JSON).

Two problems: one query row whose scores you choose (the lesson's section 3.2 example by default), and
query rows of a random configuration. For each visited KV tile: m, alpha, l, the accumulator, and what
the step did to the row's state, read off the state itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from simflash.api import Variant, flash_attention
from simflash.config import CausalVariant, StorageDtypeName
from simflash.numerics import reference_attention
from simflash.trace import TileStep

# The lesson's section 3.2: one query row, d = 2, two KV tiles of two keys each.
EXAMPLE_SCORES = ((8.0, 6.0), (10.0, 7.0))
EXAMPLE_VALUES = ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0))


@attrs.frozen
class TraceView:
    """How to read a variant's trace: its name, its accumulator's symbol, how O follows from the last step."""

    title: str
    symbol: str
    final: str
    output: Callable[[TileStep], np.ndarray]


def accumulator(step: TileStep) -> np.ndarray:
    """A step's accumulator a (FA-1: O_i), which a trace of level "full" records."""
    if step.a is None:
        raise ValueError("the walkthrough needs a trace of level 'full', which records the accumulator")
    return step.a


def _divide_by_l(step: TileStep) -> np.ndarray:
    a = accumulator(step)
    return np.divide(a, step.l[:, None], out=np.zeros_like(a), where=step.l[:, None] > 0)


TRACE_VIEWS = {
    "fa2": TraceView("FlashAttention-2", "a", "O = a / l, once, after the last tile", _divide_by_l),
    "fa1": TraceView("FlashAttention-1", "O_i", "O = O_i: normalised after every tile, no final division",
                     accumulator),
}


def what_changed(steps: Sequence[TileStep], row: int) -> list[str]:
    """What each step did to one row's state, read off the state itself."""
    notes, l_old = [], 0.0
    for step in steps:
        l_new, alpha = float(step.l[row]), float(step.alpha[row])
        if l_new == 0:
            notes.append("no visible key yet")
        elif l_old == 0:
            notes.append("first visible keys: the state starts")
        elif alpha < 1:
            notes.append("max moved: old state rescaled by alpha")
        else:
            notes.append("max unchanged (alpha = 1)")
        l_old = l_new
    return notes


@attrs.frozen
class TileState:
    """One row's state after one KV tile."""

    j: int  # the KV tile, 0-based
    kind: str  # "full" or "masked"
    m: float
    alpha: float
    l: float
    accumulator: np.ndarray  # a (FA-2) or the normalised O_i (FA-1), (d,)
    what_changed: str
    scores: np.ndarray | None = None  # this tile's scores (chosen-scores problem)
    weights: np.ndarray | None = None  # exp(s - m) on the new max (chosen-scores problem)


@attrs.frozen
class ScoresWalkthrough:
    """One query row with chosen scores (scale 1, float32, block_q 1), checked against the row's softmax."""

    variant: str
    title: str
    accumulator: str  # the accumulator's symbol
    final_rule: str
    block_kv: int
    d: int
    tiles: tuple[TileState, ...]
    output: np.ndarray  # O from the last step, (d,)
    stored_output: np.ndarray  # O as stored in HBM, (d,)
    row_scores: np.ndarray  # the whole row, (n_kv,)
    row_weights: np.ndarray  # its softmax in float64, (n_kv,)
    weighted_sum: np.ndarray  # the weights applied to the values, (d,)
    max_abs_error: float  # max |stored O - weighted sum|


def score_problem(scores: Sequence[Sequence[float]], values: Sequence[Sequence[float]]):
    """q, k, v (float64) whose scores with scale 1 are exactly `scores`: q = e_0, key c = (s_c, 0, ..., 0)."""
    flat = np.array([s for tile in scores for s in tile], dtype=np.float64)  # (n_kv,)
    v = np.array(values, dtype=np.float64)  # (n_kv, d)
    q = np.zeros((1, v.shape[1]))  # (1, d)
    q[0, 0] = 1.0
    k = np.zeros_like(v)  # (n_kv, d)
    k[:, 0] = flat
    return q, k, v


def scores_walkthrough(scores: Sequence[Sequence[float]], values: Sequence[Sequence[float]],
                       variant: Variant = "fa2") -> ScoresWalkthrough:
    """Scores grouped in KV tiles (all as long as the first, the last may be shorter), one value row per key."""
    q, k, v = score_problem(scores, values)
    block_kv = len(scores[0])
    run = flash_attention(q, k, v, block_q=1, block_kv=block_kv, scale=1.0, dtype="float32", variant=variant,
                          trace="full")
    tiles = []
    for step, change in zip(run.trace, what_changed(run.trace, 0)):
        tile_scores = k[step.j * block_kv:step.j * block_kv + len(scores[step.j]), 0]
        tiles.append(TileState(step.j, "masked" if step.masked else "full", float(step.m[0]), float(step.alpha[0]),
                               float(step.l[0]), accumulator(step)[0], change, tile_scores,
                               np.exp(tile_scores - float(step.m[0]))))  # this tile's weights on the new max
    flat = k[:, 0]
    e = np.exp(flat - flat.max())  # float64, the whole row at once
    weights = e / e.sum()
    stored = run.out[0].astype(np.float64)
    view = TRACE_VIEWS[variant]
    return ScoresWalkthrough(variant, view.title, view.symbol, view.final, block_kv, v.shape[1], tuple(tiles),
                             view.output(run.trace[-1])[0], stored, flat, weights, weights @ v,
                             float(np.abs(stored - weights @ v).max()))


@attrs.frozen
class RowWalkthrough:
    """One query row of a random problem: its state after every KV tile it visits."""

    row: int
    query_tile: int
    row_in_tile: int
    tiles: tuple[TileState, ...]
    stored_output: np.ndarray  # (d,)
    reference: np.ndarray  # float64, (d,)
    max_abs_error: float


@attrs.frozen
class RandomWalkthrough:
    """Query rows of a random configuration (seeded standard normal q, k, v)."""

    variant: str
    title: str
    accumulator: str
    final_rule: str
    n_q: int
    n_kv: int
    d: int
    block_q: int
    block_kv: int
    dtype: str
    causal: bool
    causal_variant: str
    seed: int
    rows: tuple[RowWalkthrough, ...]


def random_walkthrough(n_q: int, n_kv: int, d: int, block_q: int, block_kv: int, causal: bool,
                       causal_variant: CausalVariant, variant: Variant, dtype: StorageDtypeName, rows: Sequence[int],
                       seed: int) -> RandomWalkthrough:
    outside = [r for r in rows if not 0 <= r < n_q]
    if outside:
        raise ValueError(f"rows must lie in [0, {n_q}), got {outside}")
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((n_q, d)), rng.standard_normal((n_kv, d)), rng.standard_normal((n_kv, d))
    run = flash_attention(q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, causal_variant=causal_variant,
                          dtype=dtype, variant=variant, trace="full", trace_tiles={r // block_q for r in rows})
    sched = run.config.tile_schedule()
    reference = reference_attention(q, k, v, causal, causal_variant, run.config.scale, dtype)  # (n_q, d) float64
    walked = []
    for r in rows:
        i = r // block_q
        steps = run.trace.of_tile(i)
        local = r - sched.q_rows(i).start
        tiles = tuple(TileState(s.j, sched.tile_kind(i, s.j), float(s.m[local]), float(s.alpha[local]),
                                float(s.l[local]), accumulator(s)[local], change)
                      for s, change in zip(steps, what_changed(steps, local)))
        stored = run.out[r].astype(np.float64)
        walked.append(RowWalkthrough(r, i, local, tiles, stored, reference[r],
                                     float(np.abs(stored - reference[r]).max())))
    view = TRACE_VIEWS[variant]
    return RandomWalkthrough(variant, view.title, view.symbol, view.final, n_q, n_kv, d, block_q, block_kv, dtype,
                             causal, causal_variant, seed, tuple(walked))
