"""Backward traces as files: the forward's JSON and NPZ formats, holding BackwardSteps.

The header says what the file holds (format "simflash.backward_trace", its own schema version,
simflash.trace_schema.BACKWARD_FILE), with the level and the run's config; loading a backward file as
a forward trace, or the reverse, raises TraceFileError naming the loader to use.

- JSON: one line per step, {"head", "j", "i", "col_start", "row_start", "masked", the per-row L, D,
  p_rowsum, dq_norm, the per-column dk_norm, dv_norm, and P, dS, dK, dV as lists of rows (null in a
  "stats" trace)}. L of a row that sees no key is +inf, written "inf".
- NPZ: per-step head, j, i, col_start, row_start, masked, rows (B_r) and cols (B_c); the per-row and
  per-column arrays of every step stacked; in a "full" trace P and dS flattened row by row, one step
  after another, and dK, dV stacked as (sum of cols, d).

Reading checks what the forward's readers check (types, float32 range, indices and shapes against the
config) and that every value is finite, but L, which may also be +inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simflash.trace_backward_step import BackwardStep
from simflash.trace_files import Codec
from simflash.trace_json import document, float_list, header_dict, index, row_lists, step_objects, steps_list
from simflash.trace_npz import array, check_stacked, header_arrays, per_step, per_step_arrays, read_header, spans, stack
from simflash.trace_schema import (
    BACKWARD_FILE,
    CONFIG_TYPES,
    Geometry,
    TraceContents,
    TraceFileError,
    check_config,
    check_header,
    check_tile,
    float_rows,
    floats,
)

if TYPE_CHECKING:
    from simflash.trace_backward import BackwardTrace

INDEX_FIELDS = ("head", "j", "i", "col_start", "row_start")
ROW_FIELDS = ("L", "D", "p_rowsum", "dq_norm")  # (B_r,)
COL_FIELDS = ("dk_norm", "dv_norm")  # (B_c,)
TILE_FIELDS = ("P", "dS")  # (B_r, B_c), "full" only
ACCUMULATOR_FIELDS = ("dK", "dV")  # (B_c, d), "full" only
FULL_FIELDS = (*TILE_FIELDS, *ACCUMULATOR_FIELDS)
STEP_FIELDS = (*INDEX_FIELDS, "masked", *ROW_FIELDS, *COL_FIELDS, *FULL_FIELDS)
# The backward's config also names the tiles of the forward whose L it read.
BACKWARD_CONFIG_TYPES = {**CONFIG_TYPES, "forward_block_q": "positive int", "forward_block_kv": "positive int"}


def checked_backward_step(path: Path, where: str, level: str, geometry: Geometry | None, indices: Mapping[str, Any],
                          masked: bool, arrays: Mapping[str, Any]) -> BackwardStep:
    """A BackwardStep whose arrays agree with each other, with the level and with the config's tiling."""
    if level == "none":
        raise TraceFileError(f"{path}: a trace of level 'none' holds no steps, found {where}")
    for k in FULL_FIELDS:
        if (level == "full") != (arrays[k] is not None):
            raise TraceFileError(f"{path}: {where}: a {level!r} trace {'needs' if level == 'full' else 'has no'} {k}")
    rows, cols = arrays["L"].size, arrays["dk_norm"].size
    if not (rows and cols):
        raise TraceFileError(f"{path}: {where}: L and dk_norm must be non-empty (the tile's rows and columns), got "
                             f"{rows} and {cols} entries")
    expected: dict[str, tuple[int, ...]] = {k: (rows,) for k in ROW_FIELDS} | {k: (cols,) for k in COL_FIELDS}
    if level == "full":
        d = arrays["dK"].shape[1] if arrays["dK"].ndim == 2 else 0
        if not d:
            raise TraceFileError(f"{path}: {where}.dK must be a (B_c, d) matrix with d > 0, got shape "
                                 f"{arrays['dK'].shape}")
        expected |= {k: (rows, cols) for k in TILE_FIELDS} | {k: (cols, d) for k in ACCUMULATOR_FIELDS}
    for k, shape in expected.items():
        if arrays[k].shape != shape:
            raise TraceFileError(f"{path}: {where}.{k} must have shape {shape} (B_r = {rows} like L, B_c = {cols} "
                                 f"like dk_norm), got {arrays[k].shape}")
        finite = np.isfinite(arrays[k]) | (np.isposinf(arrays[k]) if k == "L" else False)
        if not finite.all():
            bad = np.unravel_index(np.flatnonzero(~finite)[0], shape)
            allowed = "finite or +inf (a row that sees no key)" if k == "L" else "finite"
            raise TraceFileError(f"{path}: {where}.{k}{list(map(int, bad))} = {arrays[k][bad]} must be {allowed}")
    if geometry is not None:
        head, j, i, col_start, row_start = (indices[k] for k in INDEX_FIELDS)
        check_tile(path, where, geometry, head, i, j, row_start, rows, "L")
        tile_cols = geometry.sched.kv_cols(j)
        if col_start != tile_cols.start or cols != tile_cols.stop - tile_cols.start:
            raise TraceFileError(
                f"{path}: {where}: col_start = {col_start} and {cols} columns (dk_norm) disagree with the config: "
                f"KV tile j = {j} is columns {tile_cols.start} to {tile_cols.stop - 1} (n_kv = {geometry.sched.n_kv}, "
                f"block_kv = {geometry.sched.block_kv})")
        if level == "full" and arrays["dK"].shape[1] != geometry.d:
            raise TraceFileError(f"{path}: {where}.dK has {arrays['dK'].shape[1]} columns; the config's d = "
                                 f"{geometry.d}")
    return BackwardStep(**indices, masked=masked, **arrays)


