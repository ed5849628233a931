"""A trace viewer in the browser: one self-contained HTML page (`simflash view`, `_repr_html_`).

The page shows the run's tile map (skipped / masked / full), a cursor that steps through the visited
tiles in execution order, the online-softmax state of the current tile (m, alpha, l and, in a "full"
trace, the norms of the accumulator rows), the bytes moved so far by tensor and, for runs through
the L2 model (cache="cold" or "warm"), L2 hits and DRAM bytes beside the logical ones.

Bytes per step come from a *replay*: the run's configuration is executed again on zero inputs
(traffic does not depend on the values) and the ledger is read after every tile, so the counts are
the simulator's own, in its own order, for every algorithm and schedule. The final position ("end")
is the whole run's ledger, the output writes included. A trace file holds the configuration, so a
saved trace replays the same way.

Everything (data, style, script) is inline: no network, opened by double-click.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simflash.trace import Trace

# A page steps through at most this many tiles; larger runs are refused (CLI) or not rendered (Jupyter).
MAX_POSITIONS = 20_000
DATA_ELEMENT_ID = "simflash-data"
PLACEHOLDER = "/*SIMFLASH_DATA*/"


def _run_config(source) -> Any:
    """The RunConfig of a Run, or rebuilt from a Trace's recorded configuration: one the viewer replays
    (naive or a registered tiled algorithm)."""
    from simflash.algorithms import FLASH_ALGORITHMS
    from simflash.api import Run, RunConfig  # api imports trace; keep this module importable from both

    if isinstance(source, Run):
        config = source.config
    elif not isinstance(source, Trace):
        raise TypeError(f"expected a simflash Run or Trace, got {type(source).__name__}")
    elif not source.config:
        raise ValueError("the trace records no run configuration, so there is nothing to replay: "
                         "save it from a run (run.trace.save or `simflash export`)")
    else:
        known = {field.name for field in attrs.fields(RunConfig)}
        config = RunConfig(**{k: v for k, v in source.config.items() if k in known})
    viewable = ("naive", *FLASH_ALGORITHMS)
    if config.algorithm not in viewable:
        raise ValueError(f"the viewer steps through {', '.join(viewable)} runs, not {config.algorithm!r}: its "
                         "steps are in the trace itself (simflash.Trace.load)")
    return config


def position_count(config) -> int:
    """Tiles the cursor steps through (every visited tile of every head), before the final "end"."""
    if config.algorithm == "naive":
        return 0
    sched = config.tile_schedule()
    return config.cta_heads * sum(len(sched.kv_range(i)) for i in range(sched.n_q_tiles))


def _ledger(traffic, physical) -> dict[str, list[int]]:
    """Cumulative bytes by tensor: [logical read, logical write, L2 hit, DRAM read, DRAM write]."""
    rows: dict[str, list[int]] = {}
    for tensor, flow in traffic.by_tensor.items():
        rows[tensor] = [int(flow.read_bytes), int(flow.write_bytes), 0, 0, 0]
    if physical is not None:
        for tensor, l2 in physical.by_tensor.items():
            row = rows.setdefault(tensor, [0, 0, 0, 0, 0])
            row[2:] = [int(l2.hit_bytes), int(l2.dram_read_bytes), int(l2.dram_write_bytes)]
    return rows


def _replay(config) -> tuple[list[tuple[int, int, int, bool]], list[dict[str, list[int]]]]:
    """Run `config` again (traffic does not depend on the values: any inputs do; seeded random ones, so
    the replay computes like any run); the visited tiles in order and the ledger after each, then at the end."""
    from simflash import api

    heads, n_q, n_kv, d = config.heads, config.n_q, config.n_kv, config.d
    kv_heads = heads if config.kv_heads is None else config.kv_heads
    rng = np.random.default_rng(0)
    q, kv = rng.standard_normal((heads, n_q, d)), rng.standard_normal((kv_heads, n_kv, d))
    if config.algorithm == "naive":
        run = api.naive_attention(q, kv, kv, causal=config.causal, causal_variant=config.causal_variant,
                                  scale=config.scale, dtype=config.dtype,
                                  schedule=config.schedule, cache=config.cache, gpu=config.gpu, window=config.window)
        return [], [_ledger(run.traffic, run.physical)]
    setup = api._flash_setup(
        q, kv, kv, block_q=config.block_q, block_kv=config.block_kv, causal=config.causal,
        causal_variant=config.causal_variant, scale=config.scale, dtype=config.dtype, variant=config.algorithm,
        trace="stats", trace_heads=None, trace_tiles=None, trace_budget=math.inf,
        write_logsumexp=config.write_logsumexp, gpu=config.gpu, sram_bytes=config.sram_bytes, record_events=False,
        schedule=config.schedule, cache=config.cache, o_accum_dtype=config.o_accum_dtype, kv_stages=config.kv_stages,
        window=config.window, pack_gqa=config.pack_gqa,
    )
    hbm = setup.machine.hbm
    steps = api._flash_steps(setup)
    tiles: list[tuple[int, int, int, bool]] = []
    ledgers: list[dict[str, list[int]]] = []
    while True:
        try:
            step = next(steps)
        except StopIteration as stop:
            run = stop.value
            ledgers.append(_ledger(run.traffic, run.physical))
            return tiles, ledgers
        tiles.append((step.head, step.i, step.j, step.masked))
        ledgers.append(_ledger(hbm.traffic(), hbm.l2.traffic() if hbm.l2 is not None else None))


def _floats(values) -> list[float | str]:
    """float32 values as JSON: the shortest decimal that reads back as the same float32, or "-Infinity",
    "Infinity", "NaN" (JavaScript's Number() reads them)."""
    array = np.asarray(values, dtype=np.float32).ravel()
    return [float(text) if np.isfinite(x) else text.replace("inf", "Infinity").replace("nan", "NaN")
            for x, text in zip(array, array.astype(str))]


def _state(step) -> dict[str, Any]:
    state: dict[str, Any] = {"row_start": int(step.row_start), "m": _floats(step.m), "alpha": _floats(step.alpha),
                             "l": _floats(step.l)}
    if step.a is not None:
        state["a_norm"] = _floats(np.linalg.norm(np.asarray(step.a, dtype=np.float64), axis=-1))
    return state


def page_data(source) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-ready data (the test suite reads it too)."""
    from simflash.api import Run

    config = _run_config(source)
    count = position_count(config)
    if count > MAX_POSITIONS:
        raise ValueError(f"the run visits {count:,} tiles; the viewer steps through at most {MAX_POSITIONS:,}: "
                         "view a smaller configuration (fewer heads, shorter sequences or larger tiles)")
    trace = source.trace if isinstance(source, Run) else source
    sched = config.tile_schedule()
    tiles, ledgers = _replay(config)
    recorded = {(step.head, step.i, step.j): step for step in trace}
    tensors = sorted({name for ledger in ledgers for name in ledger}, key=_tensor_order)
    positions = []
    for index, ledger in enumerate(ledgers):
        position: dict[str, Any] = {"bytes": [ledger.get(t, [0, 0, 0, 0, 0]) for t in tensors]}
        if index < len(tiles):
            head, i, j, masked = tiles[index]
            position |= {"head": head, "i": i, "j": j, "masked": masked}
            step = recorded.get((head, i, j))
            if step is not None:
                position["state"] = _state(step)
        positions.append(position)
    kinds = sched.kind_map()
    return {
        "title": f"simflash: {config.algorithm}, n_q = {config.n_q}, n_kv = {config.n_kv}, d = {config.d}",
        "config": attrs.asdict(config),
        "level": trace.level,
        "grid": {"rows": sched.n_q_tiles, "cols": sched.n_kv_tiles, "block_q": sched.block_q,
                 "block_kv": sched.block_kv,
                 "kinds": ["".join(kind[0] for kind in row) for row in kinds]},  # f(ull) m(asked) s(kipped)
        "tensors": tensors,
        "physical": config.cache is not None,
        "positions": positions,
    }


def _tensor_order(name: str) -> tuple[int, str]:
    order = ("Q", "K", "V", "S", "P", "O", "out", "L", "l", "m")
    return (order.index(name) if name in order else len(order), name)


def template() -> str:
    return resources.files("simflash").joinpath("viewer.html").read_text(encoding="utf-8")


def render(source) -> str:
    """The whole page: the template with the data inline (`</` escaped so it cannot close the script)."""
    data = json.dumps(page_data(source), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return template().replace(PLACEHOLDER, data, 1)


def write(source, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render(source), encoding="utf-8")
    return path


def repr_html(source) -> str | None:
    """For Jupyter: the page in an iframe (srcdoc), or None (plain repr) when there is nothing to show."""
    try:
        page = render(source)
    except (ValueError, TypeError):
        return None
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: 760px; border: 0" '
            'sandbox="allow-scripts" title="simflash trace viewer"></iframe>')
