"""Pictures (matplotlib, drawn off-screen with Agg): the tile map, the online-softmax statistics of
chosen rows across KV tiles, cumulative HBM bytes by tensor over a run, and logical against physical
(L2, DRAM) bytes per kernel and against N, and Flash-Decoding's predicted K/V bandwidth against batch x
K/V heads. PNG or SVG by suffix.

Each picture has a data function beside it (`row_statistics`, `cumulative_hbm_bytes`, `physical_bars`,
`dram_vs_n`, `decode_bandwidth`) so that what is drawn can be checked without looking at pixels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    return _save(tile_map_figure(schedule), path)


def tile_map_figure(schedule: TileSchedule) -> Figure:
    """The tile map as a Figure (see tile_map)."""
    kinds = schedule.kind_map()
    codes = np.vectorize(list(TILE_COLOURS).index)(kinds)  # (T_r, T_c) 0 full, 1 masked, 2 skipped
    rows, cols = kinds.shape
    cell = min(0.45, 9 / cols, 8 / rows)  # inches per tile, so big grids stay on the page
    # Room beside the grid for the tick labels and axis label (left) and the legend (right), so that
    # the constrained layout never has to squeeze them off the page, however many tiles there are.
    figure = Figure(figsize=(4.2 + cell * cols, 1.6 + cell * rows), layout="constrained")
    axes = figure.add_subplot()
    axes.imshow(codes, cmap=ListedColormap(list(TILE_COLOURS.values())), vmin=-0.5, vmax=2.5, aspect="equal")
    if max(rows, cols) <= LETTERED_GRID_MAX:
        for (i, j), kind in np.ndenumerate(kinds):
            axes.text(j, i, TILE_LETTERS[kind], ha="center", va="center", fontsize=8,
                      color="white" if kind == "full" else "black")
    axes.set_xticks(_ticks(cols), [str(j) for j in _ticks(cols)])
    axes.set_yticks(_ticks(rows), [str(i) for i in _ticks(rows)])
    if max(rows, cols) <= LETTERED_GRID_MAX:  # cell borders; past that they would paint the grid white
        axes.set_xticks(np.arange(cols + 1) - 0.5, minor=True)
        axes.set_yticks(np.arange(rows + 1) - 0.5, minor=True)
        axes.grid(which="minor", color="white", linewidth=1)
    axes.tick_params(which="minor", length=0)
    axes.set_xlabel(f"KV tile j ({schedule.block_kv} keys each)")
    axes.set_ylabel(f"query tile i ({schedule.block_q} rows each)")
    mask = f"causal {schedule.causal_variant}" if schedule.causal else "unmasked"
    axes.set_title(f"Tile map: n_q={schedule.n_q}, n_kv={schedule.n_kv}, {mask}, {rows} x {cols} tiles", fontsize=10)
    counts = {kind: int(np.count_nonzero(kinds == kind)) for kind in TILE_COLOURS}
    patches = [Patch(color=colour, label=f"{kind} ({counts[kind]:,})") for kind, colour in TILE_COLOURS.items()
               if counts[kind]]
    figure.legend(handles=patches, loc="outside right upper", fontsize=8, frameon=False)
    return figure


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
    return _save(tile_stats_figure(trace, rows, head), path)


def _run_description(config: Mapping) -> str:
    mask = f"causal {config.get('causal_variant', '')}".rstrip() if config.get("causal") else "unmasked"
    return f"{mask}, {config.get('dtype', '?')}"


def tile_stats_figure(trace: Trace, rows: Iterable[int], head: int = 0) -> Figure:
    """m, alpha and l as a Figure (see tile_stats).

    Each value is the state after one KV tile, a discrete step: m and l are drawn as steps held until
    the next tile (with a marker at each tile), alpha as markers alone. alpha = exp(m_old - m_new) is
    not drawn where the row had no running max before (its first tile: nothing to rescale), where the
    trace records 0. The axes include 0 (alpha's spans [0, 1]) so a change is drawn at its true size.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("rows must name at least one query row")
    series = {row: row_statistics(trace, row, head) for row in rows}
    figure = Figure(figsize=(7, 6.5), layout="constrained")
    panels = figure.subplots(3, 1, sharex=True)
    about = {"m": "m: running row max", "alpha": "alpha = exp(m_old - m_new)", "l": "l: running sum"}
    for axes, name in zip(panels, ("m", "alpha", "l")):
        for c, (row, stats) in enumerate(series.items()):
            j, values = stats["j"], stats[name]
            if name == "alpha":
                had_max = np.isfinite(np.concatenate([[-np.inf], stats["m"][:-1]]))  # m_old of each step
                axes.plot(j[had_max], values[had_max], marker="o", linestyle="none", color=f"C{c}",
                          label=f"row {row}")
            else:
                axes.plot(j, values, marker="o", drawstyle="steps-post", color=f"C{c}", label=f"row {row}")
        axes.set_ylabel(about[name], fontsize=9)
        axes.grid(alpha=0.3)
        low, high = axes.get_ylim()
        if name == "alpha":
            axes.set_ylim(0, 1.05)
        else:
            axes.set_ylim(min(low, 0.0), max(high, 0.0))  # from zero: no zoom onto tiny changes
    panels[1].text(0.99, 0.04, "not drawn at a row's first tile (no earlier max to rescale)",
                   transform=panels[1].transAxes, ha="right", va="bottom", fontsize=7, color="dimgrey")
    panels[-1].set_xlabel("KV tile j (state after the tile is folded in)")
    panels[-1].xaxis.get_major_locator().set_params(integer=True)
    panels[0].legend(fontsize=8, loc="best")
    config = trace.config
    figure.suptitle(f"Online softmax, {config.get('algorithm', '?')}: n_q={config.get('n_q', '?')}, "
                    f"n_kv={config.get('n_kv', '?')}, B_r={config.get('block_q', '?')}, "
                    f"B_c={config.get('block_kv', '?')}, {_run_description(config)}, head {head}", fontsize=10)
    return figure


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


TRAFFIC_X_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)  # labelled in % of the run
TENSOR_ORDER = ("Q", "K", "V", "S", "P", "O (init)", "l (init)", "m (init)", "O", "l", "m")  # bottom to top


