"""The former home of the trace-file code, kept so that `simflash.trace_io.X` still works.

Each job now has its own module; import from there in new code:

- simflash.trace_files: save, read (Trace.save, Trace.load), format_for, FORMATS
- simflash.trace_schema: TraceFileError, the schema constants and the checks every reader applies
- simflash.trace_json, simflash.trace_npz: the two trace formats
- simflash.trace_diff: trace_differences
- simflash.perfetto: perfetto_document, write_perfetto
- simflash.golden: GOLDEN_CASES, golden_runs, write_golden, check_golden, golden_directory

Nothing inside simflash imports this module.
"""

from __future__ import annotations

from pathlib import Path

from simflash.golden import (
    GOLDEN_ATOL,
    GOLDEN_CASES,
    GOLDEN_RTOL,
    GOLDEN_SEED,
    GoldenCase,
    GoldenRun,
    check_golden,
    golden_directory,
    golden_files,
    golden_runs,
    write_golden,
)
from simflash.perfetto import (
    HBM_TOTAL_COUNTER,
    MARK_US,
    SLICE_DUR_US,
    SLICE_START_US,
    TICK_US,
    perfetto_document,
    write_perfetto,
)
from simflash.trace import Trace
from simflash.trace_diff import trace_differences
from simflash.trace_files import FORMATS, format_for, save
from simflash.trace_json import step_dict, trace_from_json, trace_json
from simflash.trace_npz import trace_arrays, trace_from_arrays
from simflash.trace_schema import (
    FORMAT_NAME,
    INDEX_FIELDS,
    NON_FINITE,
    OPTIONAL_FIELDS,
    SCHEMA_VERSION,
    STEP_FIELDS,
    TraceFileError,
)

__all__ = [
    "FORMATS", "FORMAT_NAME", "GOLDEN_ATOL", "GOLDEN_CASES", "GOLDEN_RTOL", "GOLDEN_SEED", "INDEX_FIELDS", "MARK_US",
    "HBM_TOTAL_COUNTER", "NON_FINITE", "OPTIONAL_FIELDS", "SCHEMA_VERSION", "SLICE_DUR_US", "SLICE_START_US",
    "STEP_FIELDS", "TICK_US",
    "GoldenCase", "GoldenRun", "TraceFileError", "check_golden", "format_for", "golden_directory", "golden_files",
    "golden_runs", "load", "perfetto_document", "save", "step_dict", "trace_arrays", "trace_differences",
    "trace_from_arrays", "trace_from_json", "trace_json", "write_golden", "write_perfetto",
]


def load(path: str | Path, format: str | None = None) -> Trace:
    """Trace.load: read a trace saved as .json or .npz; TraceFileError for a damaged or foreign file."""
    return Trace.load(path, format)
