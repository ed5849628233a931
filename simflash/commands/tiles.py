"""`simflash tiles`: the largest FA-2 tiles (B_r, B_c) that fit a GPU's shared memory and register file."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from simflash.commands import make_console, user_errors
from simflash.config import DEFAULT_GPU, KiB, STORAGE_DTYPES
from simflash.onchip import DEFAULT_KV_STAGES, tile_candidates


def tiles(
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    gpu: Annotated[str, typer.Option(help="GPU whose shared memory per CTA and register file bound the tiles.")]
    = DEFAULT_GPU,
    dtype: Annotated[str, typer.Option(help=f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}.")] = "float16",
    kv_stages: Annotated[int, typer.Option(help="K_j, V_j buffers in shared memory: 2 (the kernel's) or 1.")]
    = DEFAULT_KV_STAGES,
    as_json: Annotated[bool, typer.Option("--json", help="Print the candidates as JSON.")] = False,
) -> None:
    """For each B_r (multiples of 16): the largest B_c that fits, and which limit stops the next one."""
    with user_errors():
        report = tile_candidates(d, gpu, dtype, kv_stages)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    console = make_console()
    table = Table(title=f"FA-2 tiles on the {report.gpu}: d = {d}, {dtype}, shared memory Q_i + {kv_stages} x "
                        f"(K_j + V_j) <= {report.shared_capacity_bytes / KiB:g} KiB per CTA; registers m_i, l_i, "
                        f"a_i, S_ij in float32 over B_r / 16 warps", title_justify="left")
    for column in ("B_r", "largest B_c", "threads", "shared memory", "register state", "registers / thread",
                   "next B_c stopped by"):
        table.add_column(column, justify="left" if column == "next B_c stopped by" else "right")
    largest = report.largest
    for c in report.candidates:
        res = c.resources
        mark = " *" if largest is not None and c is largest else ""
        table.add_row(f"{c.block_q}{mark}", "none" if c.block_kv is None else str(c.block_kv),
                      str(res.threads) if res else "-",
                      f"{res.shared_bytes / KiB:g} KiB" if res else "-",
                      f"{res.register_bytes / KiB:g} KiB" if res else "-",
                      str(res.registers_per_thread) if res else "-", ", ".join(c.stopped_by))
    console.print(table)
    if largest is None:
        console.print(f"No tile of 16 x 16 fits d = {d} on the {report.gpu}.")
    else:
        console.print(f"* largest tile (most B_r x B_c): B_r = {largest.block_q}, B_c = {largest.block_kv}. "
                      "Register counts are the state's share per thread, a lower bound: the compiler adds "
                      "addresses and the Q_i fragments (`simflash gpu info` reads the real count).")


def register(app: typer.Typer) -> None:
    app.command("tiles")(tiles)