def traffic_over_run(runs: Mapping[str, Sequence[MemoryEvent]], path: str | Path, title: str = "") -> Path:
    """Draw cumulative HBM bytes by tensor over each run, one panel per run, shared x and y axes."""
    path = picture_path(path)
    return _save(traffic_figure(runs, title), path)


def traffic_figure(runs: Mapping[str, Sequence[MemoryEvent]], title: str = "") -> Figure:
    """Cumulative HBM bytes as a Figure (see traffic_over_run).

    x is the share of the run's simulated events done, in % (every run goes from 0 to 1, whatever its
    event count), y the bytes moved so far, stacked by tensor in one order for every panel (inputs at
    the bottom, then intermediates and outputs, as TENSOR_ORDER; others after them): the top edge is
    the run's total so far."""
    series = {label: cumulative_hbm_bytes(events) for label, events in runs.items()}
    empty = [label for label, by_tensor in series.items() if not by_tensor]
    if not runs or empty:
        raise ValueError(f"runs must map labels to events with HBM transfers (record_events=True); empty: {empty}")
    seen = list(dict.fromkeys(name for by_tensor in series.values() for name in by_tensor))
    tensors = [name for name in TENSOR_ORDER if name in seen] + [name for name in seen if name not in TENSOR_ORDER]
    palette = [f"C{n}" for n in range(10)] + ["#393b79", "#8c6d31", "#843c39", "#637939"]  # C9 is #17becf
    colours = {name: palette[n % len(palette)] for n, name in enumerate(tensors)}
    peak = max(int(totals[-1]) for by_tensor in series.values() for _, totals in by_tensor.values())
    size, unit = _byte_unit(peak)
    figure = Figure(figsize=(4.2 * len(series) + 1.2, 4.2), layout="constrained")
    panels = np.atleast_1d(figure.subplots(1, len(series), sharex=True, sharey=True))
    for axes, (label, by_tensor) in zip(panels, series.items()):
        seqs_of_run = [event.seq for event in runs[label]]
        first, span = min(seqs_of_run), max(seqs_of_run) - min(seqs_of_run) + 1  # the last event gets a width
        drawn = [name for name in tensors if name in by_tensor]
        x = np.unique(np.concatenate([[first], *(by_tensor[name][0] for name in drawn), [first + span]]))
        bands = [_held(*by_tensor[name], x) / size for name in drawn]
        axes.stackplot((x - first) / span, bands, step="post", colors=[colours[name] for name in drawn],
                       labels=drawn, linewidth=0)
        total = sum(int(totals[-1]) for _, totals in by_tensor.values())
        axes.set_title(f"{label}: {total / size:,.2f} {unit} in total\n({span:,} events)", fontsize=9)
        axes.set_xlabel("% of the run's events done")
        axes.grid(alpha=0.3)
    panels[0].set_xlim(0, 1)
    panels[0].set_xticks(TRAFFIC_X_TICKS, [f"{100 * t:.0f}" for t in TRAFFIC_X_TICKS])
    panels[0].set_ylabel(f"HBM bytes moved so far ({unit})")
    handles = [Patch(color=colours[name], label=name) for name in reversed(tensors)]  # listed as stacked
    figure.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False, title="tensor\n(top)")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


