"""What a trace file holds, and the checks every reader applies before it builds a TileStep.

A trace file (JSON or NPZ, see simflash.trace_files) is a header (format name, schema version, trace
level, the run's configuration) and the steps. Nothing in a file is trusted: a value of the wrong
type, a number outside float32, an index outside the file's own configuration or an array whose
shape disagrees with it raises TraceFileError, naming the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simflash.config import STATE_DTYPE
from simflash.schedule import TileSchedule
from simflash.trace_backward_step import BackwardStep
from simflash.trace_step import TRACE_LEVELS, TileStep

FORMAT_NAME = "simflash.trace"
SCHEMA_VERSION = 1
STEP_FIELDS = ("head", "i", "j", "row_start", "masked", "m", "alpha", "l", "a")
INDEX_FIELDS = ("head", "i", "j", "row_start")
SPLIT_FIELD = "split"  # optional index: the split of a split-KV run's step (see TileStep)
OPTIONAL_FIELDS = ("m_tile", "l_tile", "beta")  # per-row float32, present or None (see TileStep)
NON_FINITE = ("-inf", "inf", "nan")  # how JSON files spell the floats strict JSON has no numbers for
FLOAT32_MAX = float(np.finfo(STATE_DTYPE).max)

# The run configuration a trace records (simflash.api.RunConfig, less the defaults it leaves out):
# each field's type, checked whenever the field is present.
CONFIG_TYPES = {
    "algorithm": "str", "heads": "positive int", "n_q": "positive int", "n_kv": "positive int",
    "d": "positive int", "dtype": "str", "scale": "finite number", "causal": "bool", "causal_variant": "str",
    "block_q": "positive int or null", "block_kv": "positive int or null", "write_logsumexp": "bool",
    "gpu": "str or null", "sram_bytes": "positive int or null", "schedule": "str", "cache": "str or null",
    "o_accum_dtype": "str", "kv_stages": "positive int", "window": "window", "kv_heads": "positive int or null",
    "pack_gqa": "bool", "num_splits": "positive int or null", "cache_seqlens": "seqlens or null",
}
# What a trace with steps needs in its config to check them: tile indices, row ranges, d.
GEOMETRY_FIELDS = ("heads", "n_q", "n_kv", "d", "block_q", "block_kv")


class TraceFileError(ValueError):
    """A trace file that is corrupted, truncated, of another format or of an unsupported version."""


@attrs.frozen
class FileKind:
    """What a trace file's header says it holds: its format name and schema version, and how to load it."""

    format: str
    schema_version: int
    what: str  # for messages: "a forward trace"
    loader: str  # what reads it: "simflash.Trace.load"


FORWARD_FILE = FileKind(FORMAT_NAME, SCHEMA_VERSION, "a forward trace", "simflash.Trace.load")
BACKWARD_FILE = FileKind("simflash.backward_trace", 1, "a backward trace", "simflash.BackwardTrace.load")
FILE_KINDS = (FORWARD_FILE, BACKWARD_FILE)


@attrs.frozen(eq=False)
class TraceContents:
    """What a trace file holds, checked: the fields of a simflash.trace.Trace (or of a
    simflash.trace_backward.BackwardTrace, with BackwardSteps and no combine weights)."""

    level: str
    steps: tuple[TileStep, ...] | tuple[BackwardStep, ...]
    config: dict[str, Any]
    combine_weights: np.ndarray | None = None  # a split-KV run's (splits, rows), see simflash.trace.Trace


def shown(value: Any, limit: int = 40) -> str:
    """repr(value), shortened: a file may hold a 400-digit integer or a long string."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}...({len(text)} characters)"


def plain(value: Any) -> Any:
    """A config value as plain JSON (NumPy scalars become Python numbers): json.dumps' default."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"config values must be JSON numbers, strings, booleans or None, got {type(value).__name__}")


def _reject_constant(name: str) -> Any:
    raise TraceFileError(f"the non-standard JSON constant {name} (a trace spells it as a string: {NON_FINITE})")


