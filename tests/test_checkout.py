"""simflash imported from a source checkout (`python -m pytest`, `python -c ...` at its root) finds
simflash.backends in the top-level backends/ directory, as an installation does; an installed simflash
is left as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.resources, sys
import simflash.backends, simflash
from simflash._checkout import CheckoutBackendsFinder
print(simflash.__file__)
print(simflash.backends.__file__)
print(importlib.resources.files("simflash.backends").joinpath("flash2_forward.cu").is_file())
print("cupy" in sys.modules)
print(any(isinstance(finder, CheckoutBackendsFinder) for finder in sys.meta_path))
for name in ("benchmarks", "tests", "docs", "traces"):
    try:
        __import__("simflash." + name)
        print("imported simflash." + name)
    except ModuleNotFoundError:
        pass
"""


def probe(cwd: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_simflash_backends_imports_from_the_checkout_root_without_cupy():
    package, backends, kernel_source_found, cupy_imported, finder_registered, *rest = probe(REPO)
    assert Path(package) == REPO / "simflash" / "__init__.py"  # the checkout's simflash, first on sys.path
    assert Path(backends) == REPO / "backends" / "__init__.py"
    assert kernel_source_found == "True"  # importlib.resources reads the .cu sources through the same mapping
    assert cupy_imported == "False"
    assert finder_registered == "True"
    assert rest == []  # no other top-level directory of the checkout became simflash.<name>


def test_an_installed_simflash_keeps_its_own_backends(tmp_path: Path):
    # An installed layout (backends/ inside simflash/), beside decoys that look like a checkout.
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "simflash", site / "simflash", ignore=ignore)
    shutil.copytree(REPO / "backends", site / "simflash" / "backends", ignore=ignore)
    (site / "pyproject.toml").write_text("")
    (site / "backends").mkdir()
    (site / "backends" / "__init__.py").write_text("raise ImportError('the decoy was imported')\n")
    package, backends, kernel_source_found, cupy_imported, finder_registered, *rest = probe(site)
    assert Path(package) == site / "simflash" / "__init__.py"
    assert Path(backends) == site / "simflash" / "backends" / "__init__.py"
    assert (kernel_source_found, cupy_imported, finder_registered, rest) == ("True", "False", "False", [])