# -- logical against physical traffic (the whole-chip model: simflash.model.physical) ------------------

PHYSICAL_BARS = {  # label -> (colour, hatch)
    "logical read": ("#4c72b0", ""), "logical write": ("#8172b3", ""), "L2 hits": ("#55a868", ""),
    "DRAM read": ("#c44e52", ""), "DRAM write": ("#dd8452", ""),
    "DRAM read (measured)": ("#c44e52", "//"), "DRAM write (measured)": ("#dd8452", "//"),
}
DRAM_VS_N_NAIVE = tuple(2 ** k for k in range(8, 15))  # 256 .. 16384, one head
DRAM_VS_N_FA2 = tuple(2 ** k for k in range(10, 18))  # 1024 .. 131072
DRAM_VS_N_FA2_HEADS = (1, 32)


def _kernel_dicts(prediction) -> list[dict]:
    return prediction.to_dict()["kernels"] if hasattr(prediction, "to_dict") else list(prediction["kernels"])


def physical_bars(prediction, measured: Mapping[str, Mapping] | None = None) -> dict[str, dict[str, int]]:
    """For each kernel of a PhysicalPrediction: bytes by bar label (PHYSICAL_BARS); the measured DRAM
    bars only where `measured` (kernel -> {"dram_read_bytes", "dram_write_bytes"}) has the kernel."""
    bars = {}
    for k in _kernel_dicts(prediction):
        bars[k["kernel"]] = {"logical read": k["logical_read_bytes"], "logical write": k["logical_write_bytes"],
                             "L2 hits": k["l2_hit_bytes"], "DRAM read": k["dram_read_bytes"],
                             "DRAM write": k["dram_write_bytes"]}
        seen = (measured or {}).get(k["kernel"])
        if seen:
            bars[k["kernel"]].update({"DRAM read (measured)": int(seen["dram_read_bytes"]),
                                      "DRAM write (measured)": int(seen["dram_write_bytes"])})
    return bars


def plot_physical(prediction, measured: Mapping[str, Mapping] | None = None, path: str | Path | None = None) -> Path:
    """Per kernel, grouped bars: logical reads and writes, L2 hits, predicted DRAM reads and writes
    (and measured ones where given)."""
    if path is None:
        raise ValueError(f"path must name a picture file ending in one of {PICTURE_SUFFIXES}")
    path = picture_path(path)
    bars = physical_bars(prediction, measured)
    labels = [label for label in PHYSICAL_BARS if any(label in by_label for by_label in bars.values())]
    size, unit = _byte_unit(max([1, *(v for by_label in bars.values() for v in by_label.values())]))
    width = 0.8 / len(labels)
    figure = Figure(figsize=(2.2 + 2.0 * len(bars) + 0.25 * len(labels), 4.6), layout="constrained")
    axes = figure.add_subplot()
    for b, label in enumerate(labels):
        colour, hatch = PHYSICAL_BARS[label]
        xs = [x + (b - (len(labels) - 1) / 2) * width for x, by_label in enumerate(bars.values()) if label in by_label]
        values = [by_label[label] / size for by_label in bars.values() if label in by_label]
        drawn = axes.bar(xs, values, width, label=label, color=colour, hatch=hatch,
                         edgecolor="white" if hatch else colour, linewidth=0.5)
        axes.bar_label(drawn, labels=[f"{v:,.3g}" for v in values], fontsize=6, rotation=90, padding=2)
    axes.set_xticks(range(len(bars)), list(bars))
    axes.set_ylabel(f"bytes ({unit})")
    axes.margins(y=0.15)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    config = prediction.config if hasattr(prediction, "config") else prediction.get("config", {})
    axes.set_title(f"Logical vs physical traffic: {config.get('algorithm', '?')}, N={config.get('n', '?')}, "
                   f"H={config.get('heads', '?')}, d={config.get('d', '?')}, {config.get('gpu', '?')}, "
                   f"{config.get('cache', '?')} L2", fontsize=10)
    return _save(figure, path)


