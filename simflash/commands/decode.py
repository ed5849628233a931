"""`simflash decode`: Flash-Decoding for a model shape: FA-2's split choice, the grid and its waves, bytes
by kernel and tensor, and a predicted time, each configuration beside the same step with one split.

Every number comes from the closed forms and the time model in simflash.model.decode.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from simflash.commands import JSON_HELP, make_console, print_json
from simflash.config import DEFAULT_GPU, GPUS, STORAGE_DTYPES, MiB, check_choice, check_positive_int
from simflash.model.physical import CACHE_MODES


def _lengths(n_kv: str) -> list[int]:
    """--n-kv: one length or a comma list."""
    try:
        lengths = [int(part) for part in n_kv.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise ValueError(f"n_kv must be a positive integer or a comma list of them, such as 32768,131072, got {n_kv!r}")
    return lengths


def decode(
    batch: Annotated[int, typer.Option(help="Batch elements (sequences decoded together).")] = 1,
    heads: Annotated[int, typer.Option(help="Query heads per batch element.")] = 32,
    kv_heads: Annotated[int, typer.Option(help="K/V heads per batch element (a divisor of --heads).")] = 8,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    n_kv: Annotated[str, typer.Option(help="KV cache length, or a comma list of them.")] = "32768",
    n_q: Annotated[int, typer.Option(help="New query rows per head (1: one token per step).")] = 1,
    dtype: Annotated[str, typer.Option(help=f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}.")] = "float16",
    gpu: Annotated[str, typer.Option(help=f"GPU machine file: {', '.join(GPUS)}.")] = DEFAULT_GPU,
    num_splits: Annotated[int | None, typer.Option(help="Splits of the KV tiles (default: FlashAttention-2's "
                                                        "num_splits_heuristic).")] = None,
    block_kv: Annotated[int | None, typer.Option(help="KV tile rows (default: FA-2's by head dim).")] = None,
    pack_gqa: Annotated[bool, typer.Option("--pack-gqa/--no-pack-gqa", help="Pack a K/V head's query heads into "
                                                                            "the rows of one tile.")] = True,
    plot: Annotated[Path | None, typer.Option(help="Write predicted K/V bandwidth against batch x K/V heads "
                                                   "(1..256), one split vs the heuristic, here (.png or .svg).")]
    = None,
    cache: Annotated[str | None, typer.Option(help="Also play the GPU backend's launch of the chosen splits "
                                                   "through the whole-chip L2 model, cold (L2 flushed before each "
                                                   "kernel) or warm (once before the step), for predicted DRAM "
                                                   "bytes by kernel (d = 64 or 128, the backend's kernels).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Flash-Decoding for a model shape: splits, CTAs, waves, bytes by kernel and tensor, predicted time."""
    from simflash.model.decode import predict_decode
    from simflash.model.decode_chip import predict_decode_dram
    from simflash.plots import picture_path, plot_decode_bandwidth

    lengths = _lengths(n_kv)
    if check_positive_int("heads", heads) % check_positive_int("kv_heads", kv_heads):
        raise ValueError(f"kv_heads must divide heads (H_q = {heads}): each K/V head serves H_q / H_kv query heads, "
                         f"got {kv_heads}")
    if plot is not None:
        plot = picture_path(plot)
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, block_kv=block_kv, pack_gqa=pack_gqa,
                 dtype=dtype, gpu=gpu)
    predict = functools.partial(predict_decode, d=d, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q,
                                block_kv=block_kv, pack_gqa=pack_gqa, dtype=dtype, gpu=gpu)
    results = [(length, predict(length, num_splits=num_splits), predict(length, num_splits=1)) for length in lengths]
    if cache is not None:
        cache = check_choice("cache", cache, CACHE_MODES)
        drams = [predict_decode_dram(length, d, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q,
                                     num_splits=chosen.launch.num_splits, block_kv=chosen.launch.block_kv,
                                     pack_gqa=pack_gqa, dtype=dtype, gpu=gpu, cache=cache)
                 for length, chosen, _ in results]
    if plot is not None:
        plot_decode_bandwidth(plot, lengths, d, group=heads // kv_heads, n_q=n_q, block_kv=block_kv,
                              pack_gqa=pack_gqa, dtype=dtype, gpu=gpu)
    if as_json:
        configurations = [{"n_kv": length, "chosen": chosen.to_dict(), "one_split": one_split.to_dict()}
                          for length, chosen, one_split in results]
        if cache is not None:
            for configuration, dram in zip(configurations, drams):
                configuration["dram"] = dram.to_dict()
        print_json({"config": {"d": d, **shape, "num_splits": num_splits, "cache": cache},
                    "configurations": configurations})
        return
    console = make_console()
    for at, (length, chosen, one_split) in enumerate(results):
        _print(console, length, d, shape, chosen, one_split)
        if cache is not None:
            _print_dram(console, drams[at], cache)
    console.print("Time is a model (docs/decode.md): each kernel's DRAM bytes at the machine file's calibrated HBM "
                  "bandwidth, shared by the SMs that hold a CTA (an idle SM's share is lost), against its compute.")
    if plot is not None:
        console.print(f"wrote {escape(str(plot))}")


