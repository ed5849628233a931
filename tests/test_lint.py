"""The code checks itself: ruff and mypy, configured in pyproject.toml, pass over the package, its GPU backend,
the tests and the benchmark scripts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "simflash", "backends", "tests", "benchmarks"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def installed_layout(root: Path) -> Path:
    """simflash/ as setuptools installs it, with backends/ inside as simflash/backends (package-dir), made of
    links to the checkout: mypy reads files, not the import hook that maps backends/ in a checkout."""
    package = root / "simflash"
    package.mkdir(parents=True)
    for entry in (REPO / "simflash").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "backends").symlink_to(REPO / "backends")
    return package


@pytest.mark.slow
def test_mypy_is_clean(tmp_path: Path):
    installed_layout(tmp_path / "tree")
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(command, cwd=tmp_path / "tree", capture_output=True, text=True, timeout=600)
    report = (done.stdout + done.stderr).replace("simflash/backends/", "backends/")
    assert done.returncode == 0, report
    # Every module was checked, the backend's included (a configuration that finds nothing also passes);
    # mypy counts the data folders without __init__.py (machines/, scenarios/) as namespace packages too.
    modules = [p for top in ("simflash", "backends") for p in (REPO / top).rglob("*.py")]
    checked = re.search(r"no issues found in (\d+) source files", report)
    assert checked is not None and int(checked.group(1)) >= len(modules), report


def test_literal_types_hold_the_choices_checked_at_run_time():
    """The public API's Literal types and the tuples its checks (and check_choice) use agree, and agree
    with the registries the CLI's choices come from."""
    from simflash.algorithms import FLASH_ALGORITHMS
    from simflash.api import CACHE_MODES, O_ACCUM_DTYPES, VARIANTS, CacheMode, OAccumDtype, Variant
    from simflash.config import CAUSAL_VARIANTS, STORAGE_DTYPE_NAMES, STORAGE_DTYPES, CausalVariant, StorageDtypeName
    from simflash.grid import SCHEDULES, Schedule
    from simflash.trace import TRACE_LEVELS, TraceLevel

    assert get_args(StorageDtypeName) == STORAGE_DTYPE_NAMES == tuple(STORAGE_DTYPES)
    assert get_args(CausalVariant) == CAUSAL_VARIANTS
    assert get_args(Variant) == VARIANTS == tuple(FLASH_ALGORITHMS)
    assert get_args(CacheMode) == CACHE_MODES
    assert get_args(OAccumDtype) == O_ACCUM_DTYPES
    assert get_args(TraceLevel) == TRACE_LEVELS
    assert get_args(Schedule) == SCHEDULES


def test_check_choice_returns_the_choice_or_names_the_argument():
    from simflash.config import STORAGE_DTYPE_NAMES, check_choice

    assert check_choice("dtype", "bfloat16", STORAGE_DTYPE_NAMES) == "bfloat16"
    for wrong in ("float8", None, 16, b"float16", np.array(["float16", "float32"])):
        with pytest.raises(ValueError, match=re.escape(
                f"dtype must be one of ['bfloat16', 'float16', 'float32'], got {wrong!r}")):
            check_choice("dtype", wrong, STORAGE_DTYPE_NAMES)
