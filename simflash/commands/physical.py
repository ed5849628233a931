"""`simflash physical`: logical against physical traffic, per kernel, from the whole-chip model.

Every number printed comes from a traffic-only run of the chip model (simflash.model.physical), or,
with --measured, from a saved Nsight Compute report or calibration result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from simflash.commands import make_console, user_errors
from simflash.config import DEFAULT_GPU, GPUS, STORAGE_DTYPES, MiB

ALGORITHMS = ("naive", "fa2")
KERNELS = ("simflash", "sdpa_flash")
CACHE_MODES = ("cold", "warm")
MEASURED_HELP = ("Compare with a measurement: an ncu CSV report of one configuration (--csv --print-units base), "
                 "a calibration JSON (benchmarks/gpu/calibration_*.json) or a profile JSON (gpu profile --save).")


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise typer.BadParameter(f"expected one of {', '.join(choices)}, got {value!r}", param_hint=f"--{option}")
    return value


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:,.2f}"


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _picture(option: str, path: Path | None) -> Path | None:
    from simflash.plots import picture_path

    if path is None:
        return None
    try:
        return picture_path(path)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=f"--{option}") from None


def physical(
    algorithm: Annotated[str, typer.Option(help="naive (three kernels: gemm_qk, softmax, gemm_pv) or fa2.")] = "fa2",
    n: Annotated[int, typer.Option(help="Query sequence length.")] = 4096,
    n_kv: Annotated[int | None, typer.Option(help="Key/value sequence length (default: --n).")] = None,
    heads: Annotated[int, typer.Option(help="Heads (batch 1).")] = 1,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    causal: Annotated[bool, typer.Option(help="Causal mask.")] = False,
    causal_variant: Annotated[str, typer.Option(help="upper_left or lower_right (when n_q != n_kv).")] = "upper_left",
    dtype: Annotated[str, typer.Option(help=f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}.")] = "float16",
    block_q: Annotated[int | None, typer.Option(help="FA-2 query tile rows B_r (default: the kernel's own).")] = None,
    block_kv: Annotated[int | None, typer.Option(help="FA-2 KV tile rows B_c (default: the kernel's own).")] = None,
    kernel: Annotated[str, typer.Option(help="FA-2 implementation modelled: simflash (our CUDA kernel) or "
                                             "sdpa_flash (FlashAttention-2 in PyTorch SDPA; a grid too small to "
                                             "fill the chip runs split-KV: two kernels).")] = "simflash",
    gpu: Annotated[str, typer.Option(help=f"GPU machine file: {', '.join(GPUS)}.")] = DEFAULT_GPU,
    cache: Annotated[str, typer.Option(help="cold (L2 flushed before every kernel, as ncu --cache-control all) "
                                            "or warm (flushed once, before the first).")] = "cold",
    measured: Annotated[Path | None, typer.Option(help=MEASURED_HELP)] = None,
    plot: Annotated[Path | None, typer.Option(help="Write per-kernel bars here (.png or .svg).")] = None,
    plot_vs_n: Annotated[Path | None, typer.Option(help="Write DRAM vs logical bytes against N (naive and FA-2; "
                                                        "--gpu, --d, --dtype apply) here (.png or .svg).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")] = False,
) -> None:
    """Logical vs physical traffic per kernel: L2 hits, DRAM bytes and time, predicted by the whole-chip model."""
    from simflash.model.measured import compare, load_measured
    from simflash.model.physical import predict

    _choice("algorithm", algorithm, ALGORITHMS)
    _choice("kernel", kernel, KERNELS)
    _choice("cache", cache, CACHE_MODES)
    plot, plot_vs_n = _picture("plot", plot), _picture("plot-vs-n", plot_vs_n)
    with user_errors():
        prediction = predict(algorithm, n, d, n_kv=n_kv, heads=heads, causal=causal, causal_variant=causal_variant,
                             dtype=dtype, block_q=block_q, block_kv=block_kv, gpu=gpu, cache=cache, kernel=kernel)
    result = prediction.to_dict()
    seen = None
    if measured is not None:
        try:
            seen, kind = load_measured(measured, prediction.config)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--measured") from None
        if not seen:
            raise typer.BadParameter(f"{measured} holds no kernels for this configuration", param_hint="--measured")
        result["kernels"] = compare(result["kernels"], seen)
        result["config"] = {**result["config"], "measured": str(measured), "measured_format": kind}
    with user_errors():
        if plot is not None or plot_vs_n is not None:
            from simflash import plots
        if plot is not None:
            plots.plot_physical(prediction, seen, plot)
        if plot_vs_n is not None:
            plots.plot_dram_vs_n(plot_vs_n, plots.DRAM_VS_N_NAIVE, plots.DRAM_VS_N_FA2, plots.DRAM_VS_N_FA2_HEADS,
                                 gpu=gpu, d=d, dtype=dtype)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    _print(result, seen is not None)
    console = make_console()
    for path in (plot, plot_vs_n):
        if path is not None:
            console.print(f"wrote {escape(str(path))}")


def _print(result: dict, with_measured: bool) -> None:
    config, kernels = result["config"], result["kernels"]
    console = make_console()
    mask = f"causal {config['causal_variant']}" if config["causal"] else "no mask"
    tiles = (f", {config['kernel']} kernel, B_r={config['block_q']}, B_c={config['block_kv']}"
             if "kernel" in config else "")
    console.print(f"{config['algorithm']}: N={config['n']}, n_kv={config['n_kv']}, H={config['heads']}, "
                  f"d={config['d']}, {config['dtype']}, {mask}{tiles}; {config['gpu']}, {config['cache']} L2")
    columns = ["kernel", "logical read", "logical write", "L2 hits", "DRAM read", "DRAM write", "dirty at end",
               "time µs", "bound", "CTAs / resident"]
    rows = [[k["kernel"], _mib(k["logical_read_bytes"]), _mib(k["logical_write_bytes"]), _mib(k["l2_hit_bytes"]),
             _mib(k["dram_read_bytes"]), _mib(k["dram_write_bytes"]), _mib(k["dirty_at_end_bytes"]),
             f"{k['time_s'] * 1e6:,.1f}", k["bound"], f"{k['ctas']:,} / {k['resident_ctas']:,}"] for k in kernels]
    if len(kernels) > 1:
        keys = ("logical_read_bytes", "logical_write_bytes", "l2_hit_bytes", "dram_read_bytes", "dram_write_bytes",
                "dirty_at_end_bytes")
        rows.append(["total", *(_mib(sum(k[key] for k in kernels)) for key in keys),
                     f"{sum(k['time_s'] for k in kernels) * 1e6:,.1f}", "", ""])
    console.print(_table("bytes in MiB, predicted", columns, rows, text_columns=(0, 8)))
    if with_measured:
        columns = ["kernel", "DRAM read", "measured", "err", "DRAM write", "measured", "err", "time µs", "measured",
                   "err"]
        rows = []
        for k in kernels:
            time = k["measured_time_s"]
            rows.append([k["kernel"], _mib(k["dram_read_bytes"]), _mib(k["measured_dram_read_bytes"]),
                         _error(k["dram_read_bytes_error"]), _mib(k["dram_write_bytes"]),
                         _mib(k["measured_dram_write_bytes"]), _error(k["dram_write_bytes_error"]),
                         f"{k['time_s'] * 1e6:,.1f}", "-" if time is None else f"{time * 1e6:,.1f}",
                         _error(k["time_s_error"])])
        console.print(f"measured: {escape(config['measured'])} ({config['measured_format']}); "
                      "err = (predicted - measured) / measured")
        console.print(_table("bytes in MiB, predicted vs measured", columns, rows, text_columns=(0,)))
    console.print("DRAM bytes are what the kernel moves while it runs (what ncu's dram__bytes counts); dirty "
                  "bytes left in the L2 at its end are written back later, outside it.")
    for note in result["notes"]:
        console.print(f"note: {escape(note)}")
    for k in kernels:
        if k["spill_write_bytes"]:
            console.print(f"{k['kernel']}'s DRAM writes include {_mib(k['spill_write_bytes'])} MiB of register "
                          "spills (the machine file's fitted figures for this kernel's compiled instantiation).")


def _table(title: str, columns: list[str], rows: list[list[str]], text_columns: tuple[int, ...]) -> Table:
    table = Table(title=escape(title), title_justify="left")
    for k, column in enumerate(columns):
        table.add_column(column, justify="left" if k in text_columns else "right", overflow="fold")
    for row in rows:
        table.add_row(*row, style="bold" if row[0] == "total" else None)
    return table


def validate(
    folder: Annotated[Path, typer.Argument(help="Folder of the sweep's {SWEEP}_{cold,warm,time}.json.")] = Path(
        "benchmarks/gpu"),
    sweep: Annotated[str, typer.Option(help="calibration (fit and held-out rows), validation, unseen, blind, "
                                            "confirm, fresh, recheck, verify, splitkv, later or lead.")] = "calibration",
    gpu: Annotated[str, typer.Option(help=f"GPU machine file: {', '.join(GPUS)}.")] = DEFAULT_GPU,
    save: Annotated[Path | None, typer.Option(help="Also write every row and the summary as JSON here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every row and the summary as JSON instead of "
                                                         "the Markdown tables.")] = False,
) -> None:
    """Predict every kernel of a measured sweep and compare with ncu: the calibration sweep's fit and
    held-out sets, or every row of another sweep."""
    from simflash.model.calibration import SWEEPS, markdown
    from simflash.model.calibration import validate as run_validation

    with user_errors():
        sweep = _choice("sweep", sweep, SWEEPS)
        for name in (f"{sweep}_cold.json", f"{sweep}_warm.json", f"{sweep}_time.json"):
            if not (folder / name).is_file():
                raise ValueError(f"FOLDER must hold {name}; {folder / name} is not a file")
        report = run_validation(folder, _choice("gpu", gpu, tuple(GPUS)), sweep)
    if save is not None:
        save.write_text(json.dumps(report, indent=1) + "\n")
    typer.echo(json.dumps(report, indent=1) if as_json else markdown(report))


def register(app: typer.Typer) -> None:
    """Add `physical` and `physical-validate` to the simflash app."""
    app.command("physical")(physical)
    app.command("physical-validate")(validate)
