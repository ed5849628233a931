"""`simflash bench`: what the simulator's bookkeeping costs, measured in one run."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from simflash.commands import make_console
from simflash.bench import flash_overhead, flash_peak_memory, naive_overhead


def bench(
    n: Annotated[int, typer.Option(help="N for the timing comparisons.")] = 4096,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    big_n: Annotated[int, typer.Option(help="N for the peak-memory run (trace='none').")] = 32768,
    repeat: Annotated[int, typer.Option(help="Timed runs of each side (median taken).")] = 5,
    output: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
) -> None:
    """Time the simulator against bare NumPy doing the same math, and measure FA-2's peak memory."""
    console = make_console()
    with console.status("timing FA-2 simulation vs bare tiled loop"):
        flash = flash_overhead(n, d, repeat=repeat)
    with console.status("timing naive simulation vs plain NumPy attention"):
        naive = naive_overhead(n, d, repeat=repeat)
    with console.status(f"FA-2 at N={big_n} in a child process (peak memory)"):
        memory = flash_peak_memory(big_n, d)

    table = Table(title=f"simflash bench (NumPy {np.__version__}, Python {platform.python_version()})")
    for column in ("measurement", "simflash", "bare NumPy", "ratio", "target", "met"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for result in (flash, naive):
        table.add_row(f"{result['what']}, N={result['n']}", f"{result['simulated_s']:.3f} s",
                      f"{result['bare_s']:.3f} s", f"{result['ratio']:.2f}x",
                      f"<= {result['target_ratio']}x", "yes" if result["ratio"] <= result["target_ratio"] else "NO")
    table.add_row(f"{memory['what']}, N={memory['n']} ({memory['seconds']:.1f} s)",
                  f"{memory['peak_rss_mb']:.0f} MB", f"(S alone: {memory['naive_S_would_be_mb']:.0f} MB)", "-",
                  f"< {memory['target_mb']} MB", "yes" if memory["peak_rss_mb"] < memory["target_mb"] else "NO")
    console.print(table)
    if output is not None:
        results = {"command": "simflash bench" + (f" --repeat {repeat}" if repeat != 5 else ""),
                   "machine": {"python": platform.python_version(), "numpy": np.__version__,
                               "processor": platform.machine()},
                   "results": [flash, naive, memory]}
        output.write_text(json.dumps(results, indent=2) + "\n")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
