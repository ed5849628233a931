"""Trace files: a Trace saved as JSON or NPZ, a run's events as a Perfetto timeline, and the golden traces.

- JSON (`.json`): a header (format name, schema version, trace level, the run's configuration) and
  one line per TileStep. Human-readable and diff-friendly. Floats are the exact float32 values
  written as decimal float64, so a round trip is lossless; non-finite values (m = -inf for a row
  that has seen no key yet) are written as the strings "-inf", "inf", "nan" to keep the JSON strict.
- Optional per-row fields (`OPTIONAL_FIELDS`: FA-1's tile-local m_tile, l_tile and its second factor
  beta) are written only by traces that hold them, as JSON keys or NPZ arrays of the same name;
  files without them (every FA-2 trace, files written before they existed) load with them None.
- NPZ (`.npz`): the same content as plain arrays, one row of state per array row; it loads with
  `allow_pickle=False`.
- Perfetto (`.perfetto.json`): a Chrome Trace Event JSON timeline of a run's MemoryEvents, which the
  Perfetto UI (and chrome://tracing) opens. An export for viewing: it holds no tile state.

The golden traces in traces/ are the GOLDEN_CASES run under every variant of FLASH_ALGORITHMS.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simflash.algorithms import FLASH_ALGORITHMS
from simflash.api import flash_attention
from simflash.config import STATE_DTYPE
from simflash.memory import MemoryEvent
from simflash.trace import TRACE_LEVELS, TileStep, Trace

FORMAT_NAME = "simflash.trace"
SCHEMA_VERSION = 1
FORMATS = ("json", "npz", "perfetto")
STEP_FIELDS = ("head", "i", "j", "row_start", "masked", "m", "alpha", "l", "a")
INDEX_FIELDS = ("head", "i", "j", "row_start")
OPTIONAL_FIELDS = ("m_tile", "l_tile", "beta")  # per-row float32, present or None (see TileStep)
NON_FINITE = ("-inf", "inf", "nan")  # how JSON files spell the floats strict JSON has no numbers for

# Perfetto's axis is in microseconds: every MemoryEvent gets TICK_US of it, in `seq` order. A slice
# sits strictly inside its tick so that the viewer nests it under its CTA's slice unambiguously.
TICK_US = 10
SLICE_START_US = 1
SLICE_DUR_US = 8
MARK_US = 5


class TraceFileError(ValueError):
    """A trace file that is corrupted, truncated, of another format or of an unsupported version."""


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
    raise ValueError(f"path must end in .json, .npz or .perfetto.json (or pass format= one of {FORMATS}), got {str(path)!r}")


def save(trace: Trace, path: str | Path, format: str | None = None, *,
         events: Sequence[MemoryEvent] = ()) -> Path:
    """Write `trace` to `path`; a Perfetto timeline is drawn from `events` (a run's `run.events`)."""
    path = Path(path)
    kind = format_for(path, format)
    if kind == "perfetto":
        if not events:
            raise ValueError("events must hold the run's MemoryEvents for a Perfetto timeline: run with "
                             "record_events=True and pass events=run.events")
        write_perfetto(path, events, trace.config)
    elif kind == "json":
        path.write_text(trace_json(trace))
    else:
        np.savez(path, **trace_arrays(trace))
    return path


def load(path: str | Path, format: str | None = None) -> Trace:
    """Read a trace saved as .json or .npz; raises TraceFileError for a damaged or foreign file."""
    path = Path(path)
    kind = format_for(path, format)
    if kind == "perfetto":
        raise ValueError(f"{path}: a Perfetto file is a timeline for viewing and holds no tile state; "
                         "load the trace's .json or .npz file")
    if kind == "json":
        return trace_from_json(_read_json(path), path)
    return trace_from_arrays(_read_npz(path), path)


# ---------------------------------------------------------------------------------------- JSON


def _float_list(values: np.ndarray) -> list:
    """float32 values as exact decimal float64s; non-finite ones as strings (strict JSON)."""
    return [float(x) if math.isfinite(x) else str(float(x)) for x in values.astype(np.float64).ravel()]


def _plain(value: Any) -> Any:
    """A config value as plain JSON (NumPy scalars become Python numbers)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"config values must be JSON numbers, strings, booleans or None, got {type(value).__name__}")


def step_dict(step: TileStep) -> dict:
    return {
        "head": step.head, "i": step.i, "j": step.j, "row_start": step.row_start, "masked": step.masked,
        "m": _float_list(step.m), "alpha": _float_list(step.alpha), "l": _float_list(step.l),
        "a": None if step.a is None else [_float_list(row) for row in step.a],
        **{k: _float_list(getattr(step, k)) for k in OPTIONAL_FIELDS if getattr(step, k) is not None},
    }


def trace_json(trace: Trace) -> str:
    """The JSON text of a trace: an indented header, then one line per step."""
    header = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, "level": trace.level,
              "config": dict(trace.config)}
    text = json.dumps(header, indent=2, default=_plain, allow_nan=False)
    lines = [json.dumps(step_dict(step), allow_nan=False) for step in trace.steps]
    steps = "[\n" + ",\n".join(f"    {line}" for line in lines) + "\n  ]" if lines else "[]"
    return text.removesuffix("\n}") + f',\n  "steps": {steps}\n}}\n'


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TraceFileError(f"{path}: not a complete JSON document (truncated or corrupted?): {error}") from None
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}: not a text file (corrupted, or not JSON?)") from None


def _check_header(doc: Any, path: Path) -> None:
    if isinstance(doc, Mapping) and "traceEvents" in doc:
        raise TraceFileError(f"{path}: a Perfetto timeline, not a simflash trace; load the .json or .npz trace")
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT_NAME:
        raise TraceFileError(f"{path}: not a simflash trace (expected format {FORMAT_NAME!r})")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise TraceFileError(f"{path}: schema version {version!r} is not supported; this simflash reads "
                             f"version {SCHEMA_VERSION}")
    if doc.get("level") not in TRACE_LEVELS:
        raise TraceFileError(f"{path}: level must be one of {TRACE_LEVELS}, got {doc.get('level')!r}")


def _floats(values: Any, where: str, path: Path) -> np.ndarray:
    def number(x: Any) -> float:
        if isinstance(x, bool) or not (isinstance(x, (int, float)) or x in NON_FINITE):
            raise TraceFileError(f"{path}: {where} must hold numbers (or {NON_FINITE}), got {x!r}")
        return float(x)

    if not isinstance(values, list):
        raise TraceFileError(f"{path}: {where} must be a list of numbers, got {values!r}")
    return np.array([number(x) for x in values], dtype=np.float64).astype(STATE_DTYPE)


def _index(raw: Mapping, name: str, where: str, path: Path) -> int:
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFileError(f"{path}: {where}.{name} must be a non-negative integer, got {value!r}")
    return value


def trace_from_json(doc: Any, path: Path = Path("<trace>")) -> Trace:
    _check_header(doc, path)
    level, config, raw_steps = doc["level"], doc.get("config"), doc.get("steps")
    if not isinstance(config, Mapping):
        raise TraceFileError(f"{path}: config must be an object, got {config!r}")
    if not isinstance(raw_steps, list):
        raise TraceFileError(f"{path}: steps must be a list, got {raw_steps!r}")
    steps = []
    for n, raw in enumerate(raw_steps):
        where = f"steps[{n}]"
        if not isinstance(raw, Mapping) or not set(STEP_FIELDS) <= set(raw) <= {*STEP_FIELDS, *OPTIONAL_FIELDS}:
            raise TraceFileError(f"{path}: {where} must be an object with the fields {STEP_FIELDS} "
                                 f"(and optionally {OPTIONAL_FIELDS})")
        if not isinstance(raw["masked"], bool):
            raise TraceFileError(f"{path}: {where}.masked must be true or false, got {raw['masked']!r}")
        m, alpha, l = (_floats(raw[k], f"{where}.{k}", path) for k in ("m", "alpha", "l"))  # noqa: E741
        a = None
        if raw["a"] is not None:
            if not isinstance(raw["a"], list):
                raise TraceFileError(f"{path}: {where}.a must be a list of rows, got {raw['a']!r}")
            rows = [_floats(row, f"{where}.a", path) for row in raw["a"]]
            if len({row.size for row in rows}) > 1:
                raise TraceFileError(f"{path}: {where}.a has rows of different lengths")
            a = np.array(rows, dtype=STATE_DTYPE).reshape(len(rows), rows[0].size if rows else 0)
        optional = {k: _floats(raw[k], f"{where}.{k}", path) for k in OPTIONAL_FIELDS if k in raw}
        steps.append(_checked_step(
            path, where, level, *(_index(raw, k, where, path) for k in INDEX_FIELDS), raw["masked"], m, alpha, l, a,
            **optional,
        ))
    return Trace(level, tuple(steps), dict(config))


def _checked_step(path, where, level, head, i, j, row_start, masked, m, alpha, l, a,  # noqa: E741
                  **optional: np.ndarray) -> TileStep:
    """A TileStep whose arrays agree with each other and with the trace level."""
    if level == "none":
        raise TraceFileError(f"{path}: a trace of level 'none' holds no steps, found {where}")
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
    return TileStep(head=head, i=i, j=j, row_start=row_start, masked=masked, m=m, alpha=alpha, l=l, a=a, **optional)


# ----------------------------------------------------------------------------------------- NPZ


def trace_arrays(trace: Trace) -> dict[str, np.ndarray]:
    """The trace as plain arrays: per-step indices, and the state of every step's rows stacked."""
    steps = trace.steps
    arrays = {
        "format": np.array(FORMAT_NAME),
        "schema_version": np.array(SCHEMA_VERSION),
        "level": np.array(trace.level),
        "config_json": np.array(json.dumps(dict(trace.config), default=_plain, allow_nan=False)),
        **{k: np.array([getattr(s, k) for s in steps], dtype=np.int64) for k in INDEX_FIELDS},
        "masked": np.array([s.masked for s in steps], dtype=bool),
        "rows": np.array([s.m.size for s in steps], dtype=np.int64),  # step k owns rows[k] state rows
    }
    for k in ("m", "alpha", "l"):
        arrays[k] = np.concatenate([getattr(s, k) for s in steps]) if steps else np.zeros(0, STATE_DTYPE)
    for k in OPTIONAL_FIELDS:  # written when every step holds it
        if steps and all(getattr(s, k) is not None for s in steps):
            arrays[k] = np.concatenate([getattr(s, k) for s in steps])
    if trace.level == "full":
        arrays["a"] = np.concatenate([s.a for s in steps]) if steps else np.zeros((0, 0), STATE_DTYPE)
    return arrays


def _read_npz(path: Path) -> dict[str, np.ndarray]:
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


def _npz_array(arrays: Mapping[str, np.ndarray], key: str, kind: str, ndim: int, path: Path) -> np.ndarray:
    if key not in arrays:
        raise TraceFileError(f"{path}: missing array {key!r}")
    array = arrays[key]
    if array.dtype.kind not in kind or array.ndim != ndim:
        raise TraceFileError(f"{path}: array {key!r} has dtype {array.dtype} and {array.ndim} dimensions, "
                             f"expected kind {kind!r} and {ndim}")
    return array


def trace_from_arrays(arrays: Mapping[str, np.ndarray], path: Path = Path("<trace>")) -> Trace:
    def scalar(key: str, kind: str) -> Any:
        return _npz_array(arrays, key, kind, 0, path).item()

    header = {"format": scalar("format", "U"), "schema_version": scalar("schema_version", "iu"),
              "level": scalar("level", "U")}
    _check_header(header, path)
    try:
        config = json.loads(scalar("config_json", "U"))
    except json.JSONDecodeError as error:
        raise TraceFileError(f"{path}: config_json is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise TraceFileError(f"{path}: config_json must hold an object, got {config!r}")
    level = header["level"]
    index = {k: _npz_array(arrays, k, "iu", 1, path) for k in (*INDEX_FIELDS, "rows")}
    masked = _npz_array(arrays, "masked", "b", 1, path)
    state = {k: _npz_array(arrays, k, "f", 1, path) for k in ("m", "alpha", "l", *OPTIONAL_FIELDS)
             if k in arrays or k not in OPTIONAL_FIELDS}
    a = _npz_array(arrays, "a", "f", 2, path) if level == "full" else None
    count = masked.size
    if any(array.size != count for array in index.values()) or (index["rows"] < 1).any():
        raise TraceFileError(f"{path}: the per-step arrays must all hold {count} entries, rows >= 1")
    total = int(index["rows"].sum())
    if any(array.size != total for array in state.values()) or (a is not None and a.shape[0] != total):
        raise TraceFileError(f"{path}: the state arrays must hold {total} rows (the sum of 'rows')")
    if any(array.dtype != STATE_DTYPE for array in state.values()) or (a is not None and a.dtype != STATE_DTYPE):
        raise TraceFileError(f"{path}: the state arrays must be {STATE_DTYPE}")
    stops = np.cumsum(index["rows"])
    steps = []
    for n in range(count):
        rows = slice(int(stops[n] - index["rows"][n]), int(stops[n]))
        steps.append(_checked_step(
            path, f"step {n}", level, *(int(index[k][n]) for k in INDEX_FIELDS), bool(masked[n]),
            *(state[k][rows].copy() for k in ("m", "alpha", "l")), None if a is None else a[rows].copy(),
            **{k: state[k][rows].copy() for k in OPTIONAL_FIELDS if k in state},
        ))
    return Trace(level, tuple(steps), config)


# ------------------------------------------------------------------------------------ compare


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
    if len(expected) != len(actual):
        return [*problems, f"{len(actual)} steps != {len(expected)}"]
    for n, (want, got) in enumerate(zip(expected, actual)):
        for name in (*STEP_FIELDS, *OPTIONAL_FIELDS):
            x, y = getattr(want, name), getattr(got, name)
            if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
                same = (x.dtype == y.dtype and x.shape == y.shape
                        and np.allclose(y, x, rtol=rtol, atol=atol, equal_nan=True))
            else:
                same = x is None and y is None if name in ("a", *OPTIONAL_FIELDS) else x == y
            if not same:
                problems.append(f"step {n} (head {want.head}, i {want.i}, j {want.j}): {name} differs")
    return problems


# ------------------------------------------------------------------------------------ Perfetto


CTA_INDEX_NAMES = ("head", "query tile")  # what a CTA index's coordinates are (simflash.grid.CTA.index)
HBM_TOTAL_COUNTER = "HBM bytes, cumulative (all tensors)"  # its own track: the per-tensor series stack in chrome


def _cta_label(cta: tuple[int, ...]) -> str:
    """A CTA's track name: "CTA head 0" (FA-1, naive), "CTA head 0, query tile 2" (FA-2)."""
    if not cta:
        return "whole kernel"
    names = CTA_INDEX_NAMES if len(cta) <= len(CTA_INDEX_NAMES) else [f"index {k}" for k in range(len(cta))]
    return "CTA " + ", ".join(f"{name} {value}" for name, value in zip(names, cta))


def perfetto_document(events: Sequence[MemoryEvent], config: Mapping[str, Any] | None = None) -> dict:
    """A Chrome Trace Event JSON object for a run's events.

    Tracks: one process per kernel, one thread per CTA in it (a slice spans the CTA's work); slices
    for loads (HBM reads), compute (matmuls) and stores (HBM writes); instant marks where on-chip
    buffers are held and freed. Counters on the "simulated GPU" process: cumulative HBM bytes by
    tensor (one counter whose series chrome://tracing stacks: the top is the total), the total on a
    counter of its own, and live SRAM bytes by scope. Time: `ts` and `dur` in microseconds, as the
    format has them (displayed in ms, the format's default), event `seq` x TICK_US: a logical clock
    (the simulator runs CTAs one after another; the axis counts events, not time).
    """
    records: list[dict] = []
    gpu_pid = 1
    records.append({"ph": "M", "name": "process_name", "pid": gpu_pid, "tid": 0,
                    "args": {"name": "simulated GPU (counters)"}})
    records.append({"ph": "M", "name": "process_sort_index", "pid": gpu_pid, "tid": 0, "args": {"sort_index": 0}})
    pids: dict[str, int] = {}
    tids: dict[tuple[str, tuple[int, ...]], int] = {}
    spans: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # first and last seq of each CTA
    hbm_bytes: dict[str, int] = {}
    live: dict[str, int] = {}
    held: dict[tuple[str, str], int] = {}  # (scope, buffer) -> bytes, to keep the occupancy exact

    for n, event in enumerate(events):
        kernel = event.kernel if event.kernel is not None else "outside any kernel"
        if kernel not in pids:
            pids[kernel] = len(pids) + 2
            records.append({"ph": "M", "name": "process_name", "pid": pids[kernel], "tid": 0,
                            "args": {"name": f"kernel {kernel}"}})
            records.append({"ph": "M", "name": "process_sort_index", "pid": pids[kernel], "tid": 0,
                            "args": {"sort_index": pids[kernel]}})
        track = (kernel, event.cta)
        if track not in tids:
            tids[track] = sum(1 for k, _ in tids if k == kernel) + 1
            records.append({"ph": "M", "name": "thread_name", "pid": pids[kernel], "tid": tids[track],
                            "args": {"name": _cta_label(event.cta)}})
            records.append({"ph": "M", "name": "thread_sort_index", "pid": pids[kernel], "tid": tids[track],
                            "args": {"sort_index": tids[track]}})
            spans[track] = [event.seq, event.seq]
        spans[track][1] = event.seq
        where = {"pid": pids[kernel], "tid": tids[track]}
        tick = event.seq * TICK_US
        slice_at = {"ts": tick + SLICE_START_US, "dur": SLICE_DUR_US, **where}
        mark_at = {"ts": tick + MARK_US, **where}
        args = {"seq": event.seq}

        if event.op in ("read", "write"):
            following = events[n + 1] if n + 1 < len(events) else None
            into = (following.name if following is not None and following.op == "hold"
                    and following.scope == "shared memory" and following.cta == event.cta
                    and following.kernel == event.kernel else None)  # sram.load: read, then hold
            verb, category = ("load", "load") if event.op == "read" else ("store", "store")
            label = f"{verb} {event.name}" + (f" -> {into}" if into else "")
            records.append({"ph": "X", "name": label, "cat": category, **slice_at,
                            "args": {**args, "tensor": event.name, "bytes": event.nbytes}})
            hbm_bytes[event.name] = hbm_bytes.get(event.name, 0) + event.nbytes
            records.append({"ph": "C", "name": "HBM bytes, cumulative", "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": dict(hbm_bytes)})
            records.append({"ph": "C", "name": HBM_TOTAL_COUNTER, "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": {"total": sum(hbm_bytes.values())}})
        elif event.op == "matmul":
            records.append({"ph": "X", "name": f"matmul {event.name}", "cat": "compute", **slice_at,
                            "args": {**args, "flops": event.nbytes}})
        elif event.op in ("hold", "release"):
            key = (event.scope, event.name)
            if event.op == "hold":
                live[event.scope] = live.get(event.scope, 0) - held.get(key, 0) + event.nbytes
                held[key] = event.nbytes
            else:
                live[event.scope] = live.get(event.scope, 0) - held.pop(key, event.nbytes)
            verb = "hold" if event.op == "hold" else "free"
            records.append({"ph": "i", "s": "t", "name": f"{verb} {event.name}", "cat": "sram", **mark_at,
                            "args": {**args, "bytes": event.nbytes, "scope": event.scope}})
            records.append({"ph": "C", "name": "SRAM live bytes", "pid": gpu_pid, "tid": 0,
                            "ts": mark_at["ts"], "args": dict(live)})
        else:
            raise ValueError(f"events[{n}].op must be read, write, hold, release or matmul, got {event.op!r}")

    for (kernel, cta), (first, last) in spans.items():
        records.append({"ph": "X", "name": _cta_label(cta), "cat": "cta", "ts": first * TICK_US,
                        "dur": (last - first + 1) * TICK_US, "pid": pids[kernel], "tid": tids[kernel, cta],
                        "args": {"first_seq": first, "last_seq": last}})
    # Parents before children at equal timestamps, whatever order a viewer's sort keeps.
    records.sort(key=lambda r: (r["ph"] != "M", r.get("ts", 0), -r.get("dur", 0)))
    return {
        "traceEvents": records,
        "displayTimeUnit": "ms",  # ts is in us; the format displays ms or ns
        "otherData": {
            "generator": "simflash",
            "clock": f"logical: event seq x {TICK_US} us (the axis counts simulated events, not time)",
            "config": json.dumps(dict(config or {}), default=_plain, allow_nan=False),
        },
    }


def write_perfetto(path: str | Path, events: Sequence[MemoryEvent], config: Mapping[str, Any] | None = None) -> Path:
    """Write a run's events as a Perfetto-readable timeline (see perfetto_document)."""
    path = Path(path)
    document = perfetto_document(events, config)
    lines = [json.dumps(record, separators=(",", ":")) for record in document["traceEvents"]]
    other = json.dumps(document["otherData"], indent=2).replace("\n", "\n  ")
    path.write_text('{\n  "traceEvents": [\n    ' + ",\n    ".join(lines) + "\n  ],\n"
                    f'  "displayTimeUnit": "{document["displayTimeUnit"]}",\n  "otherData": {other}\n}}\n')
    return path


# -------------------------------------------------------------------------------- golden traces

GOLDEN_SEED = 20240607  # every random golden input comes from this seed


@attrs.frozen(eq=False)
class GoldenCase:
    """One problem of the golden set: the inputs and the flash_attention options (all but variant)."""

    about: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    options: Mapping[str, Any]


def _random_case(about: str, n_q: int, n_kv: int, d: int, offset: int, **options: Any) -> GoldenCase:
    rng = np.random.default_rng(GOLDEN_SEED + offset)
    q, k, v = rng.standard_normal((n_q, d)), rng.standard_normal((n_kv, d)), rng.standard_normal((n_kv, d))
    return GoldenCase(about, q, k, v, {"dtype": "float32", **options})


def _two_tile() -> GoldenCase:
    # The lesson's section 3.2 inputs: with q = [1, 0] and scale 1 the scores are K's first column.
    q = np.array([[1.0, 0.0]])  # (1, 2)
    k = np.array([[8.0, 0.0], [6.0, 0.0], [10.0, 0.0], [7.0, 0.0]])  # scores [8, 6] then [10, 7]
    v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])  # V_1 = rows 0-1, V_2 = rows 2-3
    return GoldenCase("the worked two-tile example: one query row, d=2, two KV tiles of two keys",
                      q, k, v, {"block_q": 1, "block_kv": 2, "scale": 1.0, "dtype": "float32"})


