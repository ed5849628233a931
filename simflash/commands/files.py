"""Commands that write files: `golden` (the golden traces), `export` (a run's trace as JSON, NPZ or a
Perfetto timeline) and `plot` (tilemap, stats, traffic pictures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypedDict

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape

import simflash as sf
from simflash import golden as golden_traces
from simflash import plots, trace_files
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.api import CACHE_MODES, VARIANTS, CacheMode
from simflash.config import (
    CAUSAL_VARIANTS, STORAGE_DTYPE_NAMES, STORAGE_DTYPES, CausalVariant, StorageDtypeName, check_choice,
)
from simflash.trace import TRACE_LEVELS

ALGORITHMS = ("naive", *FLASH_ALGORITHMS)
BACKWARD_ALGORITHMS = ("naive", "fa2")

console = Console(soft_wrap=True, highlight=False)  # paths stay whole and uncoloured

# Options shared by the commands that run a configuration on random inputs.
N = Annotated[int, typer.Option(help="Query rows n_q (and keys, unless --n-kv).")]
N_KV = Annotated[int | None, typer.Option(help="Keys n_kv (default: --n).")]
D = Annotated[int, typer.Option(help="Head dimension d.")]
BLOCK_Q = Annotated[int, typer.Option(help="Query tile rows B_r.")]
BLOCK_KV = Annotated[int, typer.Option(help="KV tile rows B_c.")]
CAUSAL = Annotated[bool, typer.Option(help="Causal masking.")]
CAUSAL_VARIANT = Annotated[str, typer.Option(help=f"Causal diagonal when n_q != n_kv: {', '.join(CAUSAL_VARIANTS)}.")]
DTYPE = Annotated[str, typer.Option(help=f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}.")]
SEED = Annotated[int, typer.Option(help="Seed of the random inputs (standard normal).", min=0)]
OUT = Annotated[Path, typer.Option("--out", "-o", help="File to write.")]
MAX_MAP_TILES = 512  # tiles a side of a tile map; beyond it the cells are under a pixel


class InputOptions(TypedDict, total=False):
    """What naive_attention and flash_attention take alike, from a command's options."""

    causal: bool
    causal_variant: CausalVariant
    dtype: StorageDtypeName
    record_events: bool
    cache: CacheMode | None


def input_options(causal: bool, causal_variant: str, dtype: str, *, record_events: bool = False,
                  cache: str | None = None) -> InputOptions:
    """The options' strings checked into the library's choices (an error names the option)."""
    return InputOptions(causal=causal, causal_variant=check_choice("causal_variant", causal_variant, CAUSAL_VARIANTS),
                        dtype=check_choice("dtype", dtype, STORAGE_DTYPE_NAMES), record_events=record_events,
                        cache=None if cache is None else check_choice("cache", cache, CACHE_MODES))


def random_inputs(n: int, n_kv: int | None, d: int, heads: int, seed: int) -> tuple[np.ndarray, ...]:
    """Standard-normal Q (heads, n, d), K and V (heads, n_kv, d) from one seed."""
    sizes = {"n": n, "d": d, "heads": heads} | ({} if n_kv is None else {"n_kv": n_kv})
    for name, value in sizes.items():
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    rng = np.random.default_rng(seed)
    n_kv = n if n_kv is None else n_kv
    return rng.standard_normal((heads, n, d)), rng.standard_normal((heads, n_kv, d)), rng.standard_normal((heads, n_kv, d))


def golden(
    check: Annotated[bool, typer.Option("--check", help="Compare the files with what the code produces; "
                                                       "write nothing; exit 1 on any difference.")] = False,
    directory: Annotated[Path | None, typer.Option("--dir", help="Directory of the golden traces (default: the "
                                                       "traces/ of the simflash checkout).")] = None,
) -> None:
    """Regenerate (or --check) the golden traces: every golden case under every tiled variant, and the
    backward cases through FlashAttention-2's backward."""
    try:
        directory = golden_traces.golden_directory(directory)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--dir") from None
    if check:
        problems = golden_traces.check_golden(directory)
        for problem in problems:
            console.print(f"[red]differs[/red] {escape(problem)}")
        if problems:
            console.print(f"{len(problems)} problem(s); regenerate with `simflash golden --dir {escape(str(directory))}` "
                          "once the change is intended")
            raise typer.Exit(1)
        console.print(f"golden traces in {escape(str(directory))} match the code "
                      f"({len(golden_traces.GOLDEN_CASES)} cases x {len(FLASH_ALGORITHMS)} variants, "
                      f"{len(golden_traces.GOLDEN_BACKWARD_CASES)} backward)")
        return
    for path in golden_traces.write_golden(directory):
        console.print(f"wrote {escape(str(path))} ({path.stat().st_size:,} bytes)")


