"""Trace files as NPZ: the JSON file's content as plain arrays, one row of state per array row.

Per-step arrays (head, i, j, row_start, masked, rows, and a split-KV trace's split) and the state of
every step's rows stacked (m, alpha, l, the optional OPTIONAL_FIELDS, and a in a "full" trace); a
split-KV run's combine weights as one (splits, rows) array; header scalars and the config as JSON
text. Loaded with `allow_pickle=False`.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simflash.config import STATE_DTYPE
from simflash.trace_schema import (
    FORWARD_FILE,
    INDEX_FIELDS,
    OPTIONAL_FIELDS,
    SPLIT_FIELD,
    FileKind,
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
        **header_arrays(FORWARD_FILE, trace.level, trace.config),
        **per_step_arrays(steps, INDEX_FIELDS),
        "rows": np.array([s.m.size for s in steps], dtype=np.int64),  # step k owns rows[k] state rows
    }
    for k in ("m", "alpha", "l"):
        arrays[k] = stack([getattr(s, k) for s in steps])
    for k in OPTIONAL_FIELDS:  # written when every step holds it
        if steps and all(getattr(s, k) is not None for s in steps):
            arrays[k] = np.concatenate([getattr(s, k) for s in steps])
    if steps and all(s.split is not None for s in steps):
        arrays[SPLIT_FIELD] = np.array([s.split for s in steps], dtype=np.int64)
    if trace.level == "full":
        arrays["a"] = stack([np.asarray(s.a) for s in steps], ndim=2)
    if trace.combine_weights is not None:
        arrays["combine_weights"] = trace.combine_weights
    return arrays


def stack(values: list[np.ndarray], ndim: int = 1) -> np.ndarray:
    """Every step's array, one after another along the first axis (no steps: empty, `ndim` dimensions)."""
    return np.concatenate(values) if values else np.zeros((0,) * ndim, STATE_DTYPE)


def per_step_arrays(steps: Sequence[Any], keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The integer fields `keys` and `masked` of every step, one entry per step."""
    return {**{k: np.array([getattr(s, k) for s in steps], dtype=np.int64) for k in keys},
            "masked": np.array([s.masked for s in steps], dtype=bool)}


def header_arrays(kind: FileKind, level: str, config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The header of a trace of `kind` as 0-d arrays; the config as JSON text."""
    return {"format": np.array(kind.format), "schema_version": np.array(kind.schema_version),
            "level": np.array(level), "config_json": np.array(json.dumps(dict(config), default=plain, allow_nan=False))}


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


def array(arrays: Mapping[str, np.ndarray], key: str, kind: str, ndim: int, path: Path) -> np.ndarray:
    """arrays[key], of dtype kind `kind` ("iu", "f", ...) and `ndim` dimensions."""
    if key not in arrays:
        raise TraceFileError(f"{path}: missing array {key!r}")
    found = arrays[key]
    if found.dtype.kind not in kind or found.ndim != ndim:
        raise TraceFileError(f"{path}: array {key!r} has dtype {found.dtype} and {found.ndim} dimensions, "
                             f"expected kind {kind!r} and {ndim}")
    return found


def read_header(arrays: Mapping[str, np.ndarray], path: Path, kind: FileKind) -> tuple[str, dict]:
    """The level and the raw config of an NPZ trace of `kind`, its header checked."""
    def scalar(key: str, dtype_kind: str) -> Any:
        return array(arrays, key, dtype_kind, 0, path).item()

    header = {"format": scalar("format", "U"), "schema_version": scalar("schema_version", "iu"),
              "level": scalar("level", "U")}
    check_header(header, path, kind)
    raw_config = parse_json(scalar("config_json", "U"), path, "config_json", "config_json is not valid JSON")
    if not isinstance(raw_config, dict):
        raise TraceFileError(f"{path}: config_json must hold an object, got {raw_config!r}")
    return header["level"], raw_config


def per_step(arrays: Mapping[str, np.ndarray], keys: tuple[str, ...], counts: tuple[str, ...],
             path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`masked` and the integer per-step arrays `keys` (non-negative) and `counts` (positive), one entry
    per step each."""
    masked = array(arrays, "masked", "b", 1, path)
    index = {k: array(arrays, k, "iu", 1, path) for k in (*keys, *counts)}
    for key, values in index.items():
        if values.size != masked.size:
            raise TraceFileError(f"{path}: the per-step arrays must all hold {masked.size} entries (one per step); "
                                 f"{key!r} holds {values.size}")
        negative = np.flatnonzero(values < (1 if key in counts else 0))
        if negative.size:
            least = "positive" if key in counts else "non-negative"
            raise TraceFileError(f"{path}: array {key!r} must hold {least} integers, got {int(values[negative[0]])} "
                                 f"at step {int(negative[0])}")
    return masked, index


def check_stacked(stacked: Mapping[str, np.ndarray], total: int, what: str, path: Path) -> None:
    """Every array of `stacked` holds `total` float32 rows (the state of every step, one after another)."""
    for key, values in stacked.items():
        if values.shape[0] != total:
            raise TraceFileError(f"{path}: the state arrays must hold {total} rows ({what}); "
                                 f"{key!r} holds {values.shape[0]}")
        if values.dtype != STATE_DTYPE:
            raise TraceFileError(f"{path}: the state arrays must be {STATE_DTYPE}; {key!r} is {values.dtype}")


def spans(counts: Sequence[int] | np.ndarray) -> list[slice]:
    """The slice of the stacked arrays each step owns, from how many entries each holds."""
    stops = np.cumsum(counts)
    return [slice(int(stop) - int(n), int(stop)) for stop, n in zip(stops, counts)]


def trace_from_arrays(arrays: Mapping[str, np.ndarray], path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of an NPZ trace's arrays."""
    level, raw_config = read_header(arrays, path, FORWARD_FILE)
    masked, index = per_step(arrays, (*INDEX_FIELDS, *((SPLIT_FIELD,) if SPLIT_FIELD in arrays else ())),
                             ("rows",), path)
    state = {k: array(arrays, k, "f", 1, path) for k in ("m", "alpha", "l", *OPTIONAL_FIELDS)
             if k in arrays or k not in OPTIONAL_FIELDS}
    a = array(arrays, "a", "f", 2, path) if level == "full" else None
    config, geometry = check_config(raw_config, path, has_steps=masked.size > 0)
    check_stacked({**state, **({} if a is None else {"a": a})}, sum(map(int, index["rows"])),
                  "the sum of 'rows'", path)
    steps = []
    for n, rows in enumerate(spans(index["rows"])):
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
        weights = checked_combine_weights(array(arrays, "combine_weights", "f", 2, path), path, config)
    return TraceContents(level, tuple(steps), config, weights)
