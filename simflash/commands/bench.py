"""`simflash bench`: what the simulator's bookkeeping costs, measured in one run."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from simflash.commands import make_console
from simflash.bench import in_child


def bench(
    n: Annotated[int, typer.Option(help="N for the timing comparisons.")] = 4096,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    big_n: Annotated[int, typer.Option(help="N for the large run (trace='none'): time and peak memory.")] = 32768,
    physical_n: Annotated[int, typer.Option(help="N for timing the whole-chip prediction of FA-2.")] = 131072,
    physical_heads: Annotated[int, typer.Option(help="Heads for timing the whole-chip prediction.")] = 32,
    repeat: Annotated[int, typer.Option(help="Timed runs of each side (median taken).")] = 5,
    output: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of the table.")] = False,
) -> None:
    """Time the simulator against bare NumPy doing the same math, and FA-2 at large N (time, peak memory).

    Each measurement runs in a fresh child process with BLAS on one thread.
    """
    console = make_console(stderr=as_json)
    load_average = os.getloadavg()[0]  # other work on the machine slows both sides of every comparison
    with console.status("timing FA-2 simulation vs bare tiled loop"):
        flash = in_child("flash_overhead", n=n, d=d, repeat=repeat)
    with console.status("timing naive simulation vs plain NumPy attention"):
        naive = in_child("naive_overhead", n=n, d=d, repeat=repeat)
    with console.status(f"FA-2 at N={big_n} in a child process (time, peak memory)"):
        large = in_child("flash_large_run", n=big_n, d=d)
    with console.status(f"bare tiled loop at N={big_n} in a child process (time)"):
        large["bare_s"] = in_child("bare_large_run", n=big_n, d=d)["seconds"]
    with console.status(f"whole-chip prediction of FA-2 at N={physical_n}, {physical_heads} heads"):
        physical = in_child("physical_prediction_run", n=physical_n, heads=physical_heads, d=d)

    table = Table(title=f"simflash bench (NumPy {np.__version__}, Python {platform.python_version()}, "
                        "BLAS on one thread)")
    for column in ("measurement", "simflash", "bare NumPy", "ratio", "target", "met"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for result in (flash, naive):
        table.add_row(f"{result['what']}, N={result['n']}", f"{result['simulated_s']:.3f} s",
                      f"{result['bare_s']:.3f} s", f"{result['ratio']:.2f}x",
                      f"<= {result['target_ratio']}x", "yes" if result["ratio"] <= result["target_ratio"] else "NO")
    what = f"FA-2 simulation (trace='none'), N={large['n']}"
    table.add_row(f"{what}: wall time", f"{large['seconds']:.1f} s", f"{large['bare_s']:.1f} s",
                  f"{large['seconds'] / large['bare_s']:.2f}x",
                  f"< {large['target_s']} s", "yes" if large["seconds"] < large["target_s"] else "NO")
    table.add_row(f"{what}: peak resident memory, whole process", f"{large['peak_rss_mb']:.0f} MB",
                  f"(S alone: {large['naive_S_would_be_mb']:.0f} MB)", "-",
                  f"< {large['target_mb']} MB", "yes" if large["peak_rss_mb"] < large["target_mb"] else "NO")
    table.add_row(f"{physical['what']}, N={physical['n']}, H={physical['heads']}", f"{physical['seconds']:.1f} s",
                  "-", "-", f"< {physical['target_s']} s", "yes" if physical["seconds"] < physical["target_s"] else "NO")
    if not as_json:
        console.print(table)
    results = {"command": "simflash bench" + (f" --repeat {repeat}" if repeat != 5 else ""),
               "machine": {"python": platform.python_version(), "numpy": np.__version__,
                           "processor": platform.machine(), "cpus": os.cpu_count(),
                           "load_average_at_start": load_average, "blas_threads": 1},
               "results": [flash, naive, large, physical]}
    if as_json:
        print(json.dumps(results, indent=2))
    if output is not None:
        output.write_text(json.dumps(results, indent=2) + "\n")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