def export(
    out: OUT,
    algorithm: Annotated[str, typer.Option(help=f"Algorithm: {', '.join(ALGORITHMS)} (with --backward: "
                                                f"{', '.join(BACKWARD_ALGORITHMS)}).")] = "fa2",
    file_format: Annotated[str | None, typer.Option("--format", help=f"File format: {', '.join(trace_files.FORMATS)} "
                                                    "(default: from the suffix).")] = None,
    n: N = 64, n_kv: N_KV = None, d: D = 16, heads: Annotated[int, typer.Option(help="Heads.")] = 1,
    block_q: BLOCK_Q = 16, block_kv: BLOCK_KV = 16, causal: CAUSAL = False,
    causal_variant: CAUSAL_VARIANT = "upper_left", dtype: DTYPE = "float16", seed: SEED = 0,
    level: Annotated[str, typer.Option(help="Trace level for .json/.npz: stats or full (a timeline records "
                                            "no tile state).")] = "full",
    backward: Annotated[bool, typer.Option(
        "--backward", help="Write the backward's trace instead (.json or .npz): a step per tile (j, i) of "
                           "FlashAttention-2's backward, B_r = --block-q, B_c = --block-kv, on a random output "
                           "gradient (naive: its configuration, no steps).")] = False,
) -> None:
    """Run one configuration on random inputs and write its trace (.json, .npz) or timeline (.perfetto.json)."""
    kind = trace_files.format_for(out, file_format)
    if backward:
        _export_backward(out, kind, algorithm, n, n_kv, d, heads, block_q, block_kv, causal, causal_variant, dtype,
                         seed, level)
        return
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    q, k, v = random_inputs(n, n_kv, d, heads, seed)
    common = input_options(causal, causal_variant, dtype, record_events=kind == "perfetto")
    if algorithm == "naive":
        run = sf.naive_attention(q, k, v, **common)
    else:
        # A timeline is drawn from the events alone: no tile trace, so none of its size limit.
        run = sf.flash_attention(q, k, v, block_q, block_kv, variant=check_choice("algorithm", algorithm, VARIANTS),
                                 trace="none" if kind == "perfetto" else check_choice("level", level, TRACE_LEVELS),
                                 **common)
    path = run.trace.save(out, kind, events=run.events)
    what = f"{len(run.events):,} events" if kind == "perfetto" else f"{len(run.trace):,} tile steps"
    console.print(f"wrote {escape(str(path))} ({kind}, {what}, {path.stat().st_size:,} bytes)")


def _export_backward(out: Path, kind: str, algorithm: str, n: int, n_kv: int | None, d: int, heads: int,
                     block_q: int, block_kv: int, causal: bool, causal_variant: str, dtype: str, seed: int,
                     level: str) -> None:
    """`export --backward`: the backward's trace on random inputs and a random output gradient."""
    if kind == "perfetto":
        raise ValueError("--out a backward trace has no Perfetto timeline (the backward records no events); "
                         "write .json or .npz")
    if algorithm not in BACKWARD_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {BACKWARD_ALGORITHMS} with --backward, got {algorithm!r}")
    q, k, v = random_inputs(n, n_kv, d, heads, seed)
    do = np.random.default_rng([seed, 1]).standard_normal(q.shape)  # a stream of its own: q, k, v as without
    options = input_options(causal, causal_variant, dtype)
    variant, dtype_name = options["causal_variant"], options["dtype"]
    if algorithm == "naive":
        run = sf.naive_attention_backward(q, k, v, do, causal=causal, causal_variant=variant, dtype=dtype_name)
    else:
        run = sf.flash_attention_backward(q, k, v, do, block_q, block_kv, causal=causal, causal_variant=variant,
                                          dtype=dtype_name, trace=check_choice("level", level, TRACE_LEVELS))
    path = run.trace.save(out, kind)
    console.print(f"wrote {escape(str(path))} ({kind}, backward, {len(run.trace):,} tile steps, "
                  f"{path.stat().st_size:,} bytes)")


plot_app = typer.Typer(help="Draw pictures (PNG or SVG by the --out suffix).", no_args_is_help=True)


