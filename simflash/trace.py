"""Per-tile records of the online-softmax state: TileStep, the Trace that holds them, and what to record."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from simflash import trace_files
from simflash.config import STATE_DTYPE, MiB
from simflash.trace_step import TRACE_LEVELS, TileStep, TraceLevel

__all__ = ["DEFAULT_TRACE_BUDGET_BYTES", "TRACE_LEVELS", "TileStep", "Trace", "TraceLevel", "TraceRequest",
           "trace_request"]

# A default trace must stay small whatever N is; larger ones are asked for by naming tiles.
DEFAULT_TRACE_BUDGET_BYTES = 64 * MiB


Step = TypeVar("Step")


class StepSequence(Sequence[Step]):
    """Recorded steps, read as a sequence: the class keeps them in its `steps` tuple."""

    steps: tuple[Step, ...]

    def __getitem__(self, index):
        return self.steps[index]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)


@attrs.frozen(eq=False)
class Trace(StepSequence[TileStep]):
    """The recorded steps of a run, in execution order, with the run's configuration.

    A split-KV run (Flash-Decoding) also records its combine's weights exp(LSE_s - LSE):
    float32 (splits, rows), rows as the partial logsumexps hold them; None for other runs.
    """

    level: str = "none"
    steps: tuple[TileStep, ...] = ()
    config: Mapping[str, Any] = attrs.field(factory=dict)
    combine_weights: np.ndarray | None = None

    def of_tile(self, i: int, head: int = 0) -> list[TileStep]:
        """The steps of query tile i, in the order its KV tiles were visited."""
        return [step for step in self.steps if step.i == i and step.head == head]

    def save(self, path, format: str | None = None, *, events=()):
        """Write the trace by suffix: .json (readable), .npz (arrays), .perfetto.json (a timeline
        drawn from `events`, a run's `run.events`). See simflash.trace_files."""
        return trace_files.save(self, path, format, events=events)

    @classmethod
    def load(cls, path, format: str | None = None) -> Trace:
        """Read a trace written by `save` as .json or .npz; a damaged, foreign or Perfetto file raises
        simflash.trace_files.TraceFileError (a ValueError) naming the file and the field."""
        contents = trace_files.read(path, format)
        return cls(contents.level, contents.steps, contents.config, contents.combine_weights)

    def _repr_html_(self) -> str | None:
        """Jupyter: the trace viewer (`simflash view`'s page) in an iframe; None without a run configuration."""
        from simflash.viewer import repr_html

        return repr_html(self)


@attrs.frozen
class TraceRequest:
    """What an algorithm records: the level, and which heads and query tiles (None: all)."""

    level: str = "stats"
    heads: frozenset[int] | None = None
    tiles: frozenset[int] | None = None

    def records(self, head: int, i: int) -> bool:
        return (
            self.level != "none"
            and (self.heads is None or head in self.heads)
            and (self.tiles is None or i in self.tiles)
        )

    def step(self, head, i, j, row_start, masked, m, alpha, l, a, *, m_tile=None, l_tile=None,
             beta=None, split=None) -> TileStep:
        """A snapshot of the live state (copies: the algorithm goes on updating its arrays)."""

        def optional(x):
            return None if x is None else np.asarray(x, dtype=STATE_DTYPE).copy()

        return TileStep(
            head=head,
            i=i,
            j=j,
            row_start=row_start,
            masked=bool(masked),
            m=m.copy(),
            alpha=np.asarray(alpha, dtype=STATE_DTYPE).copy(),
            l=l.copy(),
            a=a.copy() if self.level == "full" else None,
            m_tile=optional(m_tile),
            l_tile=optional(l_tile),
            beta=optional(beta),
            split=split,
        )


def _index_set(name: str, values: Iterable[int] | None, count: int) -> frozenset[int] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be None or a collection of integer indices such as [0, 3], got {values!r}")
    values = list(values)
    wrong = [v for v in values if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))]
    if wrong:
        raise ValueError(f"{name} must hold integer indices, got {wrong[0]!r}")
    chosen = frozenset(int(v) for v in values)
    outside = sorted(v for v in chosen if not 0 <= v < count)
    if outside:
        raise ValueError(f"{name} must hold indices in [0, {count}), got {outside}")
    return chosen


def trace_request(
    level: str,
    heads: Iterable[int] | None,
    tiles: Iterable[int] | None,
    schedule,
    n_heads: int,
    d: int,
    budget_bytes: int = DEFAULT_TRACE_BUDGET_BYTES,
) -> TraceRequest:
    """Validate a trace request and refuse one whose recorded state would outgrow `budget_bytes`."""
    if level not in TRACE_LEVELS:
        raise ValueError(f"trace must be one of {TRACE_LEVELS}, got {level!r}")
    request = TraceRequest(
        level,
        _index_set("trace_heads", heads, n_heads),
        _index_set("trace_tiles", tiles, schedule.n_q_tiles),
    )
    if level == "none":
        return request
    floats_per_row = 3 + (d if level == "full" else 0)
    tile_ids = range(schedule.n_q_tiles) if request.tiles is None else request.tiles
    head_count = n_heads if request.heads is None else len(request.heads)
    rows_recorded = sum(
        len(schedule.kv_tiles(i)) * (schedule.q_rows(i).stop - schedule.q_rows(i).start) for i in tile_ids
    )
    nbytes = head_count * rows_recorded * floats_per_row * STATE_DTYPE.itemsize
    if nbytes > budget_bytes:
        raise ValueError(
            f"a {level!r} trace of every selected tile would hold {nbytes / MiB:.1f} MiB "
            f"(limit {budget_bytes / MiB:.0f} MiB); pick query tiles with trace_tiles=[...] and heads "
            f'with trace_heads=[...], or pass trace="none"'
        )
    return request