def parse_json(text: str, path: Path, what: str, broken: str) -> Any:
    """Strict JSON: no NaN/Infinity constants; depth and integer-length limits as TraceFileErrors.

    `what` names the text in messages ("the file", "config_json"); `broken` says what text that does
    not parse is.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except TraceFileError as error:
        raise TraceFileError(f"{path}: {what} holds {error}") from None
    except RecursionError:
        raise TraceFileError(f"{path}: {what} is nested too deeply to be a simflash trace") from None
    except json.JSONDecodeError as error:
        raise TraceFileError(f"{path}: {broken}: {error}") from None
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise TraceFileError(f"{path}: {what} is not a valid trace: {error}") from None


def check_header(doc: Any, path: Path, kind: FileKind = FORWARD_FILE) -> None:
    """The format name of `kind` (a file of the other kind is named as such), an integer schema version
    this code reads, and a known level."""
    if isinstance(doc, Mapping) and "traceEvents" in doc:
        raise TraceFileError(f"{path}: a Perfetto timeline, not a simflash trace; load the .json or .npz trace")
    found = doc.get("format") if isinstance(doc, Mapping) else None
    if found != kind.format:
        other = next((k for k in FILE_KINDS if k.format == found), None)
        if other is not None:
            raise TraceFileError(f"{path}: {other.what} (format {other.format!r}), not {kind.what}; "
                                 f"load it with {other.loader}")
        raise TraceFileError(f"{path}: not a simflash trace (expected format {kind.format!r})")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceFileError(f"{path}: schema_version must be an integer (this simflash reads "
                             f"{kind.schema_version}), got {shown(version)}")
    if version != kind.schema_version:
        raise TraceFileError(f"{path}: schema version {version} is not supported; this simflash reads "
                             f"version {kind.schema_version} of {kind.what}")
    level = doc.get("level")
    if not isinstance(level, str) or level not in TRACE_LEVELS:
        raise TraceFileError(f"{path}: level must be one of {TRACE_LEVELS}, got {shown(level)}")


def _fits(kind: str, value: Any) -> bool:
    if value is None:
        return kind.endswith("or null")
    kind = kind.removesuffix(" or null")
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "window":  # (left, right), each an integer >= -1
        return (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in value))
    if kind == "seqlens":  # a KV cache length per batch element, each a positive integer
        return (isinstance(value, (list, tuple)) and len(value) > 0
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "positive int":
        return isinstance(value, int) and value > 0
    return math.isfinite(value)  # finite number


@attrs.frozen
class Geometry:
    """The tiling a trace's config describes: which indices and row ranges its steps may have."""

    heads: int
    d: int
    sched: TileSchedule
    num_splits: int | None = None  # a split-KV run's splits: its steps name one, its combine weighs them all


def check_config(config: Any, path: Path, has_steps: bool,
                 types: Mapping[str, str] = CONFIG_TYPES) -> tuple[dict[str, Any], Geometry | None]:
    """The config as a dict, every field `types` knows of its type; its geometry when there are steps."""
    if not isinstance(config, Mapping):
        raise TraceFileError(f"{path}: config must be an object, got {shown(config)}")
    for name, value in config.items():
        if not isinstance(name, str):
            raise TraceFileError(f"{path}: config keys must be strings, got {shown(name)}")
        kind = types.get(name)
        if kind is not None and not _fits(kind, value):
            raise TraceFileError(f"{path}: config.{name} must be a {kind}, got {shown(value)}")
    # sequences come back from JSON as lists: as tuples, they equal the run's own config again
    config = {name: tuple(value) if isinstance(value, list) else value for name, value in config.items()}
    if not has_steps:
        return config, None
    for name in GEOMETRY_FIELDS:
        if config.get(name) is None:
            raise TraceFileError(f"{path}: config.{name} is missing; a trace with steps needs it to check their "
                                 f"indices and shapes (needs {GEOMETRY_FIELDS})")
    kv_heads = config.get("kv_heads") or config["heads"]
    if config["heads"] % kv_heads:
        raise TraceFileError(f"{path}: config.heads ({config['heads']}) must be a multiple of config.kv_heads "
                             f"({kv_heads})")
    pack = config["heads"] // kv_heads if config.get("pack_gqa") else 1
    # the bounds do not change which indices and rows a step may have; the packing does
    sched = TileSchedule(config["n_q"], config["n_kv"], config["block_q"], config["block_kv"], pack=pack)
    return config, Geometry(kv_heads if pack > 1 else config["heads"], config["d"], sched, config.get("num_splits"))


def floats(values: Any, where: str, path: Path) -> np.ndarray:
    """A JSON list of numbers (or the strings NON_FINITE) as float32; refuses values float32 cannot hold."""
    if not isinstance(values, list):
        raise TraceFileError(f"{path}: {where} must be a list of numbers, got {shown(values)}")

    def number(n: int, x: Any) -> float:
        if isinstance(x, str) and x in NON_FINITE:
            return float(x)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TraceFileError(f"{path}: {where} must hold numbers (or {NON_FINITE}), got {shown(x)}")
        if not (isinstance(x, int) or math.isfinite(x)) or abs(x) > FLOAT32_MAX:
            raise TraceFileError(f"{path}: {where}[{n}] = {shown(x)} is outside float32's range "
                                 f"(magnitude at most {FLOAT32_MAX:.6g}; a number that large reads as inf); "
                                 'write infinities as the strings "inf" and "-inf"')
        return float(x)

    return np.array([number(n, x) for n, x in enumerate(values)], dtype=np.float64).astype(STATE_DTYPE)


def float_rows(values: Any, where: str, path: Path) -> np.ndarray:
    """A JSON list of rows of numbers (see `floats`) as a float32 (rows, columns) array."""
    if not isinstance(values, list):
        raise TraceFileError(f"{path}: {where} must be a list of rows, got {shown(values)}")
    rows = [floats(row, f"{where}[{r}]", path) for r, row in enumerate(values)]
    if len({row.size for row in rows}) > 1:
        raise TraceFileError(f"{path}: {where} has rows of different lengths")
    return np.array(rows, dtype=STATE_DTYPE).reshape(len(rows), rows[0].size if rows else 0)