@plot_app.command("tilemap")
def plot_tilemap(
    out: OUT = Path("tilemap.png"), n: N = 16, n_kv: N_KV = None, block_q: BLOCK_Q = 4, block_kv: BLOCK_KV = 2,
    causal: CAUSAL = True, causal_variant: CAUSAL_VARIANT = "upper_left",
) -> None:
    """The tile map: which (i, j) tiles are full, masked (straddle the diagonal) or skipped."""
    schedule = sf.TileSchedule(n, n if n_kv is None else n_kv, block_q, block_kv, causal=causal,
                               causal_variant=causal_variant)
    if max(schedule.n_q_tiles, schedule.n_kv_tiles) > MAX_MAP_TILES:
        raise typer.BadParameter(
            f"the map would draw {schedule.n_q_tiles:,} x {schedule.n_kv_tiles:,} tiles; at most {MAX_MAP_TILES} "
            "a side can be told apart: raise --block-q / --block-kv or lower --n", param_hint="--n")
    path = plots.tile_map(schedule, out)
    console.print(f"wrote {escape(str(path))}")


@plot_app.command("stats")
def plot_stats(
    out: OUT = Path("stats.png"),
    rows: Annotated[str, typer.Option(help="Query rows to draw, comma-separated (default: first and last).")] = "",
    trace_file: Annotated[Path | None, typer.Option("--trace", help="Draw from a saved .json/.npz trace "
                                                    "instead of running.")] = None,
    head: Annotated[int, typer.Option(help="Head to draw.")] = 0,
    variant: Annotated[str, typer.Option(help=f"Tiled variant: {', '.join(FLASH_ALGORITHMS)}.")] = "fa2",
    n: N = 16, n_kv: N_KV = None, d: D = 4, block_q: BLOCK_Q = 4, block_kv: BLOCK_KV = 2, causal: CAUSAL = True,
    causal_variant: CAUSAL_VARIANT = "upper_left", dtype: DTYPE = "float32", seed: SEED = 0,
) -> None:
    """m, alpha and l of chosen query rows across the KV tiles (from a run, or a saved trace)."""
    if trace_file is not None:
        trace = sf.Trace.load(trace_file)
    else:
        q, k, v = random_inputs(n, n_kv, d, 1, seed)
        trace = sf.flash_attention(q, k, v, block_q, block_kv, variant=check_choice("variant", variant, VARIANTS),
                                   trace="stats", **input_options(causal, causal_variant, dtype)).trace
    chosen = _row_list(rows, trace)
    path = plots.tile_stats(trace, chosen, out, head=head)
    console.print(f"wrote {escape(str(path))} (rows {', '.join(map(str, chosen))})")


def _row_list(text: str, trace: sf.Trace) -> list[int]:
    if not text.strip():
        recorded = sorted({row for step in trace for row in step.rows})
        if not recorded:
            raise ValueError("the trace has no steps to draw")
        return sorted({recorded[0], recorded[-1]})
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"rows must be comma-separated integers such as 0,5, got {text!r}") from None


@plot_app.command("traffic")
def plot_traffic(
    out: OUT = Path("traffic.png"), n: N = 256, n_kv: N_KV = None, d: D = 32, block_q: BLOCK_Q = 64,
    block_kv: BLOCK_KV = 32, causal: CAUSAL = False, causal_variant: CAUSAL_VARIANT = "upper_left",
    dtype: DTYPE = "float16", seed: SEED = 0,
) -> None:
    """Cumulative HBM bytes by tensor over the run: naive next to every tiled variant."""
    q, k, v = random_inputs(n, n_kv, d, 1, seed)
    common = input_options(causal, causal_variant, dtype, record_events=True)
    runs = {"naive": sf.naive_attention(q, k, v, **common).events}
    for variant in VARIANTS:
        runs[variant] = sf.flash_attention(q, k, v, block_q, block_kv, variant=variant, trace="none",
                                           **common).events
    mask = f"causal {causal_variant}" if causal else "unmasked"
    title = f"n_q={n}, n_kv={n if n_kv is None else n_kv}, d={d}, {dtype}, B_r={block_q}, B_c={block_kv}, {mask}"
    path = plots.traffic_over_run(runs, out, title=title)
    console.print(f"wrote {escape(str(path))}")


def register(app: typer.Typer) -> None:
    """Add golden, export and plot to the simflash app."""
    app.command("golden")(golden)
    app.command("export")(export)
    app.add_typer(plot_app, name="plot")
