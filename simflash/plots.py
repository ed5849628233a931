"""Pictures (matplotlib, drawn off-screen with Agg): the tile map, the online-softmax statistics of
chosen rows across KV tiles, and cumulative HBM bytes by tensor over a run. PNG or SVG by suffix.

Each picture has a data function beside it (`row_statistics`, `cumulative_hbm_bytes`) so that what
is drawn can be checked without looking at pixels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simflash.config import GiB, KiB, MiB
from simflash.memory import MemoryEvent
from simflash.schedule import TileSchedule
from simflash.trace import Trace

PICTURE_SUFFIXES = (".png", ".svg")
TILE_COLOURS = {"full": "#4c72b0", "masked": "#dd8452", "skipped": "#ececec"}
TILE_LETTERS = {"full": "F", "masked": "M", "skipped": ""}
LETTERED_GRID_MAX = 32  # write F / M in the cells while the grid stays legible


def picture_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise ValueError(f"path must end in one of {PICTURE_SUFFIXES}, got {str(path)!r}")
    return path


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=120)
    return path


def tile_map(schedule: TileSchedule, path: str | Path) -> Path:
    """Draw the (T_r, T_c) grid of tiles: full, masked (straddles the diagonal) or skipped."""
    path = picture_path(path)
    kinds = schedule.kind_map()
    codes = np.vectorize(list(TILE_COLOURS).index)(kinds)  # (T_r, T_c) 0 full, 1 masked, 2 skipped
    rows, cols = kinds.shape
    cell = min(0.45, 12 / cols, 10 / rows)  # inches per tile, so big grids stay on the page
    figure = Figure(figsize=(2.6 + cell * cols, 1.4 + cell * rows), layout="constrained")
    axes = figure.add_subplot()
    axes.imshow(codes, cmap=ListedColormap(list(TILE_COLOURS.values())), vmin=-0.5, vmax=2.5, aspect="equal")
    if max(rows, cols) <= LETTERED_GRID_MAX:
        for (i, j), kind in np.ndenumerate(kinds):
            axes.text(j, i, TILE_LETTERS[kind], ha="center", va="center", fontsize=8,
                      color="white" if kind == "full" else "black")
    axes.set_xticks(_ticks(cols), [str(j) for j in _ticks(cols)])
    axes.set_yticks(_ticks(rows), [str(i) for i in _ticks(rows)])
    axes.set_xticks(np.arange(cols + 1) - 0.5, minor=True)
    axes.set_yticks(np.arange(rows + 1) - 0.5, minor=True)
    axes.grid(which="minor", color="white", linewidth=1)
    axes.tick_params(which="minor", length=0)
    axes.set_xlabel(f"KV tile j ({schedule.block_kv} keys each)")
    axes.set_ylabel(f"query tile i ({schedule.block_q} rows each)")
    mask = f"causal {schedule.causal_variant}" if schedule.causal else "unmasked"
    axes.set_title(f"Tile map: n_q={schedule.n_q}, n_kv={schedule.n_kv}, {mask}", fontsize=10)
    counts = {kind: int(np.count_nonzero(kinds == kind)) for kind in TILE_COLOURS}
    patches = [Patch(color=colour, label=f"{kind} ({counts[kind]})") for kind, colour in TILE_COLOURS.items()
               if counts[kind]]
    axes.legend(handles=patches, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return _save(figure, path)


def _ticks(count: int) -> list[int]:
    step = max(1, count // 16)
    return list(range(0, count, step))


def row_statistics(trace: Trace, row: int, head: int = 0) -> dict[str, np.ndarray]:
    """The state of one query row after each KV tile that reached it: j, m, alpha and l (float32)."""
    steps = [s for s in trace if s.head == head and row in s.rows]
    if not steps:
        recorded = sorted({r for s in trace if s.head == head for r in s.rows})
        span = f"{recorded[0]}..{recorded[-1]}" if recorded else "none"
        raise ValueError(f"rows must be query rows recorded for head {head} (recorded: {span}), got {row}")
    return {
        "j": np.array([s.j for s in steps]),
        **{name: np.array([getattr(s, name)[row - s.row_start] for s in steps]) for name in ("m", "alpha", "l")},
    }


def tile_stats(trace: Trace, rows: Iterable[int], path: str | Path, head: int = 0) -> Path:
    """Draw m, alpha and l of the chosen query rows against the KV tile just folded in."""
    path = picture_path(path)
    rows = list(rows)
    if not rows:
        raise ValueError("rows must name at least one query row")
    series = {row: row_statistics(trace, row, head) for row in rows}
    figure = Figure(figsize=(7, 6.5), layout="constrained")
    panels = figure.subplots(3, 1, sharex=True)
    about = {"m": "m: running row max", "alpha": "alpha = exp(m_old - m_new)", "l": "l: running sum"}
    for axes, name in zip(panels, ("m", "alpha", "l")):
        for row, stats in series.items():
            axes.plot(stats["j"], stats[name], marker="o", label=f"row {row}")
        axes.set_ylabel(about[name], fontsize=9)
        axes.grid(alpha=0.3)
    panels[-1].set_xlabel("KV tile j (state after the tile is folded in)")
    panels[-1].xaxis.get_major_locator().set_params(integer=True)
    panels[0].legend(fontsize=8, loc="best")
    config = trace.config
    figure.suptitle(f"Online softmax, {config.get('algorithm', '?')}: n_q={config.get('n_q', '?')}, "
                    f"B_r={config.get('block_q', '?')}, B_c={config.get('block_kv', '?')}, head {head}", fontsize=10)
    return _save(figure, path)


def cumulative_hbm_bytes(events: Sequence[MemoryEvent]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each tensor: the seq of every HBM transfer of it and its bytes moved so far (reads + writes)."""
    series: dict[str, tuple[list[int], list[int]]] = {}
    for event in events:
        if event.op in ("read", "write"):
            seqs, totals = series.setdefault(event.name, ([], []))
            seqs.append(event.seq)
            totals.append((totals[-1] if totals else 0) + event.nbytes)
    return {name: (np.array(seqs), np.array(totals, dtype=np.int64)) for name, (seqs, totals) in series.items()}


