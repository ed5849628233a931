"""Trace files as NPZ: the JSON file's content as plain arrays, one row of state per array row.

Per-step arrays (head, i, j, row_start, masked, rows, and a split-KV trace's split) and the state of
every step's rows stacked (m, alpha, l, the optional OPTIONAL_FIELDS, and a in a "full" trace); a
split-KV run's combine weights as one (splits, rows) array; header scalars and the config as JSON
text. Loaded with `allow_pickle=False`.
"""

from __future__ import annotations

import json
import zipfile
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
    TraceContents,
    TraceFileError,
    check_config,
    check_header,
    checked_combine_weights,
    checked_step,
    parse_json,
    plain,
)

if TYPE_CHECKING:
    from simflash.trace import Trace


def trace_arrays(trace: Trace) -> dict[str, np.ndarray]:
    """The trace as plain arrays: per-step indices, and the state of every step's rows stacked."""
    steps = trace.steps
    arrays = {
        "format": np.array(FORMAT_NAME),
        "schema_version": np.array(SCHEMA_VERSION),
        "level": np.array(trace.level),
        "config_json": np.array(json.dumps(dict(trace.config), default=plain, allow_nan=False)),
        **{k: np.array([getattr(s, k) for s in steps], dtype=np.int64) for k in INDEX_FIELDS},
        "masked": np.array([s.masked for s in steps], dtype=bool),
        "rows": np.array([s.m.size for s in steps], dtype=np.int64),  # step k owns rows[k] state rows
    }
    for k in ("m", "alpha", "l"):
        arrays[k] = np.concatenate([getattr(s, k) for s in steps]) if steps else np.zeros(0, STATE_DTYPE)
    for k in OPTIONAL_FIELDS:  # written when every step holds it
        if steps and all(getattr(s, k) is not None for s in steps):
            arrays[k] = np.concatenate([getattr(s, k) for s in steps])
    if steps and all(s.split is not None for s in steps):
        arrays[SPLIT_FIELD] = np.array([s.split for s in steps], dtype=np.int64)
    if trace.level == "full":
        arrays["a"] = np.concatenate([s.a for s in steps]) if steps else np.zeros((0, 0), STATE_DTYPE)
    if trace.combine_weights is not None:
        arrays["combine_weights"] = trace.combine_weights
    return arrays


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an NPZ archive; TraceFileError for a damaged archive or a lone .npy array."""
    damaged = (zipfile.BadZipFile, EOFError, OSError, ValueError)
    # Our own file handle: np.load leaves its own open when the archive turns out to be damaged.
    with path.open("rb") as file:
        try:
            archive = np.load(file, allow_pickle=False)
        except damaged as error:
            raise TraceFileError(f"{path}: not a readable NPZ archive (truncated or corrupted?): {error}") from None
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise TraceFileError(f"{path}: holds a single array, not an NPZ archive of a trace")
        with archive:
            try:
                return {key: archive[key] for key in archive.files}
            except damaged as error:
                raise TraceFileError(f"{path}: an array in the archive is damaged: {error}") from None


def _array(arrays: Mapping[str, np.ndarray], key: str, kind: str, ndim: int, path: Path) -> np.ndarray:
    if key not in arrays:
        raise TraceFileError(f"{path}: missing array {key!r}")
    array = arrays[key]
    if array.dtype.kind not in kind or array.ndim != ndim:
        raise TraceFileError(f"{path}: array {key!r} has dtype {array.dtype} and {array.ndim} dimensions, "
                             f"expected kind {kind!r} and {ndim}")
    return array


def trace_from_arrays(arrays: Mapping[str, np.ndarray], path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of an NPZ trace's arrays."""
    def scalar(key: str, kind: str) -> Any:
        return _array(arrays, key, kind, 0, path).item()

    header = {"format": scalar("format", "U"), "schema_version": scalar("schema_version", "iu"),
              "level": scalar("level", "U")}
    check_header(header, path)
    raw_config = parse_json(scalar("config_json", "U"), path, "config_json", "config_json is not valid JSON")
    if not isinstance(raw_config, dict):
        raise TraceFileError(f"{path}: config_json must hold an object, got {raw_config!r}")
    level = header["level"]
    index = {k: _array(arrays, k, "iu", 1, path) for k in (*INDEX_FIELDS, "rows", SPLIT_FIELD)
             if k in arrays or k != SPLIT_FIELD}
    masked = _array(arrays, "masked", "b", 1, path)
    state = {k: _array(arrays, k, "f", 1, path) for k in ("m", "alpha", "l", *OPTIONAL_FIELDS)
             if k in arrays or k not in OPTIONAL_FIELDS}
    a = _array(arrays, "a", "f", 2, path) if level == "full" else None
    count = masked.size
    for key, array in index.items():
        if array.size != count:
            raise TraceFileError(f"{path}: the per-step arrays must all hold {count} entries (one per step); "
                                 f"{key!r} holds {array.size}")
        negative = np.flatnonzero(array < (1 if key == "rows" else 0))
        if negative.size:
            least = "positive" if key == "rows" else "non-negative"
            raise TraceFileError(f"{path}: array {key!r} must hold {least} integers, got {int(array[negative[0]])} "
                                 f"at step {int(negative[0])}")
    config, geometry = check_config(raw_config, path, has_steps=count > 0)
    total = int(index["rows"].sum())
    for key, array in (*state.items(), *([] if a is None else [("a", a)])):
        if array.shape[0] != total:
            raise TraceFileError(f"{path}: the state arrays must hold {total} rows (the sum of 'rows'); "
                                 f"{key!r} holds {array.shape[0]}")
        if array.dtype != STATE_DTYPE:
            raise TraceFileError(f"{path}: the state arrays must be {STATE_DTYPE}; {key!r} is {array.dtype}")
    stops = np.cumsum(index["rows"])
    steps = []
    for n in range(count):
        rows = slice(int(stops[n] - index["rows"][n]), int(stops[n]))
        head, i, j, row_start = (int(index[k][n]) for k in INDEX_FIELDS)
        m, alpha, l = (state[k][rows].copy() for k in ("m", "alpha", "l"))
        steps.append(checked_step(
            path, f"steps[{n}]", level, geometry, head, i, j, row_start, bool(masked[n]),
            m, alpha, l, None if a is None else a[rows].copy(),
            int(index[SPLIT_FIELD][n]) if SPLIT_FIELD in index else None,
            **{k: state[k][rows].copy() for k in OPTIONAL_FIELDS if k in state},
        ))
    weights = None
    if "combine_weights" in arrays:
        weights = checked_combine_weights(_array(arrays, "combine_weights", "f", 2, path), path, config)
    return TraceContents(level, tuple(steps), config, weights)
