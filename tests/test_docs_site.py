"""The docs site (mkdocs.yml over docs/, its nav in the order docs/index.md links the pages) builds with
`mkdocs build --strict`, and a broken link, a broken anchor, a link out of docs/ or a page left out of the
nav fails that build. Sites are built into temporary directories, never into the repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice about its successor, not a build warning
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
               "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly(tmp_path: Path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    for page in (REPO / "docs").glob("*.md"):
        built = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (tmp_path / "site" / built).is_file(), f"{page.name} has no page in the site"


def nav_pages(nav: list) -> list[str]:
    """The pages of a mkdocs nav, in order, through its sections."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_nav_follows_the_index():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    linked = re.findall(r"\]\(([^)#\s]+\.md)", (REPO / "docs" / "index.md").read_text())
    assert nav == ["index.md", *dict.fromkeys(linked)]


BREAKAGES = {  # what is done to a copy of the docs, and what the build must then say
    "a link to a missing page": ("causal.md", "See [a page](no-such-page.md).", "no-such-page.md"),
    "a link to a missing anchor": ("causal.md", "See [a section](amdahl.md#no-such-section).", "#no-such-section"),
    "a link out of docs/": ("causal.md", "See [the README](../README.md).", "../README.md"),
    "a page not in the nav": ("unlisted.md", "# Unlisted", "unlisted.md"),
}


@pytest.mark.parametrize("breakage", BREAKAGES, ids=list(BREAKAGES))
def test_a_broken_docs_copy_fails_the_strict_build(tmp_path: Path, breakage: str):
    page, text, named = BREAKAGES[breakage]
    root = tmp_path / "copy"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    target = root / "docs" / page
    target.write_text((target.read_text() if target.exists() else "") + f"\n{text}\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0, f"the strict build passed with {breakage}"
    said = done.stdout + done.stderr
    assert "Aborted with" in said and named in said, said
