"""`simflash view`: a trace file (or a fresh run) as one self-contained HTML page for the browser."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

import simflash as sf
from simflash import viewer
from simflash.commands import user_errors
from simflash.commands.files import (
    ALGORITHMS, BLOCK_KV, BLOCK_Q, CAUSAL, CAUSAL_VARIANT, DTYPE, N, N_KV, SEED, D, input_options, random_inputs,
)
from simflash.api import VARIANTS
from simflash.config import check_choice
from simflash.trace import TRACE_LEVELS, Trace

console = Console(soft_wrap=True, highlight=False)
DEFAULT_PAGE = Path("simflash-view.html")


def view(
    source: Annotated[Path | None, typer.Argument(
        help="A trace file written by `simflash export` or Trace.save (.json or .npz). Without one, the "
             "configuration given by the options is run on random inputs.", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="HTML page to write (default: the trace file's "
                                             f"name with .html, or {DEFAULT_PAGE}).", show_default=False)] = None,
    algorithm: Annotated[str, typer.Option(help=f"Algorithm of a fresh run: {', '.join(ALGORITHMS)}.")] = "fa2",
    n: N = 64, n_kv: N_KV = None, d: D = 16, heads: Annotated[int, typer.Option(help="Heads.")] = 1,
    block_q: BLOCK_Q = 16, block_kv: BLOCK_KV = 16, causal: CAUSAL = False,
    causal_variant: CAUSAL_VARIANT = "upper_left", dtype: DTYPE = "float16", seed: SEED = 0,
    cache: Annotated[str | None, typer.Option(help="Pass the run through the L2 model: cold or warm "
                                              "(shows L2 hits and DRAM bytes).", show_default=False)] = None,
    level: Annotated[str, typer.Option(help="Trace level of a fresh run: stats or full.")] = "full",
) -> None:
    """Write a self-contained HTML page (no network) that steps through a run tile by tile: the tile map,
    m, alpha, l and the accumulator norms of the current tile, and the bytes moved so far by tensor."""
    with user_errors():
        if source is not None:
            try:
                subject: sf.Run | Trace = Trace.load(source)
            except OSError as error:
                raise ValueError(f"cannot read {source}: {error.strerror or error}") from None
            page = out if out is not None else source.with_name(source.name.split(".")[0] + ".html")
        else:
            if algorithm not in ALGORITHMS:
                raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
            q, k, v = random_inputs(n, n_kv, d, heads, seed)
            common = input_options(causal, causal_variant, dtype, cache=cache)
            if algorithm == "naive":
                subject = sf.naive_attention(q, k, v, **common)
            else:
                variant = check_choice("algorithm", algorithm, VARIANTS)
                subject = sf.flash_attention(q, k, v, block_q, block_kv, variant=variant,
                                             trace=check_choice("level", level, TRACE_LEVELS), **common)
            page = out if out is not None else DEFAULT_PAGE
        path = viewer.write(subject, page)
    console.print(f"wrote {escape(str(path))} ({path.stat().st_size:,} bytes); open it in a browser")


def register(app: typer.Typer) -> None:
    app.command("view")(view)
