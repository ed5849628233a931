"""GPU commands: `simflash gpu info | validate | profile | bench | kernel-profile | decode-bench | sdpa-check |
sanitize | report`.

validate, profile and bench take --backward: the FA-2 backward kernels (dQ, dK, dV) instead of the forward.

All but `report` need CuPy and an NVIDIA GPU (profile: Nsight Compute's ncu; sanitize:
compute-sanitizer; bench and sdpa-check: PyTorch for SDPA). `report` prints the Markdown tables of
saved results. Every number printed comes from a run or from a saved result.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from simflash.commands import make_console, user_errors

gpu_app = typer.Typer(help="Run the FA-2 kernels and the naive path on a real GPU: check, profile, time.",
                      no_args_is_help=True)

JSON_HELP = "Print the result as JSON instead of a table."
SAVE_HELP = "Also write the result as JSON to this file."
BACKWARD_HELP = "The FA-2 backward kernels (dQ, dK, dV) instead of the forward."


def _ints(option: str, text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=f"--{option}") from None


def _command_line() -> str:
    return "simflash " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])


def _emit(result, as_json: bool, save: Path | None, tables: list) -> None:
    """Print the tables (or the JSON), and save the JSON when asked."""
    text = json.dumps(result, indent=1)
    if save is not None:
        save.write_text(text + "\n")
    if as_json:
        typer.echo(text)
        return
    console = make_console()
    for title, (headers, rows) in tables:
        table = Table(title=title)
        for header in headers:
            table.add_column(header)
        for row in rows:
            table.add_row(*row)
        console.print(table)


@gpu_app.command()
def info(as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False) -> None:
    """The GPU, the kernel configurations built for it, and what the compiler gave each default kernel."""
    from simflash.backends.kernels import Flash2Kernel, device_info, supported

    with user_errors():
        kernels = [Flash2Kernel(dtype, 128, 64, d, instrumented).resources()
                   for dtype in ("float16", "bfloat16") for d in (64, 128, 256) for instrumented in (False, True)]
        result = {"device": device_info(), "supported": supported(), "kernels": kernels}
    rows = [[k["kernel"], str(k["threads"]), str(k["registers"]), str(k["local_bytes"]), str(k["shared_bytes"])]
            for k in kernels]
    if not as_json:
        typer.echo(json.dumps(result["device"]))
    _emit(result, as_json, None, [("kernels (B_r=128, B_c=64)", (["kernel", "threads", "registers",
                                                                   "local bytes", "shared bytes"], rows))])


KERNEL_HELP = ("FA-2 kernel version(s): v1 (flash2_forward.cu), v2 (flash2_forward_v2.cu), v3 (flash2_forward_v3.cu, "
               "Hopper only), v3-nopp (v3 without ping-pong).")


def _versions(text: str) -> tuple[str, ...]:
    from simflash.backends.flash2 import VERSIONS

    versions = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [v for v in versions if v not in VERSIONS]
    if unknown or not versions:
        raise typer.BadParameter(f"expected versions from {list(VERSIONS)}, got {text!r}", param_hint="--kernel")
    return versions


@gpu_app.command()
def validate(
    suite: Annotated[str, typer.Option(help="Comma-separated: fa2 (the FA-2 grid), gqa-window (grouped-query heads "
                                            "and sliding windows), decode (Flash-Decoding).")] = "fa2,gqa-window,decode",
    quick: Annotated[bool, typer.Option(help="A few small configurations instead of the full fa2 sweep.")] = False,
    backward: Annotated[bool, typer.Option(help=BACKWARD_HELP + " Against float64 gradients, a naive "
                                                "backward in the same dtype and SDPA flash (its own grid: "
                                                "--suite does not apply).")] = False,
    seed: Annotated[int | None, typer.Option(help="Input seed (default: fresh, and recorded).", min=0)] = None,
    kernel: Annotated[str, typer.Option(help="The FA-2 kernel version to check: v1, v2, v3 or v3-nopp.")] = "v1",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """Kernel vs float64 reference vs simulator on the same inputs: errors, exact bytes, m/l trace."""
    from simflash.backends import report
    from simflash.backends import validate as checks
    from simflash.backends.kernels import device_info

    versions = _versions(kernel)
    if len(versions) != 1:
        raise typer.BadParameter(f"validate checks one version per run, got {kernel!r}", param_hint="--kernel")
    version = versions[0]
    if backward:
        if version != "v1":
            raise typer.BadParameter("--backward runs after the v1 forward (v2 writes no logsumexp)",
                                     param_hint="--kernel")
        _validate_backward(quick, seed, as_json, save)
        return
    with user_errors():
        configs, decode = checks.suite_configs(tuple(name.strip() for name in suite.split(",") if name.strip()), quick)
        device = device_info()
        if version != "v1":  # a later version runs the FA-2 grid it is built for: no windows, grouped heads, decode
            configs, decode = checks.version_configs(version, quick), []
        console = make_console(stderr=True)
        result = checks.validate(configs, seed, progress=None if as_json else
                                 lambda r: console.print(("ok  " if r["ok"] else "FAIL ") + _label(r)), decode=decode,
                                 version=version)
    result = {"command": _command_line(), "device": device, **result}
    tables = [("GPU vs float64 reference vs simulator", report.validate_table(result)),
              ("grouped-query heads and windows", report.gqa_window_table(result))]
    if "decode" in result:
        tables.append(("Flash-Decoding", report.decode_table(result)))
    _emit(result, as_json, save, tables)
    if not result["all_ok"]:
        raise typer.Exit(1)


def _validate_backward(quick: bool, seed: int | None, as_json: bool, save: Path | None) -> None:
    """`gpu validate --backward`: the three backward kernels against float64, naive and SDPA flash."""
    from simflash.backends import report_backward
    from simflash.backends import validate_backward as checks
    from simflash.backends.kernels import device_info

    with user_errors():
        device = device_info()
        configs = checks.default_configs(quick)
        console = make_console(stderr=True)
        result = checks.validate(configs, seed, progress=None if as_json else lambda r: console.print(
            ("ok  " if r["ok"] else "FAIL ") + type(configs[0])(**r["config"]).label))
    result = {"command": _command_line(), "device": device, **result}
    _emit(result, as_json, save, [("GPU backward vs float64 vs naive vs SDPA flash", report_backward.validate_table(result)),
                                  ("backward kernels", report_backward.resources_table(result))])
    if not result["all_ok"]:
        raise typer.Exit(1)


def _label(record: dict) -> str:
    from simflash.backends.validate import CheckConfig
    from simflash.backends.validate_decode import DecodeConfig

    return (DecodeConfig if "num_splits" in record else CheckConfig)(**record["config"]).label


@gpu_app.command()
def profile(
    n: Annotated[str, typer.Option(help="Sequence length(s), comma-separated.", metavar="<int>[,<int>...]")] = "4096",
    d: Annotated[int, typer.Option(help="Head dim.")] = 128,
    heads: Annotated[str, typer.Option(help="Head count(s), comma-separated.", metavar="<int>[,<int>...]")] = "32",
    causal: Annotated[bool, typer.Option(help="Causal mask (upper_left; n_q = n_kv).")] = False,
    both_masks: Annotated[bool, typer.Option(help="Profile without and with the causal mask.")] = False,
    backward: Annotated[bool, typer.Option(help=BACKWARD_HELP + " Beside SDPA flash's FA-2 backward kernels.")] = False,
    naive_max_n: Annotated[int, typer.Option(help="Profile the naive path only up to this N (S, P grow as N^2).")] = 8192,
    sweep: Annotated[bool, typer.Option(help="Profile the docs' sweep (heads 1..64, N 1024..16384, causal) "
                                             "instead of --n/--heads/--causal.")] = False,
    seed: Annotated[int, typer.Option(help="Input seed.", min=0)] = 0,
    raw_csv: Annotated[Path | None, typer.Option(help="Also keep ncu's CSV report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """Logical vs instrumented vs L2 vs DRAM bytes per kernel, under Nsight Compute (cold caches)."""
    from simflash.backends import report
    from simflash.backends.kernels import device_info
    from simflash.backends.profile import ProfileConfig, sweep_configs
    from simflash.backends.profile import profile as run_profile

    if sweep and backward:
        raise typer.BadParameter("the sweep is the forward's; profile the backward at --n/--heads", param_hint="--sweep")
    masks = (False, True) if both_masks else (causal,)
    with user_errors():
        device = device_info()
        if backward:
            from simflash.backends import report_backward, profile_backward

            backward_configs = [profile_backward.BackwardProfileConfig(size, d, h, mask)
                                for h in _ints("heads", heads) for size in _ints("n", n) for mask in masks]
            result = {"command": _command_line(), "device": device,
                      **profile_backward.profile(backward_configs, seed, raw_csv)}
        else:
            configs = sweep_configs(d) if sweep else [
                ProfileConfig(n=size, d=d, heads=h, causal=mask, naive=size <= naive_max_n)
                for h in _ints("heads", heads) for size in _ints("n", n) for mask in masks]
            result = {"command": _command_line(), "device": device, **run_profile(configs, seed, raw_csv)}
    if backward:
        tables = [("backward bytes per kernel, ours and SDPA's FA-2 (ncu, caches flushed before each kernel)",
                   report_backward.profile_table(result))]
    else:
        tables = [("bytes per kernel (ncu, caches flushed before each kernel)", report.profile_table(result)),
                  ("physical over logical", report.sweep_table(result))]
    _emit(result, as_json, save, tables)


@gpu_app.command()
def calibrate(
    cache: Annotated[str, typer.Option(help="cold (ncu flushes before every kernel), warm (one read-only "
                                            "flush before each group), or time (CUDA events, no profiler).")] = "cold",
    sweep_name: Annotated[str, typer.Option("--sweep", help="calibration (the figures are fitted on a third of "
                                                             "it), validation, unseen, blind, confirm, fresh, recheck, verify, later or lead "
                                                             "(configurations it does not hold), or splitkv (SDPA's small grids).")
                          ] = "calibration",
    limit: Annotated[int | None, typer.Option(help="Only the first LIMIT configurations (a smoke run).")] = None,
    seed: Annotated[int, typer.Option(help="Input seed.", min=0)] = 0,
    raw_csv: Annotated[Path | None, typer.Option(help="Also keep ncu's CSV report here.")] = None,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """The whole-chip model's sweeps: naive, our FA-2 and SDPA flash under Nsight Compute."""
    from simflash.backends import calibrate as sweep
    from simflash.backends.kernels import device_info

    if cache not in ("cold", "warm", "time"):
        raise typer.BadParameter(f"expected cold, warm or time, got {cache!r}", param_hint="--cache")
    if sweep_name not in sweep.SWEEPS:
        raise typer.BadParameter(f"expected one of {list(sweep.SWEEPS)}, got {sweep_name!r}", param_hint="--sweep")
    with user_errors():
        configs = sweep.SWEEPS[sweep_name]()[:limit]
        measured = sweep.time_groups(configs, seed) if cache == "time" else sweep.measure(configs, cache, seed, raw_csv)
        result = {"command": _command_line(), "device": device_info(), "sweep": sweep_name, **measured}
    text = json.dumps(result, indent=1)
    if save is not None:
        save.write_text(text + "\n")
    typer.echo(f"{len(result['configs'])} configurations measured ({cache})")


