"""Every ```python block of every docs/*.md page runs, so the docs cannot drift from the code.

The blocks of one page run in order in one namespace, on CPU, in a fresh temporary working
directory. The repository's top-level entries (traces/, docs/, ...) are linked into that directory,
so a page reads files as it would from the repository root, and what it writes stays in the
temporary directory. `breakpoint()` is a no-op here. Use ```console or ```text for anything that
must not run (shell commands, GPU-only code, output).
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))

# A fence opening "```python" (optionally with more words after it) at any indentation, up to its closing fence.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python\b[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
LINK = re.compile(r"\]\((?P<target>[^)#\s]+\.md)(?:#[^)]*)?\)")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the first code line, dedented code) for each ```python block of a page."""
    blocks = []
    for match in FENCE.finditer(text):
        blocks.append((text.count("\n", 0, match.start("body")) + 1, textwrap.dedent(match["body"])))
    return blocks


def test_the_fence_pattern_finds_blocks_and_skips_other_languages():
    page = "intro\n```python\nx = 1\n```\n```console\n$ simflash run\n```\n  ```python\n  y = x + 1\n  ```\n"
    assert python_blocks(page) == [(3, "x = 1\n"), (9, "y = x + 1\n")]


def test_there_are_docs_pages():
    assert PAGES, f"no pages in {DOCS}"


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for entry in REPO.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU only, even on a machine with a GPU
    monkeypatch.setattr(sys, "breakpointhook", lambda *args, **kwargs: None)  # a page may show breakpoint()
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for line, code in python_blocks(page.read_text()):
        # Compiled under the page's path with the block's line offset, so a traceback points into the
        # page; any exception (a failed assert in the page included) fails the test.
        exec(compile("\n" * (line - 1) + code, str(page.relative_to(REPO)), "exec"), namespace)


def test_the_index_links_every_page():
    index = DOCS / "index.md"
    linked = {match["target"] for match in LINK.finditer(index.read_text())}
    unlisted = sorted(page.name for page in PAGES if page.name != "index.md" and page.name not in linked)
    assert not unlisted, f"docs/index.md does not link these pages: {unlisted}"