def dram_vs_n(
    naive_n: Sequence[int] = DRAM_VS_N_NAIVE, fa2_n: Sequence[int] = DRAM_VS_N_FA2,
    fa2_heads: Sequence[int] = DRAM_VS_N_FA2_HEADS, *, gpu: str = "H200", d: int = 128, dtype: str = "float16",
) -> dict:
    """Logical and predicted DRAM bytes (reads + writes, every kernel summed) against N, from
    traffic-only predictions: the naive path with one head, cold and warm L2; FA-2 (simflash's kernel,
    cold L2) for each head count. With the N where the naive path's S and P (one head) stop fitting
    the L2 the model uses, and where FA-2's K and V of one head do."""
    from simflash.chip import l2_cache
    from simflash.config import gpu_spec, storage_dtype
    from simflash.model.physical import predict

    spec = gpu_spec(gpu)
    capacity = l2_cache(spec).capacity_bytes
    itemsize = storage_dtype(dtype).itemsize

    def totals(prediction) -> tuple[int, int]:
        ks = prediction.kernels
        return (sum(k.logical_read_bytes + k.logical_write_bytes for k in ks),
                sum(k.dram_read_bytes + k.dram_write_bytes for k in ks))

    naive: dict[str, Any] = {"n": np.array(naive_n), "l2_fit_n": float(np.sqrt(capacity / (2 * itemsize)))}
    for cache in ("cold", "warm"):
        pairs = [totals(predict("naive", n, d, dtype=dtype, gpu=spec, cache=cache)) for n in naive_n]
        naive["logical"] = np.array([p[0] for p in pairs], dtype=np.int64)
        naive[cache] = np.array([p[1] for p in pairs], dtype=np.int64)
    fa2: dict[str, Any] = {"n": np.array(fa2_n), "l2_fit_n": capacity / (2 * d * itemsize), "logical": {}, "dram": {}}
    for heads in fa2_heads:
        pairs = [totals(predict("fa2", n, d, heads=heads, dtype=dtype, gpu=spec)) for n in fa2_n]
        fa2["logical"][heads] = np.array([p[0] for p in pairs], dtype=np.int64)
        fa2["dram"][heads] = np.array([p[1] for p in pairs], dtype=np.int64)
    return {"naive": naive, "fa2": fa2, "l2_bytes": int(capacity), "gpu": spec.name, "d": d, "dtype": dtype}


def plot_dram_vs_n(path: str | Path, naive_n: Sequence[int] = DRAM_VS_N_NAIVE, fa2_n: Sequence[int] = DRAM_VS_N_FA2,
                   fa2_heads: Sequence[int] = DRAM_VS_N_FA2_HEADS, *, gpu: str = "H200", d: int = 128,
                   dtype: str = "float16") -> Path:
    """Two panels of `dram_vs_n`: the naive path (logical, DRAM cold, DRAM warm) and FA-2 (logical and
    DRAM per head count), bytes against N on log axes, the L2 thresholds marked."""
    path = picture_path(path)
    data = dram_vs_n(naive_n, fa2_n, fa2_heads, gpu=gpu, d=d, dtype=dtype)
    figure = Figure(figsize=(11, 4.6), layout="constrained")
    left, right = figure.subplots(1, 2)
    naive = data["naive"]
    left.plot(naive["n"], naive["logical"], "o-", color="#4c72b0", label="logical (the ledger)")
    left.plot(naive["n"], naive["cold"], "s--", color="#c44e52", label="DRAM, cold L2")
    left.plot(naive["n"], naive["warm"], "^:", color="#dd8452", label="DRAM, warm L2")
    _threshold(left, naive["l2_fit_n"], "S + P > L2")
    left.set_title("naive (3 kernels), H=1", fontsize=10)
    fa2 = data["fa2"]
    for c, heads in enumerate(fa2["logical"]):
        right.plot(fa2["n"], fa2["logical"][heads], "o-", color=f"C{c}", label=f"logical, H={heads}")
        right.plot(fa2["n"], fa2["dram"][heads], "s--", color=f"C{c}", label=f"DRAM, H={heads}")
    _threshold(right, fa2["l2_fit_n"], "K + V of a head > L2")
    right.set_title("FA-2 (simflash kernel), cold L2", fontsize=10)
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("N (n_q = n_kv)")
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize=8, loc="upper left")
    left.set_ylabel("bytes moved (reads + writes)")
    figure.suptitle(f"DRAM vs logical bytes against N: {data['gpu']}, d={data['d']}, {data['dtype']}, "
                    f"L2 as modelled {data['l2_bytes'] / MiB:,.1f} MiB", fontsize=10)
    return _save(figure, path)