def _tiles(text: str) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(int(x) for x in shape.split("x")) for shape in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected shapes like 128x64,64x64, got {text!r}", param_hint="--tiles") from None


def _masks(causal: str) -> tuple[bool, ...]:
    masks = {"no": (False,), "yes": (True,), "both": (False, True)}
    if causal not in masks:
        raise typer.BadParameter(f"expected one of {list(masks)}, got {causal!r}", param_hint="--causal")
    return masks[causal]


def _bench_configs(n: str, d: str, heads: int, causal: str) -> list:
    from simflash.backends.bench import BenchConfig

    return [BenchConfig(size, dim, heads, mask) for dim in _ints("d", d) for size in _ints("n", n)
            for mask in _masks(causal)]


@gpu_app.command()
def bench(
    n: Annotated[str, typer.Option(help="Sequence lengths, comma-separated.", metavar="<int>[,<int>...]")] = "1024,4096,16384",
    d: Annotated[str, typer.Option(help="Head dims, comma-separated.", metavar="<int>[,<int>...]")] = "64,128",
    heads: Annotated[int, typer.Option(help="Heads (batch 1).")] = 32,
    causal: Annotated[str, typer.Option(help="no, yes or both.")] = "both",
    tiles: Annotated[str | None, typer.Option(help="FA-2 tile shapes B_rxB_c to time; the first is the headline "
                                                   "(default: 128x64; with --backward 64x128).")] = None,
    kernel: Annotated[str, typer.Option(help=KERNEL_HELP + " Comma-separated; the first is the headline.")] = "v1",
    backward: Annotated[bool, typer.Option(help=BACKWARD_HELP + " Our three kernels' total time against "
                                                "SDPA flash's backward.")] = False,
    naive_max_n: Annotated[int, typer.Option(help="Time the naive path only up to this N.")] = 16384,
    math_max_n: Annotated[int, typer.Option(help="Compare against SDPA's math backend only up to this N.")] = 4096,
    dram_from: Annotated[Path | None, typer.Option(help="A saved `gpu profile --save` result: DRAM bytes / time "
                                                       "for the configurations it measured.")] = None,
    seed: Annotated[int, typer.Option(help="Input seed.", min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """FA-2 kernel vs PyTorch SDPA flash (fp16, B=1): TFLOP/s, % of peak, bandwidth, max-abs vs math."""
    from simflash.backends import report
    from simflash.backends.bench import bench as run_bench
    from simflash.backends.bench import dram_by_config
    from simflash.backends.kernels import device_info

    versions = _versions(kernel)
    shapes = _tiles(tiles or ("64x128" if backward else "128x64"))
    if backward:
        if versions != ("v1",):
            raise typer.BadParameter("--backward times the v1 forward's backward only", param_hint="--kernel")
        _bench_backward(n, d, heads, _masks(causal), shapes, seed, as_json, save)
        return
    with user_errors():
        dram = dram_by_config(json.loads(dram_from.read_text())) if dram_from is not None else {}
        configs = _bench_configs(n, d, heads, causal)
        device = device_info()
        console = make_console(stderr=True)

        def progress(row: dict) -> None:
            c = row["config"]
            console.print(f"N={c['n']} d={c['d']} causal={c['causal']}: "
                          f"{next(iter(row['fa2'].values()))['tflops']:.1f} TFLOP/s")

        rows = run_bench(configs, seed, progress=None if as_json else progress, dram=dram, tiles=shapes,
                         naive_max_n=naive_max_n, math_max_n=math_max_n, versions=versions)
    result = {"command": _command_line(), "device": device, "rows": rows}
    _emit(result, as_json, save, [("FA-2 kernel vs SDPA flash, fp16, B=1", report.bench_table(rows)),
                                  ("FA-2 by tile shape", report.tiles_table(rows)),
                                  ("FA-2 kernel versions vs SDPA, fp16, B=1", report.versions_table(rows))])


@gpu_app.command("kernel-profile")
def kernel_profile(
    n: Annotated[str, typer.Option(help="Sequence lengths, comma-separated.", metavar="<int>[,<int>...]")] = "4096,16384",
    d: Annotated[str, typer.Option(help="Head dims, comma-separated.", metavar="<int>[,<int>...]")] = "64,128",
    heads: Annotated[int, typer.Option(help="Heads (batch 1).")] = 32,
    causal: Annotated[str, typer.Option(help="no, yes or both.")] = "both",
    kernel: Annotated[str, typer.Option(help=KERNEL_HELP + " Comma-separated.")] = "v1,v2",
    tiles: Annotated[str, typer.Option(help="The one tile shape B_rxB_c every version runs.")] = "128x64",
    seed: Annotated[int, typer.Option(help="Input seed.", min=0)] = 0,
    raw_csv: Annotated[Path | None, typer.Option(help="Also keep ncu's CSV report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """Each kernel version and SDPA flash under Nsight Compute: tensor pipe, shared memory, occupancy, time."""
    from simflash.backends import report
    from simflash.backends.kernel_profile import profile_versions
    from simflash.backends.kernels import device_info

    versions = _versions(kernel)
    shapes = _tiles(tiles)
    if len(shapes) != 1 or len(shapes[0]) != 2:
        raise typer.BadParameter(f"expected one shape like 128x64, got {tiles!r}", param_hint="--tiles")
    with user_errors():
        configs = _bench_configs(n, d, heads, causal)
        device = device_info()
        result = {"command": _command_line(), "device": device,
                  **profile_versions(configs, versions, shapes[0], seed, raw_csv)}
    _emit(result, as_json, save, [("kernel versions under ncu (caches flushed before each kernel)",
                                   report.kernel_profile_table(result))])


@gpu_app.command("decode-bench")
def decode_bench(
    quick: Annotated[bool, typer.Option(help="Only batch 1 x 8 K/V heads at 32k and 128k.")] = False,
    raw_csv: Annotated[Path | None, typer.Option(help="Also profile the Flash-Decoding kernels of a few "
                                                     "configurations under Nsight Compute; keep ncu's CSV here.")] = None,
    seed: Annotated[int, typer.Option(help="Input seed.", min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """K/V bandwidth of a decode step (one query token, 32 query / 8 K/V heads, d = 128, fp16): our FA-2
    at T_r = 1, our Flash-Decoding (heuristic and swept splits) and PyTorch SDPA, batch x K/V heads
    1..256, cache 1k..128k."""
    from simflash.backends import decode_bench as runs
    from simflash.backends import report
    from simflash.backends.kernels import device_info

    with user_errors():
        device = device_info()
        console = make_console(stderr=True)

        def progress(row: dict) -> None:
            c = row["config"]
            console.print(f"batch={c['batch']} H_kv={c['kv_heads']} n_kv={c['n_kv']}: Flash-Decoding "
                          f"{row['flash_decoding']['GBps']:.0f} GB/s, FA-2 {row['fa2_packed']['GBps']:.0f} GB/s")

        result = runs.bench(runs.bench_configs(quick), seed, progress=None if as_json else progress)
        if raw_csv is not None:
            result["profile"] = runs.profile(runs.profile_configs(), seed, raw_csv)
    result = {"command": _command_line(), "device": device, **result}
    _emit(result, as_json, save, [("K/V bandwidth of one decode step", report.decode_bench_table(result))])


def _bench_backward(n: str, d: str, heads: int, masks: tuple[bool, ...], shapes: tuple, seed: int, as_json: bool,
                    save: Path | None) -> None:
    """`gpu bench --backward`: our three backward kernels against SDPA flash's backward."""
    from simflash.backends import report_backward
    from simflash.backends.bench_backward import BackwardBenchConfig, bench
    from simflash.backends.kernels import device_info

    with user_errors():
        configs = [BackwardBenchConfig(size, dim, heads, mask) for dim in _ints("d", d) for size in _ints("n", n)
                   for mask in masks]
        device = device_info()
        console = make_console(stderr=True)

        def progress(row: dict) -> None:
            c, ours = row["config"], next(iter(row["ours"].values()))
            console.print(f"backward N={c['n']} d={c['d']} causal={c['causal']}: "
                          f"{ours.get('tflops', 0.0):.1f} TFLOP/s, {row.get('ratio_vs_sdpa_flash', 0.0):.2f}x SDPA flash")

        rows = bench(configs, seed, progress=None if as_json else progress, tiles=shapes)
    result = {"command": _command_line(), "device": device, "rows": rows}
    _emit(result, as_json, save, [("FA-2 backward (our three kernels) vs SDPA flash backward, fp16, B=1",
                                   report_backward.bench_table(rows))])


@gpu_app.command("sdpa-check")
def sdpa_check(
    n: Annotated[int, typer.Option(help="Sequence length.")] = 4096,
    d: Annotated[int, typer.Option(help="Head dim.")] = 128,
    heads: Annotated[int, typer.Option(help="Heads (batch 1).")] = 32,
    causal: Annotated[bool, typer.Option(help="is_causal=True.")] = False,
    both_masks: Annotated[bool, typer.Option(help="Check without and with the causal mask.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    save: Annotated[Path | None, typer.Option(help=SAVE_HELP)] = None,
) -> None:
    """Constrain PyTorch SDPA to one backend at a time; report the kernels the profiler saw."""
    from simflash.backends import report
    from simflash.backends.sdpa import sdpa_check as run_check

    with user_errors():
        masks = (False, True) if both_masks else (causal,)
        checks = [run_check(n, d, mask, heads) for mask in masks]
    _emit({"command": _command_line(), "checks": checks}, as_json, save,
          [("SDPA backends and the kernels they ran", report.sdpa_table(checks))])
    if any(e["verdict"] == "FALLBACK TO MATH" for check in checks for e in check["backends"]):
        raise typer.Exit(1)


@gpu_app.command()
def sanitize(
    tool: Annotated[str, typer.Option(help="compute-sanitizer tools, comma-separated (memcheck, racecheck, "
                                           "initcheck, synccheck).")] = "memcheck,racecheck",
    save: Annotated[Path | None, typer.Option(help="Write the result as JSON here (summary and every run's full "
                                                   "output), rewritten after each run.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one sanitizer run (a tool over one group of "
                                                "kernels) may take before it is killed and counted "
                                                "not clean.")] = 240.0,
) -> None:
    """compute-sanitizer over every kernel the backend ships (forward v1 and v2, Flash-Decoding's split and
    combine, the backward's preprocess, main and convert, the naive softmax), both builds, on small ragged,
    causal, windowed and grouped configurations: one line per kernel and tool, exit 1 unless all are clean."""
    from simflash.backends.sanitize import sanitize as run_all
    from simflash.backends.sanitize import summary_line

    command = _command_line()

    def after_each(record: dict, latest) -> None:
        typer.echo(f"ran {latest.tool} over {latest.group}: {'clean' if latest.clean else 'NOT CLEAN'} "
                   f"(exit {'killed at the time limit' if latest.exit_code is None else latest.exit_code})")
        if save is not None:
            save.write_text(json.dumps({"command": command, "complete": False, **record}, indent=1) + "\n")

    with user_errors():
        if save is not None:  # an unwritable path is refused before any run
            save.write_text(json.dumps({"command": command, "complete": False}, indent=1) + "\n")
        record = run_all(tool.split(","), timeout, after_each)
        if save is not None:
            save.write_text(json.dumps({"command": command, "complete": True, **record}, indent=1) + "\n")
    for entry in record["kernels"]:
        typer.echo(summary_line(entry))
    bad = sum(not entry["clean"] for entry in record["kernels"])
    typer.echo(f"{record['sanitizer']}: " + ("all clean" if not bad else f"{bad} of {len(record['kernels'])} "
                                             "(tool, kernel) pairs NOT CLEAN"))
    if bad:
        raise typer.Exit(1)


@gpu_app.command("report")
def report_command(
    folder: Annotated[Path, typer.Argument(help="Folder of saved results (validate.json, profile.json, ...).")],
    update: Annotated[Path | None, typer.Option(help="Refill the marked tables of this Markdown page instead "
                                                     "of printing them.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON (headers and rows) instead "
                                                         "of Markdown.")] = False,
) -> None:
    """Markdown tables of saved GPU results, as docs/gpu.md shows them."""
    from simflash.backends import report

    results = report.load(folder)
    if not results:
        raise typer.BadParameter(f"no saved results in {folder} (expected {', '.join(report.RESULT_FILES.values())})")
    try:
        tables = report.tables(results)
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        raise typer.BadParameter(f"a saved result in {folder} is not what `simflash gpu ... --save` writes "
                                 f"(missing or wrong field {error})", param_hint="FOLDER") from None
    if update is not None:
        update.write_text(report.update_page(update.read_text(), tables))
        return
    if as_json:
        typer.echo(json.dumps({name: {"headers": headers, "rows": rows} for name, (headers, rows) in tables.items()},
                              indent=1))
        return
    for name, table in tables.items():
        typer.echo(f"<!-- gpu-table: {name} -->\n{report.markdown(table)}\n<!-- /gpu-table -->\n")


def register(app: typer.Typer) -> None:
    """Add the `gpu` command group to the simflash app."""
    app.add_typer(gpu_app, name="gpu")