# ------------------------------------------------------------------------------------------- JSON


def backward_step_dict(step: BackwardStep) -> dict:
    return {**{k: getattr(step, k) for k in INDEX_FIELDS}, "masked": step.masked,
            **{k: float_list(getattr(step, k)) for k in (*ROW_FIELDS, *COL_FIELDS)},
            **{k: row_lists(getattr(step, k)) for k in FULL_FIELDS}}


def backward_json(trace: BackwardTrace) -> str:
    """The JSON text of a backward trace: an indented header, then one line per step."""
    return document(header_dict(BACKWARD_FILE, trace.level, trace.config), [backward_step_dict(s) for s in trace])


def backward_from_json(doc: Any, path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of a parsed JSON backward trace."""
    check_header(doc, path, BACKWARD_FILE)
    level, raw_steps = doc["level"], steps_list(doc, path)
    config, geometry = check_config(doc.get("config"), path, bool(raw_steps), BACKWARD_CONFIG_TYPES)
    steps = []
    for where, raw in step_objects(raw_steps, path, STEP_FIELDS):
        arrays: dict[str, np.ndarray | None] = {
            k: floats(raw[k], f"{where}.{k}", path) for k in (*ROW_FIELDS, *COL_FIELDS)}
        arrays |= {k: None if raw[k] is None else float_rows(raw[k], f"{where}.{k}", path) for k in FULL_FIELDS}
        indices = {k: index(raw, k, where, path) for k in INDEX_FIELDS}
        steps.append(checked_backward_step(path, where, level, geometry, indices, raw["masked"], arrays))
    return TraceContents(level, tuple(steps), config)


# -------------------------------------------------------------------------------------------- NPZ


def backward_arrays(trace: BackwardTrace) -> dict[str, np.ndarray]:
    """The backward trace as plain arrays: per-step indices and sizes, every step's arrays stacked."""
    steps = trace.steps
    arrays = {
        **header_arrays(BACKWARD_FILE, trace.level, trace.config),
        **per_step_arrays(steps, INDEX_FIELDS),
        "rows": np.array([s.L.size for s in steps], dtype=np.int64),
        "cols": np.array([s.dk_norm.size for s in steps], dtype=np.int64),
        **{k: stack([getattr(s, k) for s in steps]) for k in (*ROW_FIELDS, *COL_FIELDS)},
    }
    if trace.level == "full":
        arrays |= {k: stack([getattr(s, k).ravel() for s in steps]) for k in TILE_FIELDS}
        arrays |= {k: stack([getattr(s, k) for s in steps], ndim=2) for k in ACCUMULATOR_FIELDS}
    return arrays


def backward_from_arrays(arrays: Mapping[str, np.ndarray], path: Path = Path("<trace>")) -> TraceContents:
    """The checked contents of an NPZ backward trace's arrays."""
    level, raw_config = read_header(arrays, path, BACKWARD_FILE)
    masked, indices = per_step(arrays, INDEX_FIELDS, ("rows", "cols"), path)
    config, geometry = check_config(raw_config, path, masked.size > 0, BACKWARD_CONFIG_TYPES)
    rows, cols = ([int(n) for n in indices[k]] for k in ("rows", "cols"))
    tiles = [r * c for r, c in zip(rows, cols)]
    # (the arrays, their stacked length, what it is, each step's span of them)
    groups = [({k: array(arrays, k, "f", 1, path) for k in ROW_FIELDS}, rows, "the sum of 'rows'"),
              ({k: array(arrays, k, "f", 1, path) for k in COL_FIELDS}, cols, "the sum of 'cols'")]
    if level == "full":
        groups += [({k: array(arrays, k, "f", 1, path) for k in TILE_FIELDS}, tiles, "the sum of rows x cols"),
                   ({k: array(arrays, k, "f", 2, path) for k in ACCUMULATOR_FIELDS}, cols, "the sum of 'cols'")]
    for stacked, counts, what in groups:
        check_stacked(stacked, sum(counts), what, path)
    group_spans = [spans(counts) for _, counts, _ in groups]
    steps = []
    for n in range(masked.size):
        fields: dict[str, Any] = dict.fromkeys(FULL_FIELDS)
        for (stacked, _, _), step_spans in zip(groups, group_spans):
            fields |= {k: values[step_spans[n]].copy() for k, values in stacked.items()}
        fields |= {k: fields[k].reshape(rows[n], cols[n]) for k in TILE_FIELDS if fields[k] is not None}
        steps.append(checked_backward_step(path, f"steps[{n}]", level, geometry,
                                           {k: int(indices[k][n]) for k in INDEX_FIELDS}, bool(masked[n]), fields))
    return TraceContents(level, tuple(steps), config)


BACKWARD_CODEC = Codec(BACKWARD_FILE, backward_json, backward_from_json, backward_arrays, backward_from_arrays,
                       timeline=False)
