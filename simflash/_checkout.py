"""`simflash.backends` when simflash is imported from a source checkout rather than an installation.

setuptools installs the top-level backends/ directory as `simflash.backends` (package-dir). Run from a
checkout's root (`python -m pytest`, `python -c ...`), the checkout's simflash/ comes first on sys.path
and shadows the installed package, and nothing maps backends/ into it: this finder maps that one name.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BACKENDS = PACKAGE.parent / "backends"


class CheckoutBackendsFinder(importlib.abc.MetaPathFinder):
    """Answers for `simflash.backends` only; its submodules are then found through its own __path__."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "simflash.backends":
            return None
        return importlib.util.spec_from_file_location(
            fullname, BACKENDS / "__init__.py", submodule_search_locations=[str(BACKENDS)])


def register() -> None:
    """Puts the finder first on sys.meta_path when this simflash/ sits in a checkout (ahead of an editable
    install's finder, which would map the name to another checkout's backends/); an installed one is left alone."""
    in_checkout = (PACKAGE.parent / "pyproject.toml").is_file() and (BACKENDS / "__init__.py").is_file()
    installed_backends = (PACKAGE / "backends").exists()
    if in_checkout and not installed_backends and not any(isinstance(f, CheckoutBackendsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutBackendsFinder())