GOLDEN_CASES: dict[str, Callable[[], GoldenCase]] = {
    "two_tile": _two_tile,
    "causal16": lambda: _random_case(
        "causal N=16, B_r=4, B_c=2: skipped, masked (diagonal) and full tiles", 16, 16, 4, 1,
        block_q=4, block_kv=2, causal=True),
    "ragged": lambda: _random_case(
        "ragged edges: n_q=10, n_kv=7, B_r=4, B_c=3 (last tiles hold 2 and 1 rows)", 10, 7, 4, 2,
        block_q=4, block_kv=3),
    "ragged_lower_right": lambda: _random_case(
        "ragged, causal lower_right: query rows 0-2 see no key (m stays -inf, output 0)", 10, 7, 4, 3,
        block_q=4, block_kv=3, causal=True, causal_variant="lower_right"),
}


@attrs.frozen(eq=False)
class GoldenRun:
    case: str
    variant: str
    about: str
    trace: Trace
    events: tuple[MemoryEvent, ...]

    @property
    def stem(self) -> str:
        return f"{self.case}.{self.variant}"


def golden_runs(cases: Iterable[str] | None = None) -> list[GoldenRun]:
    """Every golden case under every variant in FLASH_ALGORITHMS, with full traces and events."""
    chosen = list(GOLDEN_CASES) if cases is None else list(cases)
    unknown = sorted(set(chosen) - set(GOLDEN_CASES))
    if unknown:
        raise ValueError(f"cases must be among {sorted(GOLDEN_CASES)}, got {unknown}")
    runs = []
    for name in chosen:
        case = GOLDEN_CASES[name]()
        for variant in FLASH_ALGORITHMS:
            run = flash_attention(case.q, case.k, case.v, variant=variant, trace="full",
                                  record_events=True, **case.options)
            runs.append(GoldenRun(name, variant, case.about, run.trace, run.events))
    return runs


