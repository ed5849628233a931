"""The trace viewer's page (`simflash view`): self-contained, and holding the run's own state and bytes.

The page is checked here as HTML and as the data it embeds; tests/test_viewer_browser.py drives it
in a real Chromium."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import simflash as sf
from simflash import viewer
from simflash.cli import app
from simflash.trace import Trace

runner = CliRunner()
DATA = re.compile(r'<script type="application/json" id="simflash-data">(.*?)</script>', re.S)


def inputs(n=64, n_kv=None, d=16, heads=1, seed=0):
    rng = np.random.default_rng(seed)
    n_kv = n if n_kv is None else n_kv
    return (rng.standard_normal((heads, n, d)), rng.standard_normal((heads, n_kv, d)),
            rng.standard_normal((heads, n_kv, d)))


def embedded(page: str) -> dict:
    match = DATA.search(page)
    assert match, "the page embeds its data"
    return json.loads(match[1])


def values(xs) -> np.ndarray:
    return np.array([float(x) for x in xs], dtype=np.float32)  # "-Infinity" etc. read as float() reads them


@pytest.fixture(scope="module")
def causal_run():
    q, k, v = inputs(n=64, d=16)
    return sf.flash_attention(q, k, v, 16, 16, causal=True, trace="full", cache="cold")


def test_the_page_is_self_contained(causal_run):
    page = viewer.render(causal_run)
    assert not re.search(r"https?://", page), "no URL: nothing is fetched"
    assert not re.search(r"<(script|img|iframe|link|source|video|audio)\b[^>]*\b(src|href)\s*=", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    assert len(scripts) == 2 and all(body.strip() for _, body in scripts), "data and code are inline"
    assert viewer.PLACEHOLDER not in page


def test_the_page_embeds_every_step_of_the_trace_in_order(causal_run):
    data = embedded(viewer.render(causal_run))
    tiles = [p for p in data["positions"] if "i" in p]
    assert [(p["head"], p["i"], p["j"]) for p in tiles] == [(s.head, s.i, s.j) for s in causal_run.trace]
    for position, step in zip(tiles, causal_run.trace):
        state = position["state"]
        assert position["masked"] == step.masked and state["row_start"] == step.row_start
        for key in ("m", "alpha", "l"):
            np.testing.assert_array_equal(values(state[key]), getattr(step, key))  # exact float32
        np.testing.assert_allclose(values(state["a_norm"]), np.linalg.norm(step.a, axis=-1), rtol=1e-6)
    sched = sf.TileSchedule(64, 64, 16, 16, causal=True)
    assert data["grid"]["kinds"] == ["".join(k[0] for k in row) for row in sched.kind_map()]


def test_bytes_so_far_follow_the_schedule_and_end_at_the_ledger(causal_run):
    """Q_i once per query tile, K_j and V_j once per visited tile, O_i when the tile ends."""
    data = embedded(viewer.render(causal_run))
    column = {t: k for k, t in enumerate(data["tensors"])}
    tile_bytes = 16 * 16 * 2  # a 16 x 16 float16 tile
    seen_i: set[int] = set()
    for visited, position in enumerate(data["positions"][:-1], start=1):
        seen_i.add(position["i"])
        b = position["bytes"]
        assert b[column["Q"]][0] == len(seen_i) * tile_bytes
        assert b[column["K"]][0] == b[column["V"]][0] == visited * tile_bytes
        assert b[column["O"]][1] == (len(seen_i) - 1) * tile_bytes  # every earlier query tile is finished
    final = dict(zip(data["tensors"], data["positions"][-1]["bytes"]))
    assert final.keys() == causal_run.traffic.by_tensor.keys()
    for tensor, flow in causal_run.traffic.by_tensor.items():
        l2 = causal_run.physical.by_tensor[tensor]
        assert final[tensor] == [flow.read_bytes, flow.write_bytes, l2.hit_bytes, l2.dram_read_bytes,
                                 l2.dram_write_bytes]
    assert data["physical"] is True


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_a_saved_trace_shows_what_its_run_shows(causal_run, tmp_path, suffix):
    path = causal_run.trace.save(tmp_path / f"trace{suffix}")
    assert viewer.page_data(Trace.load(path)) == viewer.page_data(causal_run)


def test_fa1_and_a_trace_of_some_tiles():
    q, k, v = inputs(n=48, d=8)
    run = sf.flash_attention(q, k, v, 16, 16, variant="fa1", trace="stats", trace_tiles=[1])
    data = viewer.page_data(run)
    tiles = [p for p in data["positions"] if "i" in p]
    assert [(p["i"], p["j"]) for p in tiles] == [(i, j) for j in range(3) for i in range(3)]  # KV-outer
    assert [("state" in p) for p in tiles] == [p["i"] == 1 for p in tiles]
    assert "a_norm" not in tiles[1]["state"]
    final = dict(zip(data["tensors"], data["positions"][-1]["bytes"]))
    assert {t: (f.read_bytes, f.write_bytes) for t, f in run.traffic.by_tensor.items()} == \
        {t: tuple(b[:2]) for t, b in final.items()}


def test_naive_has_no_tiles_to_step_through_but_shows_its_bytes():
    q, k, v = inputs(n=32, d=8)
    run = sf.naive_attention(q, k, v)
    data = viewer.page_data(run)
    assert len(data["positions"]) == 1 and data["grid"]["kinds"] == ["f"]
    assert dict(zip(data["tensors"], (b[:2] for b in data["positions"][0]["bytes"]))) == \
        {t: [f.read_bytes, f.write_bytes] for t, f in run.traffic.by_tensor.items()}


def test_repr_html_for_jupyter(causal_run):
    for subject in (causal_run, causal_run.trace):
        snippet = subject._repr_html_()
        assert snippet.startswith("<iframe srcdoc=")
        srcdoc = html.unescape(re.search(r'srcdoc="([^"]*)"', snippet)[1])
        assert srcdoc == viewer.render(causal_run)
    assert Trace()._repr_html_() is None  # no configuration: nothing to replay


def test_too_many_tiles_are_refused(monkeypatch, causal_run):
    monkeypatch.setattr(viewer, "MAX_POSITIONS", 5)
    with pytest.raises(ValueError, match="at most 5"):
        viewer.render(causal_run)
    assert causal_run._repr_html_() is None


def test_cli_view_of_a_trace_file_and_of_a_fresh_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export", "--out", "t.json", "--n", "32", "--d", "8", "--causal"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["view", "t.json"])
    assert result.exit_code == 0, result.output
    assert embedded((tmp_path / "t.html").read_text())["config"]["n_q"] == 32
    result = runner.invoke(app, ["view", "--n", "32", "--d", "8", "--cache", "warm", "--out", "fresh.html"])
    assert result.exit_code == 0, result.output
    assert embedded((tmp_path / "fresh.html").read_text())["config"]["cache"] == "warm"
    result = runner.invoke(app, ["view", "missing.json"])
    assert result.exit_code == 2 and "missing.json" in result.output