def _held(seqs: np.ndarray, totals: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The running total at each point of x: the last value at or before it (0 before the first)."""
    at = np.searchsorted(seqs, x, side="right")  # transfers of this tensor up to and including x
    return np.concatenate([[0], totals])[at]


def _byte_unit(nbytes: int) -> tuple[int, str]:
    for size, unit in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= size:
            return size, unit
    return 1, "B"


def traffic_over_run(runs: Mapping[str, Sequence[MemoryEvent]], path: str | Path, title: str = "") -> Path:
    """Draw cumulative HBM bytes by tensor over each run's events, one panel per run, shared y axis."""
    path = picture_path(path)
    series = {label: cumulative_hbm_bytes(events) for label, events in runs.items()}
    empty = [label for label, by_tensor in series.items() if not by_tensor]
    if not runs or empty:
        raise ValueError(f"runs must map labels to events with HBM transfers (record_events=True); empty: {empty}")
    tensors = list(dict.fromkeys(name for by_tensor in series.values() for name in by_tensor))
    colours = {name: f"C{n % 10}" for n, name in enumerate(tensors)}
    peak = max(int(totals[-1]) for by_tensor in series.values() for _, totals in by_tensor.values())
    size, unit = _byte_unit(peak)
    figure = Figure(figsize=(4.2 * len(series), 4.2), layout="constrained")
    panels = np.atleast_1d(figure.subplots(1, len(series), sharey=True))
    for axes, (label, by_tensor) in zip(panels, series.items()):
        # Stacked: each band is one tensor's bytes so far, the top edge the run's total so far.
        seqs = np.concatenate([seqs for seqs, _ in by_tensor.values()])
        x = np.unique(np.concatenate([[0], seqs, [seqs.max() + 1]]))  # + 1: the last transfer gets a width
        bands = [_held(seqs, totals, x) / size for seqs, totals in by_tensor.values()]
        axes.stackplot(x, bands, step="post", colors=[colours[name] for name in by_tensor], linewidth=0)
        total = sum(int(totals[-1]) for _, totals in by_tensor.values())
        axes.set_title(f"{label}: {total / size:,.2f} {unit} in total", fontsize=9)
        axes.set_xlabel("simulated event (seq)")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel(f"HBM bytes moved so far ({unit})")
    handles = [Patch(color=colours[name], label=name) for name in tensors]
    figure.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False, title="tensor")
    if title:
        figure.suptitle(title, fontsize=10)
    return _save(figure, path)