def golden_files(run: GoldenRun, directory: Path) -> tuple[Path, Path]:
    return directory / f"{run.stem}.json", directory / f"{run.stem}.perfetto.json"


def write_golden(directory: str | Path) -> list[Path]:
    """(Re)generate the golden traces in `directory`: a .json trace and a .perfetto.json timeline each."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for run in golden_runs():
        trace_path, timeline_path = golden_files(run, directory)
        written.append(save(run.trace, trace_path))
        written.append(write_perfetto(timeline_path, run.events, run.trace.config))
    return written


GOLDEN_RTOL = 1e-6  # state arrays: a few float32 ulps, room for another BLAS's summation order
GOLDEN_ATOL = 1e-7


def check_golden(directory: str | Path) -> list[str]:
    """What no longer matches between the committed golden files and what the code produces now.

    Traces: structure exactly, state within GOLDEN_RTOL/GOLDEN_ATOL. Timelines: exactly (they hold
    integers and names only). Also reports JSON files in `directory` that no golden case produces.
    """
    directory = Path(directory)
    problems = []
    expected_names = set()
    for run in golden_runs():
        trace_path, timeline_path = golden_files(run, directory)
        expected_names.update({trace_path.name, timeline_path.name})
        for path in (trace_path, timeline_path):
            if not path.exists():
                problems.append(f"{path}: missing (run `simflash golden` to generate it)")
        if trace_path.exists():
            try:
                committed = load(trace_path)
            except TraceFileError as error:
                problems.append(str(error))
            else:
                problems += [f"{trace_path}: {p}" for p in
                             trace_differences(run.trace, committed, GOLDEN_RTOL, GOLDEN_ATOL)]
        if timeline_path.exists():
            try:
                committed_timeline = _read_json(timeline_path)
            except TraceFileError as error:
                problems.append(str(error))
            else:
                if committed_timeline != perfetto_document(run.events, run.trace.config):
                    problems.append(f"{timeline_path}: the timeline differs from the run's events")
    problems += [f"{path}: not produced by any golden case (stale?)" for path in sorted(directory.glob("*.json"))
                 if path.name not in expected_names]
    return problems