def _threshold(axes, n: float, label: str) -> None:
    low, high = axes.get_xlim()
    if low <= n <= high:
        axes.axvline(n, color="grey", linestyle="-.", linewidth=1)
        right = np.log(n / low) > 0.6 * np.log(high / low)  # near the right edge: the label goes left of the line
        axes.annotate(f"{label}\n(N ≈ {n:,.0f})", (n, 0.02), xycoords=("data", "axes fraction"),
                      xytext=(-4 if right else 4, 0), textcoords="offset points", fontsize=8, color="dimgrey",
                      ha="right" if right else "left")


DECODE_PAIRS = tuple(range(1, 257))  # batch x K/V heads


def decode_bandwidth(n_kvs: Sequence[int], d: int = 128, *, group: int = 1, n_q: int = 1,
                     block_kv: int | None = None, pack_gqa: bool = True, dtype: str = "float16",
                     gpu: str = "H200", pairs: Sequence[int] = DECODE_PAIRS) -> dict:
    """Predicted K/V bandwidth (K and V bytes over the decode step's predicted time, both kernels) against
    batch x K/V heads, for one split and for FA-2's heuristic, per cache length in `n_kvs`; group query
    heads per K/V head. The grid and the bytes depend on batch and K/V heads only through their product,
    so x pairs are x batch elements of one K/V head each."""
    from simflash.config import gpu_spec
    from simflash.model.decode import predict_decode

    spec = gpu_spec(gpu)
    x = np.array(pairs)
    lines = {}
    for n_kv in n_kvs:
        for label, splits in (("1 split", 1), ("heuristic", None)):
            predictions = [predict_decode(n_kv, d, batch=int(p), heads=group, kv_heads=1, n_q=n_q,
                                          num_splits=splits, block_kv=block_kv, pack_gqa=pack_gqa, dtype=dtype,
                                          gpu=spec) for p in x]
            lines[n_kv, label] = np.array([p.kv_bytes_per_s for p in predictions])
    return {"pairs": x, "lines": lines, "hbm_bytes_per_s": spec.hbm_bytes_per_s * spec.calibration.get(
        "hbm_efficiency", 1.0), "gpu": spec.name, "d": d, "group": group, "dtype": dtype}


def plot_decode_bandwidth(path: str | Path, n_kvs: Sequence[int], d: int = 128, **options) -> Path:
    """`decode_bandwidth` as lines in GB/s on a log2 x axis, the calibrated HBM bandwidth marked."""
    path = picture_path(path)
    data = decode_bandwidth(n_kvs, d, **options)
    figure = Figure(figsize=(8, 4.8), layout="constrained")
    axes = figure.add_subplot()
    for c, n_kv in enumerate(dict.fromkeys(n_kv for n_kv, _ in data["lines"])):
        axes.plot(data["pairs"], data["lines"][n_kv, "heuristic"] / 1e9, "-", color=f"C{c}",
                  label=f"n_kv = {n_kv:,}, FA-2's heuristic")
        axes.plot(data["pairs"], data["lines"][n_kv, "1 split"] / 1e9, "--", color=f"C{c}",
                  label=f"n_kv = {n_kv:,}, 1 split")
    axes.axhline(data["hbm_bytes_per_s"] / 1e9, color="grey", linestyle="-.", linewidth=1)
    axes.annotate("HBM bandwidth as calibrated", (1, data["hbm_bytes_per_s"] / 1e9), fontsize=8, color="dimgrey",
                  xytext=(4, 4), textcoords="offset points")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("batch x K/V heads")
    axes.set_ylabel("predicted K/V bandwidth (GB/s)")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8, loc="lower right")
    axes.set_title(f"Flash-Decoding, predicted (a model): {data['gpu']}, d={data['d']}, {data['group']} query "
                   f"heads per K/V head, {data['dtype']}", fontsize=10)
    return _save(figure, path)
