"""The trace viewer in a real headless Chromium: step through the page and read what it shows.

Needs Playwright's Python package (`pip install -e '.[browser]'`) and a Chromium (Debian:
`apt-get install chromium`; another binary via SIMFLASH_CHROMIUM); skipped where either is missing.
Run it alone with `python -m pytest -m browser`. SIMFLASH_VIEWER_SCREENSHOT=PATH saves a screenshot
(docs/viewer.png comes from it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import simflash as sf
from simflash import viewer

pytestmark = pytest.mark.browser

STEPS_FORWARD = 5  # ends on tile (i=2, j=2), on the diagonal


def chromium_path() -> str:
    for candidate in (os.environ.get("SIMFLASH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("no Chromium (apt-get install chromium, or set SIMFLASH_CHROMIUM)")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e '.[browser]')")
    executable = chromium_path()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


def shown(text: str) -> float:
    return float(text)  # the page writes "-inf", "inf", "nan" as Python spells them


def test_stepping_through_the_page_shows_the_trace(browser, tmp_path):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 64, 16)) for _ in range(3))
    run = sf.flash_attention(q, k, v, 16, 16, causal=True, trace="full", cache="cold")
    data = viewer.page_data(run)
    page_file = viewer.write(run, tmp_path / "view.html")

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(page_file.as_uri())
    page.wait_for_selector("body[data-ready=true]")

    def check(index: int) -> None:
        position = page.locator("#position")
        assert position.get_attribute("data-index") == str(index)
        step = run.trace[index]
        assert (position.get_attribute("data-head"), position.get_attribute("data-i"),
                position.get_attribute("data-j")) == (str(step.head), str(step.i), str(step.j))
        rows = page.locator("#state tbody tr")
        assert rows.count() == step.m.size
        for r in range(step.m.size):
            row = rows.nth(r)
            assert row.get_attribute("data-row") == str(step.row_start + r)
            for key, expected in (("m", step.m[r]), ("alpha", step.alpha[r]), ("l", step.l[r]),
                                  ("a-norm", np.linalg.norm(step.a[r]))):
                np.testing.assert_allclose(shown(row.locator(f"td.{key}").inner_text()), expected, rtol=1e-6)
        # Bytes so far: the schedule's count (Q_i once per query tile, K_j, V_j per visited tile).
        tile_bytes = 16 * 16 * 2
        visited = run.trace[: index + 1]
        expected_reads = {"Q": len({s.i for s in visited}) * tile_bytes, "K": len(visited) * tile_bytes,
                          "V": len(visited) * tile_bytes}
        for tensor, read in expected_reads.items():
            cell = page.locator(f'#bytes tr[data-tensor="{tensor}"] td.read')
            assert int(cell.inner_text().replace(",", "")) == read
        for t, tensor in enumerate(data["tensors"]):  # and L2 hits, DRAM bytes as the replay recorded them
            for c, col in enumerate(("read", "write", "hit", "dram-read", "dram-write")):
                cell = page.locator(f'#bytes tr[data-tensor="{tensor}"] td.{col}')
                assert int(cell.get_attribute("data-bytes")) == data["positions"][index]["bytes"][t][c]
        current = page.locator("#cursor-rect")
        assert page.locator(f'#tilemap rect.tile[data-i="{step.i}"][data-j="{step.j}"]').get_attribute("x") == \
            current.get_attribute("x")

    check(0)
    for index in range(1, STEPS_FORWARD + 1):
        page.keyboard.press("ArrowRight")
        check(index)
    page.keyboard.press("ArrowLeft")
    check(STEPS_FORWARD - 1)
    page.click("#next")
    check(STEPS_FORWARD)
    assert run.trace[STEPS_FORWARD].masked  # a diagonal tile: the map marks it masked
    assert page.locator(f'#tilemap rect.tile[data-i="{run.trace[STEPS_FORWARD].i}"]'
                        f'[data-j="{run.trace[STEPS_FORWARD].j}"]').get_attribute("data-kind") == "masked"
    if os.environ.get("SIMFLASH_VIEWER_SCREENSHOT"):
        page.screenshot(path=os.environ["SIMFLASH_VIEWER_SCREENSHOT"], full_page=True)

    page.keyboard.press("End")  # the end of the run: the whole ledger and the L2's totals
    for tensor, flow in run.traffic.by_tensor.items():
        row = page.locator(f'#bytes tr[data-tensor="{tensor}"]')
        l2 = run.physical.by_tensor[tensor]
        for col, expected in (("read", flow.read_bytes), ("write", flow.write_bytes), ("hit", l2.hit_bytes),
                              ("dram-read", l2.dram_read_bytes), ("dram-write", l2.dram_write_bytes)):
            assert int(row.locator(f"td.{col}").inner_text().replace(",", "")) == expected
    total = page.locator('#bytes tr[data-tensor="total"]')
    assert int(total.locator("td.read").inner_text().replace(",", "")) == run.traffic.read_bytes
    assert "end of the run" in page.locator("#position").inner_text()

    assert errors == []
    assert all(url.startswith("file:") for url in requests), requests  # nothing from the network
    page.close()
