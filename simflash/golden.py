"""The golden traces in traces/: every GOLDEN_CASES problem run under every variant of FLASH_ALGORITHMS,
and the GOLDEN_BACKWARD_CASES through FlashAttention-2's backward.

Each forward run leaves `<case>.<variant>.json` (the "full" trace) and `<case>.<variant>.perfetto.json`
(its timeline); each backward run `<case>.fa2_backward.json` (its "full" BackwardTrace; the backward
records no events, so no timeline). write_golden regenerates them; check_golden compares them with
what the code produces now; golden_directory finds the repository's traces/ when no directory is named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simflash.api import VARIANTS, flash_attention
from simflash.backward import flash_attention_backward
from simflash.memory import MemoryEvent
from simflash.perfetto import perfetto_document, write_perfetto
from simflash.trace import Trace
from simflash.trace_backward import BackwardTrace
from simflash.trace_diff import trace_differences
from simflash.trace_json import read_json
from simflash.trace_schema import TraceFileError

GOLDEN_DIRECTORY_NAME = "traces"


class GoldenDirectoryNotFound(ValueError):
    """No --dir was given and no simflash checkout with a traces/ directory was found."""


def _is_checkout(root: Path) -> bool:
    """A simflash repository: its pyproject, its package and its golden traces side by side."""
    return ((root / "pyproject.toml").is_file() and (root / "simflash" / "__init__.py").is_file()
            and (root / GOLDEN_DIRECTORY_NAME).is_dir())


def golden_directory(directory: str | Path | None = None, start: str | Path | None = None) -> Path:
    """The directory of the golden traces: `directory` when given, else the repository's traces/.

    The repository is the checkout this simflash is imported from (an editable install), else the
    nearest checkout at or above `start` (default: the working directory). Raises
    GoldenDirectoryNotFound (a ValueError) when there is none.
    """
    if directory is not None:
        return Path(directory)
    package_root = Path(__file__).resolve().parents[1]
    here = Path.cwd() if start is None else Path(start)
    for root in (package_root, here.resolve(), *here.resolve().parents):
        if _is_checkout(root):
            return root / GOLDEN_DIRECTORY_NAME
    raise GoldenDirectoryNotFound(
        f"no golden traces directory: simflash is not imported from a checkout and {here} is not inside one "
        f"(a directory with pyproject.toml, simflash/ and {GOLDEN_DIRECTORY_NAME}/); run from the simflash "
        "repository or name the directory with --dir")


GOLDEN_SEED = 20240607  # every random golden input comes from this seed


@attrs.frozen(eq=False)
class GoldenCase:
    """One problem of the golden set: the inputs and the flash_attention options (all but variant)."""

    about: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    options: Mapping[str, Any]
    do: np.ndarray | None = None  # the output's gradient, for a backward case


def _random_case(about: str, n_q: int, n_kv: int, d: int, offset: int, **options: Any) -> GoldenCase:
    rng = np.random.default_rng(GOLDEN_SEED + offset)
    q, k, v = rng.standard_normal((n_q, d)), rng.standard_normal((n_kv, d)), rng.standard_normal((n_kv, d))
    return GoldenCase(about, q, k, v, {"dtype": "float32", **options}, do=rng.standard_normal((n_q, d)))


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


# Cases that also run backward: causal lower_right with ragged tiles, rows that see no key (L = +inf).
GOLDEN_BACKWARD_CASES = ("ragged_lower_right",)
BACKWARD_VARIANT = "fa2_backward"


@attrs.frozen(eq=False)
class GoldenRun:
    case: str
    variant: str
    about: str
    trace: Trace | BackwardTrace
    events: tuple[MemoryEvent, ...]

    @property
    def stem(self) -> str:
        return f"{self.case}.{self.variant}"


def golden_runs(cases: Iterable[str] | None = None) -> list[GoldenRun]:
    """Every golden case under every variant in VARIANTS, with full traces and events; then the
    GOLDEN_BACKWARD_CASES among them through FlashAttention-2's backward, with full traces."""
    chosen = list(GOLDEN_CASES) if cases is None else list(cases)
    unknown = sorted(set(chosen) - set(GOLDEN_CASES))
    if unknown:
        raise ValueError(f"cases must be among {sorted(GOLDEN_CASES)}, got {unknown}")
    runs = []
    for name in chosen:
        case = GOLDEN_CASES[name]()
        for variant in VARIANTS:
            run = flash_attention(case.q, case.k, case.v, variant=variant, trace="full",
                                  record_events=True, **case.options)
            runs.append(GoldenRun(name, variant, case.about, run.trace, run.events))
        if name in GOLDEN_BACKWARD_CASES:
            backward = flash_attention_backward(case.q, case.k, case.v, case.do, trace="full", **case.options)
            runs.append(GoldenRun(name, BACKWARD_VARIANT, case.about, backward.trace, ()))
    return runs


def golden_files(run: GoldenRun, directory: Path) -> tuple[Path, ...]:
    """The run's trace file, then its timeline (a backward run has none)."""
    trace = directory / f"{run.stem}.json"
    return (trace,) if isinstance(run.trace, BackwardTrace) else (trace, directory / f"{run.stem}.perfetto.json")


def write_golden(directory: str | Path) -> list[Path]:
    """(Re)generate the golden traces in `directory`: a .json trace and a .perfetto.json timeline each."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for run in golden_runs():
        trace_path, *timeline = golden_files(run, directory)
        written.append(run.trace.save(trace_path))
        written += [write_perfetto(path, run.events, run.trace.config) for path in timeline]
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
    expected_names: set[str] = set()
    for run in golden_runs():
        trace_path, *timeline = golden_files(run, directory)
        expected_names.update(path.name for path in (trace_path, *timeline))
        for path in (trace_path, *timeline):
            if not path.exists():
                problems.append(f"{path}: missing (run `simflash golden` to generate it)")
        if trace_path.exists():
            try:
                committed = type(run.trace).load(trace_path)
            except TraceFileError as error:
                problems.append(str(error))
            else:
                problems += [f"{trace_path}: {p}" for p in
                             trace_differences(run.trace, committed, GOLDEN_RTOL, GOLDEN_ATOL)]
        for timeline_path in (path for path in timeline if path.exists()):
            try:
                committed_timeline = read_json(timeline_path)
            except TraceFileError as error:
                problems.append(str(error))
            else:
                if committed_timeline != perfetto_document(run.events, run.trace.config):
                    problems.append(f"{timeline_path}: the timeline differs from the run's events")
    problems += [f"{path}: not produced by any golden case (stale?)" for path in sorted(directory.glob("*.json"))
                 if path.name not in expected_names]
    return problems