def checked_step(path: Path, where: str, level: str, geometry: Geometry | None, head: int, i: int, j: int,
                 row_start: int, masked: bool, m: np.ndarray, alpha: np.ndarray, l: np.ndarray,
                 a: np.ndarray | None, split: int | None = None, **optional: np.ndarray) -> TileStep:
    """A TileStep whose arrays agree with each other, with the trace level and with the config's tiling."""
    if level == "none":
        raise TraceFileError(f"{path}: a trace of level 'none' holds no steps, found {where}")
    for name, value in zip(INDEX_FIELDS, (head, i, j, row_start)):
        if value < 0:
            raise TraceFileError(f"{path}: {where}.{name} must be a non-negative integer, got {value}")
    if not (m.size > 0 and m.shape == alpha.shape == l.shape):
        raise TraceFileError(f"{path}: {where}: m, alpha and l must be equal-length, non-empty, got "
                             f"{m.size}, {alpha.size}, {l.size}")
    if (level == "full") != (a is not None):
        raise TraceFileError(f"{path}: {where}: a {level!r} trace {'needs' if level == 'full' else 'has no'} "
                             "accumulator a")
    if a is not None and (a.ndim != 2 or a.shape[0] != m.size or a.shape[1] == 0):
        raise TraceFileError(f"{path}: {where}: a must have shape (rows, d) with rows = {m.size}, got {a.shape}")
    for k, values in optional.items():
        if values.shape != m.shape:
            raise TraceFileError(f"{path}: {where}: {k} must hold {m.size} rows like m, got {values.size}")
    if split is not None and split < 0:
        raise TraceFileError(f"{path}: {where}.{SPLIT_FIELD} must be a non-negative integer, got {split}")
    if geometry is not None:
        check_tile(path, where, geometry, head, i, j, row_start, m.size, "m")
        if a is not None and a.shape[1] != geometry.d:
            raise TraceFileError(f"{path}: {where}.a has {a.shape[1]} columns; the config's d = {geometry.d}")
        if split is not None and split >= (geometry.num_splits or 1):
            raise TraceFileError(f"{path}: {where}.{SPLIT_FIELD} = {split} is outside the config's num_splits = "
                                 f"{geometry.num_splits}")
    return TileStep(head=head, i=i, j=j, row_start=row_start, masked=masked, m=m, alpha=alpha, l=l, a=a, split=split,
                    **optional)


def checked_combine_weights(weights: np.ndarray, path: Path, config: dict[str, Any]) -> np.ndarray:
    """A split-KV run's combine weights: float32 (num_splits, rows) with the config's num_splits and rows
    (heads x n_q, the rows of every query head), each weight in [0, 1]."""
    splits = config.get("num_splits")
    if not splits or config.get("heads") is None or config.get("n_q") is None:
        raise TraceFileError(f"{path}: combine_weights needs config.num_splits, config.heads and config.n_q to "
                             f"check its shape")
    shape = (splits, config["heads"] * config["n_q"])
    if weights.shape != shape:
        raise TraceFileError(f"{path}: combine_weights must have shape (num_splits, heads x n_q) = {shape}, "
                             f"got {weights.shape}")
    if not (np.isfinite(weights).all() and (weights >= 0).all() and (weights <= 1).all()):
        raise TraceFileError(f"{path}: combine_weights must hold weights exp(LSE_s - LSE) in [0, 1]")
    return weights.astype(STATE_DTYPE)


def check_tile(path: Path, where: str, g: Geometry, head: int, i: int, j: int, row_start: int, rows: int,
               rows_field: str) -> None:
    """Tile (i, j) of head `head` exists in the config's tiling, and starts at row_start with `rows` rows
    (the length of the step's array `rows_field`)."""
    def refuse(message: str) -> TraceFileError:
        return TraceFileError(f"{path}: {where}.{message}")

    if head >= g.heads:
        raise refuse(f"head = {head} is outside the config's heads = {g.heads}")
    s = g.sched
    if i >= s.n_q_tiles:
        raise refuse(f"i = {i} is outside the config's {s.n_q_tiles} query tiles (n_q = {s.n_q}, "
                     f"block_q = {s.block_q})")
    if j >= s.n_kv_tiles:
        raise refuse(f"j = {j} is outside the config's {s.n_kv_tiles} KV tiles (n_kv = {s.n_kv}, "
                     f"block_kv = {s.block_kv})")
    tile_rows = s.q_rows(i)
    if row_start != tile_rows.start:
        raise refuse(f"row_start = {row_start} disagrees with the config: query tile i = {i} starts at row "
                     f"i x block_q = {tile_rows.start}")
    expected = tile_rows.stop - tile_rows.start
    if rows != expected:
        raise refuse(f"{rows_field} holds {rows} rows; the config's query tile {i} has {expected} (rows "
                     f"{row_start} to {row_start + expected - 1} of n_q = {s.n_q}, block_q = {s.block_q})")
