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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simflash.config import STATE_DTYPE
from simflash.trace_schema import (
    FORMAT_NAME,
    INDEX_FIELDS,
    OPTIONAL_FIELDS,
    SCHEMA_VERSION,
    SPLIT_FIELD,
    STEP_FIELDS,
    TraceContents,
    TraceFileError,
    check_config,
    check_header,
    checked_combine_weights,
    checked_step,
    floats,
    parse_json,
    plain,
    shown,
)
from simflash.trace_step import TileStep

if TYPE_CHECKING:
    from simflash.trace import Trace


def _float_list(values: np.ndarray) -> list:
    """float32 values as exact decimal float64s; non-finite ones as strings (strict JSON)."""
    return [float(x) if math.isfinite(x) else str(float(x)) for x in values.astype(np.float64).ravel()]


def step_dict(step: TileStep) -> dict:
    return {
        "head": step.head, "i": step.i, "j": step.j, "row_start": step.row_start, "masked": step.masked,
        "m": _float_list(step.m), "alpha": _float_list(step.alpha), "l": _float_list(step.l),
        "a": None if step.a is None else [_float_list(row) for row in step.a],
        **{k: _float_list(getattr(step, k)) for k in OPTIONAL_FIELDS if getattr(step, k) is not None},
        **({} if step.split is None else {SPLIT_FIELD: step.split}),
    }


def trace_json(trace: Trace) -> str:
    """The JSON text of a trace: an indented header, then one line per step."""
    header = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, "level": trace.level,
              "config": dict(trace.config)}
    if trace.combine_weights is not None:
        header["combine_weights"] = [_float_list(row) for row in trace.combine_weights]
    text = json.dumps(header, indent=2, default=plain, allow_nan=False)
    lines = [json.dumps(step_dict(step), allow_nan=False) for step in trace.steps]
    steps = "[\n" + ",\n".join(f"    {line}" for line in lines) + "\n  ]" if lines else "[]"
    return text.removesuffix("\n}") + f',\n  "steps": {steps}\n}}\n'


def read_json(path: Path) -> Any:
    """A JSON file's document; TraceFileError for one that is not text, not JSON, or nested too deeply."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}: not a text file (corrupted, or not JSON?)") from None
    return parse_json(text, path, "the file", "not a complete JSON document (truncated or corrupted?)")


def _index(raw: Mapping, name: str, where: str, path: Path) -> int:
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFileError(f"{path}: {where}.{name} must be a non-negative integer, got {shown(value)}")
    return value


def trace_from_json(doc: Any, path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of a parsed JSON trace document."""
    check_header(doc, path)
    level, raw_steps = doc["level"], doc.get("steps")
    if not isinstance(raw_steps, list):
        raise TraceFileError(f"{path}: steps must be a list, got {shown(raw_steps)}")
    config, geometry = check_config(doc.get("config"), path, has_steps=bool(raw_steps))
    steps = []
    for n, raw in enumerate(raw_steps):
        where = f"steps[{n}]"
        optional_fields = {*OPTIONAL_FIELDS, SPLIT_FIELD}
        if not isinstance(raw, Mapping) or not set(STEP_FIELDS) <= set(raw) <= {*STEP_FIELDS, *optional_fields}:
            raise TraceFileError(f"{path}: {where} must be an object with the fields {STEP_FIELDS} "
                                 f"(and optionally {(*OPTIONAL_FIELDS, SPLIT_FIELD)})")
        if not isinstance(raw["masked"], bool):
            raise TraceFileError(f"{path}: {where}.masked must be true or false, got {shown(raw['masked'])}")
        m, alpha, l = (floats(raw[k], f"{where}.{k}", path) for k in ("m", "alpha", "l"))
        a = None
        if raw["a"] is not None:
            if not isinstance(raw["a"], list):
                raise TraceFileError(f"{path}: {where}.a must be a list of rows, got {shown(raw['a'])}")
            rows = [floats(row, f"{where}.a[{r}]", path) for r, row in enumerate(raw["a"])]
            if len({row.size for row in rows}) > 1:
                raise TraceFileError(f"{path}: {where}.a has rows of different lengths")
            a = np.array(rows, dtype=STATE_DTYPE).reshape(len(rows), rows[0].size if rows else 0)
        optional = {k: floats(raw[k], f"{where}.{k}", path) for k in OPTIONAL_FIELDS if k in raw}
        head, i, j, row_start = (_index(raw, k, where, path) for k in INDEX_FIELDS)
        steps.append(checked_step(
            path, where, level, geometry, head, i, j, row_start, raw["masked"],
            m, alpha, l, a, _index(raw, SPLIT_FIELD, where, path) if SPLIT_FIELD in raw else None, **optional,
        ))
    return TraceContents(level, tuple(steps), config, _combine_weights(doc, path, config))


def _combine_weights(doc: Mapping, path: Path, config: dict[str, Any]) -> np.ndarray | None:
    """The header's combine_weights (a list of rows, one per split), checked, or None when absent."""
    raw = doc.get("combine_weights")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise TraceFileError(f"{path}: combine_weights must be a list of rows (one per split), got {shown(raw)}")
    rows = [floats(row, f"combine_weights[{s}]", path) for s, row in enumerate(raw)]
    if len({row.size for row in rows}) > 1:
        raise TraceFileError(f"{path}: combine_weights has rows of different lengths")
    return checked_combine_weights(np.array(rows, dtype=STATE_DTYPE), path, config)