def _print(console, n_kv: int, d: int, shape: dict, chosen, one_split) -> None:
    launch = chosen.launch
    group = shape["heads"] // shape["kv_heads"]
    packing = (f"packed: {group * shape['n_q']} rows per K/V head" if shape["pack_gqa"] and group > 1
               else "not packed" if group > 1 else "one query head per K/V head")
    console.print(f"[bold]Flash-Decoding[/bold], batch {shape['batch']}, {shape['heads']} query heads on "
                  f"{shape['kv_heads']} K/V heads ({packing}), d = {d}, n_q = {shape['n_q']}, n_kv = {n_kv:,}, "
                  f"{shape['dtype']}; {GPUS[shape['gpu']].name}")
    how = "FlashAttention-2's heuristic" if launch.heuristic else "given"
    console.print(f"KV tiles of {launch.block_kv} (T_c = {launch.kv_tiles:,}), query tiles of {launch.block_q} "
                  f"rows; {launch.num_splits} split{'s' if launch.num_splits > 1 else ''} ({how}) of "
                  f"{launch.tiles_per_split} KV tiles; {launch.cta_slots} CTA slots ({launch.cta_slots // launch.sm_count}"
                  f" per SM x {launch.sm_count} SMs)")

    table = Table(title="launch and predicted time", title_justify="left")
    for column in ("splits", "split CTAs", "waves", "wave efficiency", "SMs busy", "combine CTAs", "time µs",
                   "K/V GB/s"):
        table.add_column(column, justify="right")
    rows = [one_split] if launch.num_splits == 1 else [one_split, chosen]
    for prediction in rows:
        split = prediction.kernels[0]
        table.add_row(f"{prediction.launch.num_splits}", f"{prediction.launch.split_ctas:,}",
                      f"{prediction.launch.waves:.2f}", f"{prediction.launch.wave_efficiency:.1%}",
                      f"{split.busy_sm_fraction:.1%}", f"{prediction.launch.combine_ctas:,}",
                      f"{prediction.time_s * 1e6:,.1f}", f"{prediction.kv_bytes_per_s / 1e9:,.0f}")
    console.print(table)

    table = Table(title=f"bytes by kernel and tensor, {launch.num_splits} split{'s' if launch.num_splits > 1 else ''}",
                  title_justify="left")
    for column in ("kernel", "tensor", "read bytes", "write bytes", "MiB"):
        table.add_column(column, justify="left" if column in ("kernel", "tensor") else "right")
    for (kernel, tensor), flow in chosen.traffic.ledger.items():
        table.add_row(kernel, tensor, f"{flow.read_bytes:,}", f"{flow.write_bytes:,}", f"{flow.total_bytes / MiB:,.2f}")
    table.add_row("total", "", f"{chosen.traffic.read_bytes:,}", f"{chosen.traffic.write_bytes:,}",
                  f"{chosen.traffic.total_bytes / MiB:,.2f}", style="bold")
    console.print(table)

    table = Table(title="predicted time by kernel", title_justify="left")
    for column in ("kernel", "CTAs", "SM rounds", "SMs busy", "DRAM µs", "compute µs", "time µs", "bound"):
        table.add_column(column, justify="left" if column in ("kernel", "bound") else "right")
    for k in chosen.kernels:
        table.add_row(k.kernel, f"{k.ctas:,}", f"{k.sm_rounds}", f"{k.busy_sm_fraction:.1%}", f"{k.dram_s * 1e6:,.1f}",
                      f"{k.compute_s * 1e6:,.1f}", f"{k.time_s * 1e6:,.1f}", k.bound)
    console.print(table)


def _print_dram(console, dram, cache: str) -> None:
    table = Table(title=f"whole-chip L2 model, {cache}: DRAM bytes by kernel (MiB)", title_justify="left")
    for column in ("kernel", "CTAs", "resident", "logical read", "L2 hits", "DRAM read", "logical write",
                   "DRAM write", "dirty at end"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for k in dram.kernels:
        f = k.flow
        table.add_row(k.kernel, f"{k.ctas:,}", f"{k.resident_ctas:,}",
                      *(f"{nbytes / MiB:,.2f}" for nbytes in (f.read_bytes, f.hit_bytes, f.dram_read_bytes,
                                                              f.write_bytes, f.dram_write_bytes,
                                                              f.dirty_at_end_bytes)))
    console.print(table)
    console.print("Dirty at end: written into the L2 and not yet back in DRAM when the kernel ends (Nsight Compute "
                  "counts no kernel for them).")


def register(app: typer.Typer) -> None:
    app.command("decode")(decode)
