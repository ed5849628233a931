"""Trace files as JSON: a header (format, schema version, level, config) and one line per TileStep.

Human-readable and diff-friendly. Floats are the exact float32 values written as decimal float64, so
a round trip is lossless; non-finite values (m = -inf for a row that has seen no key yet) are written
as the strings "-inf", "inf", "nan" to keep the JSON strict. Optional per-row fields
(OPTIONAL_FIELDS: FA-1's m_tile, l_tile and beta), a split-KV step's split and a split-KV run's
combine weights are written only by traces that hold them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simflash.trace_schema import (
    FORWARD_FILE,
    INDEX_FIELDS,
    OPTIONAL_FIELDS,
    SPLIT_FIELD,
    STEP_FIELDS,
    FileKind,
    TraceContents,
    TraceFileError,
    check_config,
    check_header,
    checked_combine_weights,
    checked_step,
    float_rows,
    floats,
    parse_json,
    plain,
    shown,
)
from simflash.trace_step import TileStep

if TYPE_CHECKING:
    from simflash.trace import Trace


def float_list(values: np.ndarray) -> list:
    """float32 values as exact decimal float64s; non-finite ones as strings (strict JSON)."""
    return [float(x) if math.isfinite(x) else str(float(x)) for x in values.astype(np.float64).ravel()]


def row_lists(values: np.ndarray | None) -> list | None:
    """A float32 matrix as a list of rows (see float_list); None stays None."""
    return None if values is None else [float_list(row) for row in values]


def step_dict(step: TileStep) -> dict:
    return {
        "head": step.head, "i": step.i, "j": step.j, "row_start": step.row_start, "masked": step.masked,
        "m": float_list(step.m), "alpha": float_list(step.alpha), "l": float_list(step.l),
        "a": row_lists(step.a),
        **{k: float_list(getattr(step, k)) for k in OPTIONAL_FIELDS if getattr(step, k) is not None},
        **({} if step.split is None else {SPLIT_FIELD: step.split}),
    }


def trace_json(trace: Trace) -> str:
    """The JSON text of a trace: an indented header, then one line per step."""
    header = header_dict(FORWARD_FILE, trace.level, trace.config)
    if trace.combine_weights is not None:
        header["combine_weights"] = row_lists(trace.combine_weights)
    return document(header, [step_dict(step) for step in trace.steps])


def header_dict(kind: FileKind, level: str, config: Mapping[str, Any]) -> dict:
    """The header of a trace file of `kind`."""
    return {"format": kind.format, "schema_version": kind.schema_version, "level": level, "config": dict(config)}


def document(header: dict, steps: list[dict]) -> str:
    """A trace file's JSON text: the header indented, then "steps" with one line per step."""
    text = json.dumps(header, indent=2, default=plain, allow_nan=False)
    lines = [json.dumps(step, allow_nan=False) for step in steps]
    listed = "[\n" + ",\n".join(f"    {line}" for line in lines) + "\n  ]" if lines else "[]"
    return text.removesuffix("\n}") + f',\n  "steps": {listed}\n}}\n'


def read_json(path: Path) -> Any:
    """A JSON file's document; TraceFileError for one that is not text, not JSON, or nested too deeply."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}: not a text file (corrupted, or not JSON?)") from None
    return parse_json(text, path, "the file", "not a complete JSON document (truncated or corrupted?)")


def index(raw: Mapping, name: str, where: str, path: Path) -> int:
    """The non-negative integer raw[name] of step `where`."""
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFileError(f"{path}: {where}.{name} must be a non-negative integer, got {shown(value)}")
    return value


def steps_list(doc: Mapping, path: Path) -> list:
    """The document's "steps", which must be a list."""
    raw_steps = doc.get("steps")
    if not isinstance(raw_steps, list):
        raise TraceFileError(f"{path}: steps must be a list, got {shown(raw_steps)}")
    return raw_steps


def step_objects(raw_steps: list, path: Path, fields: tuple[str, ...],
                 optional: tuple[str, ...] = ()) -> Iterator[tuple[str, Mapping]]:
    """("steps[n]", step) for every step: an object with `fields` (and maybe `optional`), masked a bool."""
    for n, raw in enumerate(raw_steps):
        where = f"steps[{n}]"
        if not isinstance(raw, Mapping) or not set(fields) <= set(raw) <= {*fields, *optional}:
            also = f" (and optionally {optional})" if optional else ""
            raise TraceFileError(f"{path}: {where} must be an object with the fields {fields}{also}")
        if not isinstance(raw["masked"], bool):
            raise TraceFileError(f"{path}: {where}.masked must be true or false, got {shown(raw['masked'])}")
        yield where, raw


def trace_from_json(doc: Any, path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of a parsed JSON trace document."""
    check_header(doc, path)
    level, raw_steps = doc["level"], steps_list(doc, path)
    config, geometry = check_config(doc.get("config"), path, has_steps=bool(raw_steps))
    steps = []
    for where, raw in step_objects(raw_steps, path, STEP_FIELDS, (*OPTIONAL_FIELDS, SPLIT_FIELD)):
        m, alpha, l = (floats(raw[k], f"{where}.{k}", path) for k in ("m", "alpha", "l"))
        a = None if raw["a"] is None else float_rows(raw["a"], f"{where}.a", path)
        optional = {k: floats(raw[k], f"{where}.{k}", path) for k in OPTIONAL_FIELDS if k in raw}
        head, i, j, row_start = (index(raw, k, where, path) for k in INDEX_FIELDS)
        steps.append(checked_step(
            path, where, level, geometry, head, i, j, row_start, raw["masked"],
            m, alpha, l, a, index(raw, SPLIT_FIELD, where, path) if SPLIT_FIELD in raw else None, **optional,
        ))
    return TraceContents(level, tuple(steps), config, _combine_weights(doc, path, config))


def _combine_weights(doc: Mapping, path: Path, config: dict[str, Any]) -> np.ndarray | None:
    """The header's combine_weights (a list of rows, one per split), checked, or None when absent."""
    raw = doc.get("combine_weights")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise TraceFileError(f"{path}: combine_weights must be a list of rows (one per split), got {shown(raw)}")
    return checked_combine_weights(float_rows(raw, "combine_weights", path), path, config)
