"""Saving and loading traces: the format from the suffix, then the module that writes or reads it.

- JSON (`.json`, simflash.trace_json): readable and diff-friendly, lossless.
- NPZ (`.npz`, simflash.trace_npz): the same content as plain arrays.
- Perfetto (`.perfetto.json`, simflash.perfetto): a timeline of a run's MemoryEvents, for viewing; it
  holds no tile state, so it can be written but not loaded.

Reading checks everything (simflash.trace_schema): a damaged, foreign or inconsistent file raises
TraceFileError, a ValueError naming the file and the field. Trace.save and Trace.load call these with
the forward's Codec, BackwardTrace.save and BackwardTrace.load with the backward's
(simflash.trace_backward_files); this module imports neither trace class (so neither closes an
import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simflash.memory import MemoryEvent
from simflash.perfetto import write_perfetto
from simflash.trace_json import read_json, trace_from_json, trace_json
from simflash.trace_npz import read_npz, trace_arrays, trace_from_arrays
from simflash.trace_schema import FORWARD_FILE, FileKind, TraceContents, TraceFileError

if TYPE_CHECKING:
    from simflash.trace import Trace
    from simflash.trace_backward import BackwardTrace

__all__ = ["FORMATS", "FORWARD_CODEC", "Codec", "TraceContents", "TraceFileError", "format_for", "read", "save"]

FORMATS = ("json", "npz", "perfetto")


@attrs.frozen
class Codec:
    """How one kind of trace is written to and read from each format (see simflash.trace_schema.FILE_KINDS)."""

    kind: FileKind
    to_json: Callable[[Any], str]
    from_json: Callable[[Any, Path], Any]
    to_arrays: Callable[[Any], dict[str, np.ndarray]]
    from_arrays: Callable[[Any, Path], Any]
    timeline: bool  # whether its runs record the events a Perfetto timeline is drawn from


FORWARD_CODEC = Codec(FORWARD_FILE, trace_json, trace_from_json, trace_arrays, trace_from_arrays, timeline=True)


def format_for(path: str | Path, format: str | None = None) -> str:
    """The file format: `format` when given, else from the suffix (.perfetto.json, .json, .npz)."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        return format
    name = Path(path).name.lower()
    if name.endswith(".perfetto.json"):
        return "perfetto"
    if name.endswith(".json"):
        return "json"
    if name.endswith(".npz"):
        return "npz"
    raise ValueError(f"path must end in .json, .npz or .perfetto.json (or pass format= one of {FORMATS}), "
                     f"got {str(path)!r}")


def save(trace: Trace | BackwardTrace, path: str | Path, format: str | None = None, *,
         events: Sequence[MemoryEvent] = (), codec: Codec = FORWARD_CODEC) -> Path:
    """Write `trace` (of codec's kind) to `path`; a Perfetto timeline is drawn from `events` (a run's
    `run.events`)."""
    path = Path(path)
    kind = format_for(path, format)
    if kind == "perfetto":
        if not codec.timeline:
            raise ValueError(f"format: {codec.kind.what} has no Perfetto timeline (its run records no events); "
                             "save it as .json or .npz")
        if not events:
            raise ValueError("events must hold the run's MemoryEvents for a Perfetto timeline: run with "
                             "record_events=True and pass events=run.events")
        write_perfetto(path, events, trace.config)
    elif kind == "json":
        path.write_text(codec.to_json(trace))
    else:
        # (given a name, np.savez would add .npz to one without it; numpy's stub reads a name as allow_pickle)
        with path.open("wb") as file:
            np.savez(file, **codec.to_arrays(trace))  # type: ignore[arg-type]
    return path


def read(path: str | Path, format: str | None = None, codec: Codec = FORWARD_CODEC) -> Any:
    """The checked contents of a trace of codec's kind saved as .json or .npz (Trace.load makes a Trace of
    them)."""
    path = Path(path)
    kind = format_for(path, format)
    if kind == "perfetto":
        raise TraceFileError(f"{path}: a Perfetto file is a timeline for viewing and holds no tile state; "
                             "load the trace's .json or .npz file")
    if kind == "json":
        return codec.from_json(read_json(path), path)
    return codec.from_arrays(read_npz(path), path)
