"""Analysis commands: `roofline`, `amdahl`, `report`, `footprint`, `sweep`.

Every number printed comes from the closed-form traffic model, the simulator or the GPU spec table.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from simflash.commands import JSON_HELP, make_console, print_json, user_errors
from simflash.config import DEFAULT_GPU, GPUS, STORAGE_DTYPE_NAMES, STORAGE_DTYPES, GiB, KiB, MiB, check_choice
from simflash.model.amdahl import QUOTED_FLOP_SHARE, SENSITIVITY_F_TIME, attention_flop_share, project, sensitivity
from simflash.model.footprint import fused_footprints, intermediate_footprints, short_sequence
from simflash.model.report import attribute, builtin_scenarios, load_scenario, render_report
from simflash.model.roofline import (
    INTENSITY_MODELS,
    LECTURE_DTYPE,
    SWEEP_N,
    conclusion,
    crossings_by_d,
    gpu_roofs,
    intensity_table,
    lecture_readings,
    plot_roofline,
    roof,
    verdicts,
)
from simflash.model.sweep import (
    CONDITIONS,
    SWEEP_SRAM_BYTES,
    local_slopes,
    plot_sweep,
    traffic_vs_n,
    traffic_vs_sram,
)
from simflash.model.traffic import FLASH_TRAFFIC

GPU_HELP = f"GPU from the spec table: {', '.join(GPUS)}."
DTYPE_HELP = f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}."
VARIANT_HELP = f"Tiled variant for the tiled logical model: {', '.join(FLASH_TRAFFIC)}."
ROOFLINE_D = (64, 128, 256)
SWEEP_SRAM_KIB = tuple(size // KiB for size in SWEEP_SRAM_BYTES)
EXTRA_ARGS = {"allow_extra_args": True}  # for `--d 64 128 256`: see _with_extras


INTS = "<int>[,<int>...]"  # how the integer-list options show in --help


def _list_help(what: str, option: str, default: Sequence[int]) -> str:
    return (f"{what}: --{option} 1,2 or --{option} 1 --{option} 2 (or --{option} 1 2 when it is the only list "
            f"given; default {','.join(map(str, default))}).")


def _ints(option: str, values: Sequence[str]) -> list[int]:
    """Integers from repeated and/or comma-separated option values."""
    out = []
    for value in values:
        for item in str(value).split(","):
            try:
                out.append(int(item))
            except ValueError:
                raise typer.BadParameter(f"expected integers, got {item!r}", param_hint=f"--{option}") from None
    return out


def _with_extras(ctx: typer.Context, lists: dict[str, list[str]]) -> dict[str, list[str]]:
    """Let `--d 64 128 256` work: stray arguments continue the one list option given on the command line."""
    if not ctx.args:
        return lists
    given = [name for name in lists if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
    if len(given) != 1:
        raise typer.BadParameter(
            f"unexpected argument(s) {' '.join(ctx.args)}: give several values as "
            + " or ".join(f"--{name.replace('_', '-')} 1,2" for name in lists))
    return {**lists, given[0]: [*lists[given[0]], *ctx.args]}


def as_dict(value) -> dict:
    from simflash.commands import as_data

    return as_data(value)


def _print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
                 left: int = 1) -> None:
    """A title line (never wrapped to the table's width), then the table; the first `left` columns are text."""
    if title:
        console.print(title)
    table = Table()
    for k, column in enumerate(columns):
        table.add_column(column, justify="left" if k < left else "right")
    for row in rows:
        table.add_row(*map(str, row))
    console.print(table)


def _size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the value >= 1 (MiB below 1 GiB, as the lesson writes)."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:,.2f} {name}"
    return f"{nbytes:,} B"


def roofline(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option(help=GPU_HELP + " Its ridge drives the conclusion and the plot.")] = DEFAULT_GPU,
    d: Annotated[list[str] | None, typer.Option("--d", metavar=INTS, help=_list_help("Head dimensions", "d", ROOFLINE_D))] = None,
    n: Annotated[list[str] | None, typer.Option("--n", metavar=INTS, help=_list_help("Sequence lengths", "n", SWEEP_N))] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float16",
    block_q: Annotated[int, typer.Option(help="Query tile rows B_r of the tiled logical model.")] = 128,
    block_kv: Annotated[int, typer.Option(help="KV tile rows B_c of the tiled logical model.")] = 64,
    variant: Annotated[str, typer.Option(help=VARIANT_HELP)] = "fa2",
    plot: Annotated[pathlib.Path | None, typer.Option(help="Write the roofline plot here (.png or .svg).")] = None,
    plot_d: Annotated[int, typer.Option(help="Head dimension of the plot's markers.")] = 128,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Arithmetic intensity of naive and FlashAttention against each GPU's ridge point."""
    lists = _with_extras(ctx, {"d": d or list(map(str, ROOFLINE_D)), "n": n or list(map(str, SWEEP_N))})
    console = make_console()
    with user_errors():
        rows = intensity_table(_ints("n", lists["n"]), _ints("d", lists["d"]), dtype, block_q, block_kv, variant)
        chosen = roof(gpu, dtype)
        roofs = gpu_roofs(dtype)
        lecture_n = max(row.n for row in rows)
        readings = lecture_readings((64, 128), lecture_n)
        lecture_roof = roof(gpu, LECTURE_DTYPE)
        path = plot_roofline(plot, gpu, plot_d, dtype, block_q=block_q, block_kv=block_kv,
                             variant=variant) if plot else None
    if as_json:
        print_json({"dtype": dtype, "block_q": block_q, "block_kv": block_kv, "variant": variant,
                    "models": {name: {"label": m.label, "level": m.level, "describes": m.describes}
                               for name, m in INTENSITY_MODELS.items()}, "gpus": [{**as_dict(r), "ridge": {lvl: r.ridge(lvl) for lvl in r.bytes_per_s}}
                                                          for r in roofs],
                    "rows": [{**as_dict(row), "intensity": {m: row.intensity(m) for m in INTENSITY_MODELS}}
                             for row in rows],
                    "conclusion": conclusion(rows, chosen), "lecture_readings": readings,
                    "plot": None if path is None else str(path)})
        return

    console.print("FLOPs per head = 4 N^2 d (the two matmuls). Bytes by model, and the memory level each describes:")
    _print_table(console, "", ("model", "level", "what its bytes describe"),
                 [(m.label, m.level, m.describes) for m in INTENSITY_MODELS.values()], left=3)
    _print_table(
        console,
        f"GPUs ({dtype}; peak, dense; L2 bandwidth is an estimate)",
        ("GPU", "peak TFLOP/s", "HBM TB/s", "HBM ridge FLOP/B", "L2 TB/s (est.)", "L2 ridge FLOP/B", "L2 size"),
        [(r.name, f"{r.peak_flops / 1e12:g}", f"{r.bytes_per_s['HBM'] / 1e12:g}", f"{r.ridge('HBM'):.0f}",
          f"{r.bytes_per_s['L2'] / 1e12:g}", f"{r.ridge('L2'):.0f}", _size(GPUS[r.gpu].l2_bytes)) for r in roofs],
    )
    _print_table(
        console,
        f"Arithmetic intensity (FLOP/byte), {dtype}, tiled logical with B_r={block_q}, B_c={block_kv}, {variant}",
        ("N", "d", *(f"{m.label} I" for m in INTENSITY_MODELS.values())),
        [(row.n, row.d, *(f"{row.intensity(name):.1f}" for name in INTENSITY_MODELS)) for row in rows], left=0,
    )
    console.print("Against each GPU (intensity models on the ridge of their own level):")
    for r in roofs:
        phrases = "; ".join(f"{m.label} {crossings_by_d(rows, name, r.ridge(m.level))}"
                            for name, m in INTENSITY_MODELS.items())
        console.print(f"  {r.name} (HBM ridge {r.ridge('HBM'):.0f}, L2 ridge {r.ridge('L2'):.0f}): {phrases}.")
    console.print(f"\nConclusion: {conclusion(rows, chosen)}")
    _print_table(
        console,
        f"\nThe roofline lecture read two ways ({LECTURE_DTYPE}, as the lecture; both readings computed)",
        ("quantity", "source", "how", "value"),
        [(t.quantity, r.source, r.how, f"{r.value:.1f}") for t in readings for r in t.readings], left=3,
    )
    for t in readings:
        console.print(f"Note: {t.note}")
    for d_lecture in (64, 128):
        console.print(f"  d={d_lecture}: {verdicts(d_lecture, lecture_roof, lecture_n)}.")
    if path is not None:
        console.print(f"Plot written to {path}")


def amdahl(
    f_time: Annotated[float, typer.Option(help="Measured time share of the part that gets faster, in [0, 1].")],
    kernel_speedup: Annotated[float, typer.Option(help="Speedup of that part (the kernel), > 0.")],
    sensitivity_f: Annotated[list[float] | None, typer.Option(
        "--sensitivity", help="Time shares of the sensitivity table, repeat the option "
                              f"(default {', '.join(map(str, SENSITIVITY_F_TIME))}).")] = None,
    flop_share: Annotated[float, typer.Option(
        help="A quoted FLOP share of attention to contrast; the default is the lesson's, at P = 2,048.")
    ] = QUOTED_FLOP_SHARE,
    params: Annotated[float, typer.Option(help="Model parameters, for the counted FLOP share.")] = 8.0e9,
    layers: Annotated[int, typer.Option(help="Layers, for the counted FLOP share.")] = 32,
    heads: Annotated[int, typer.Option(help="Query heads, for the counted FLOP share.")] = 32,
    head_dim: Annotated[int, typer.Option(help="Head dimension, for the counted FLOP share.")] = 128,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length P, for the counted FLOP share.")] = 2048,
    causal: Annotated[bool, typer.Option(help="Causal attention, for the counted FLOP share.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Amdahl's law on a time share: speedup, latency cut, sensitivity, and why a FLOP share misleads."""
    console = make_console()
    with user_errors():
        main = project(f_time, kernel_speedup)
        table = sensitivity(kernel_speedup, sensitivity_f or SENSITIVITY_F_TIME)
        counted = attention_flop_share(prompt_tokens, params, layers, heads, head_dim, causal)
        by_share = [
            ("time share", "measured (--f-time)", main),
            ("FLOP share", "quoted (--flop-share)", project(flop_share, kernel_speedup)),
            ("FLOP share", f"counted: 2 x {params:g} params per token + {'causal' if causal else 'unmasked'} "
                           f"QK^T, PV; {layers} layers x {heads} heads x d={head_dim}, P={prompt_tokens}",
             project(counted.share, kernel_speedup)),
        ]
    if as_json:
        print_json({"f_time": f_time, "kernel_speedup": kernel_speedup, "projection": main, "sensitivity": table,
                    "by_share": [{"share": kind, "source": source, "projection": p} for kind, source, p in by_share],
                    "counted_flop_share": counted})
        return
    s = kernel_speedup
    console.print(f"speedup = 1 / ((1 - {f_time:g}) + {f_time:g} / {s:g}) = 1 / {1 / main.speedup:.6f} "
                  f"= {main.speedup:.3f}x")
    console.print(f"latency reduction = 1 - 1 / {main.speedup:.3f} = {main.latency_reduction:.2%}")
    _print_table(console, f"Sensitivity: the same {s:g}x kernel at other time shares",
                 ("f_time", "speedup", "latency reduction"),
                 [(f"{p.f_time:.0%}", f"{p.speedup:.3f}x", f"{p.latency_reduction:.2%}") for p in table], left=0)
    _print_table(console, f"FLOP share vs time share, same {s:g}x kernel", ("share", "source", "f", "speedup",
                                                                          "latency reduction"),
                 [(kind, source, f"{p.f_time:.2%}", f"{p.speedup:.3f}x", f"{p.latency_reduction:.2%}")
                  for kind, source, p in by_share], left=2)
    console.print("Softmax, masking and memory stalls cost time but few FLOPs: a FLOP share cannot stand in for "
                  "the measured time share.")


def report(
    scenario: Annotated[str, typer.Argument(
        help=f"A .toml/.yaml/.yml scenario file, or a built-in one: {', '.join(builtin_scenarios())}.")],
    output: Annotated[pathlib.Path | None, typer.Option(help="Write the Markdown report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the attribution's numbers as JSON instead of "
                                                         "the Markdown report.")] = False,
) -> None:
    """One-page latency attribution report (Markdown) for a serial-trace scenario."""
    with user_errors():
        loaded = load_scenario(scenario)
        if as_json:
            print_json(attribute(loaded))
            return
        text = render_report(loaded)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"Report written to {output}")


def footprint(
    n: Annotated[int, typer.Option(help="Sequence length N.")] = 4096,
    d: Annotated[int, typer.Option(help="Head dimension (the fused kernel's tiles).")] = 128,
    heads: Annotated[int, typer.Option(help="Attention heads per layer.")] = 32,
    layers: Annotated[int, typer.Option(help="Layers.")] = 32,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float16",
    short_n: Annotated[int, typer.Option(help="The short sequence to hold against the L2 sizes.")] = 256,
    block_q: Annotated[int, typer.Option(help="Query tile rows B_r of the fused kernel.")] = 128,
    block_kv: Annotated[int, typer.Option(help="KV tile rows B_c of the fused kernel.")] = 64,
    gpu: Annotated[str, typer.Option(help=GPU_HELP + " Its carve-out bounds the fused kernel's tiles.")] = DEFAULT_GPU,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Memory footprints with their scopes: per head, one layer, training retention; fused; short N vs L2."""
    console = make_console()
    with user_errors():
        naive = intermediate_footprints(n, heads, layers, dtype)
        fused = fused_footprints(n, d, block_q, block_kv, check_choice("dtype", dtype, STORAGE_DTYPE_NAMES), gpu)
        fits = short_sequence(short_n, dtype)
    if as_json:
        print_json({"n": n, "d": d, "dtype": dtype, "naive": naive, "fused": fused, "short_n": short_n,
                    "short_sequence": fits})
        return
    columns = ("scope", "assumption", "footprint", "bytes")
    _print_table(console, f"Naive baseline: S and P, N={n}, {dtype}", columns,
                 [(f.scope, f.assumption, _size(f.size_bytes), f"{f.size_bytes:,}") for f in naive], left=2)
    console.print("These are conditional illustrations, not a memory plan: heads run one after another, or "
                  "a reused block, bring the live footprint down to one head's or lower.")
    _print_table(console, f"Fused kernel instead: d={d}, B_r={block_q}, B_c={block_kv}, {dtype} (one simulated CTA)",
                 columns, [(f.scope, f.assumption, _size(f.size_bytes), f"{f.size_bytes:,}") for f in fused], left=2)
    s_bytes = fits[0].s_bytes
    _print_table(
        console,
        f"Short sequence: one head's S at N={short_n}, {dtype} = {s_bytes / MiB:.3f} MiB ({s_bytes:,} B)",
        ("GPU", "L2 size", "S / L2", "fits"),
        [(GPUS[f.gpu].name, _size(f.l2_bytes), f"{f.fraction_of_l2:.3%}", "yes" if f.fits else "no") for f in fits],
    )
    console.print("Fitting is not hitting: L2 is shared with weights, KV and other CTAs; measure DRAM bytes "
                  "(dram__bytes_read.sum) before assuming the round-trips vanished.")


def sweep(
    ctx: typer.Context,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    n: Annotated[list[str] | None, typer.Option("--n", metavar=INTS, help=_list_help("Sequence lengths", "n", SWEEP_N))] = None,
    sram_kib: Annotated[list[str] | None, typer.Option(
        "--sram-kib", metavar=INTS, help=_list_help("SRAM capacities M in KiB", "sram-kib", SWEEP_SRAM_KIB))] = None,
    n_for_sram: Annotated[int, typer.Option(help="Sequence length of the sweep over M.")] = 4096,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float16",
    block_q: Annotated[int, typer.Option(help="Query tile rows B_r of the sweep over N.")] = 128,
    block_kv: Annotated[int, typer.Option(help="KV tile rows B_c of the sweep over N.")] = 64,
    plot: Annotated[pathlib.Path | None, typer.Option(help="Write the three-panel plot here (.png or .svg).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """HBM traffic vs N (each masking condition against its own baseline) and vs SRAM capacity M."""
    lists = _with_extras(ctx, {"n": n or list(map(str, SWEEP_N)),
                               "sram_kib": sram_kib or list(map(str, SWEEP_SRAM_KIB))})
    console = make_console()
    variants = list(FLASH_TRAFFIC)
    with user_errors():
        ns = _ints("n", lists["n"])
        sizes = [kib * KiB for kib in _ints("sram-kib", lists["sram_kib"])]
        by_condition = {causal: traffic_vs_n(ns, d, causal, dtype, block_q, block_kv) for causal in CONDITIONS}
        m_points = traffic_vs_sram(sizes, n_for_sram, d, False, dtype)
        path = plot_sweep(plot, ns, sizes, d, dtype, block_q, block_kv, n_for_sram) if plot else None
    if as_json:
        print_json({"d": d, "dtype": dtype, "block_q": block_q, "block_kv": block_kv, "n_for_sram": n_for_sram,
                    "vs_n": {"causal" if causal else "unmasked": points for causal, points in by_condition.items()},
                    "vs_sram": [{**as_dict(p), "slope": {v: local_slopes(m_points, v)[k] for v in variants}}
                                for k, p in enumerate(m_points)],
                    "plot": None if path is None else str(path)})
        return

    for causal, points in by_condition.items():
        mask = "causal" if causal else "unmasked"
        baseline = "naive causal (exact triangle)" if causal else "naive"
        extra = ("naive causal (idealized N^2/2)",) if causal else ()
        _print_table(
        console,
            f"{mask.capitalize()}: HBM traffic per head (MiB), d={d}, {dtype}, B_r={block_q}, B_c={block_kv}; "
            f"reductions against the {mask} baseline only",
            ("N", baseline, *extra, *(f"{v}" for v in variants), *(f"{v} vs {mask} naive" for v in variants)),
            [(p.n, f"{p.baseline_bytes / MiB:,.2f}",
              *((f"{p.idealized_baseline_bytes / MiB:,.2f}",) if p.idealized_baseline_bytes is not None else ()),
              *(f"{p.bytes_by_variant[v] / MiB:,.2f}" for v in variants),
              *(f"{p.reduction(v):.2f}x" for v in variants)) for p in points],
            left=0,
        )
    slopes = {v: local_slopes(m_points, v) for v in variants}
    _print_table(
        console,
        f"Against SRAM capacity M: unmasked, N={n_for_sram}, d={d}, {dtype}; B_c = ceil(M/4d), "
        f"B_r = min(ceil(M/4d), d) (FA-1 Algorithm 1); naive is {m_points[0].baseline_bytes / MiB:,.2f} MiB at any M",
        ("M (KiB)", "M (elements)", "B_r", "B_c",
         *(f"{v} MiB" for v in variants), *(f"{v} x M/(b N^2 d^2)" for v in variants),
         *(f"{v} slope" for v in variants)),
        [(f"{p.sram_bytes / KiB:g}", p.m_elements, p.block_q, p.block_kv,
          *(f"{p.bytes_by_variant[v] / MiB:,.2f}" for v in variants),
          *(f"{p.scaled(v):.2f}" for v in variants),
          *("-" if slopes[v][k] is None else f"{slopes[v][k]:+.2f}" for v in variants))
         for k, p in enumerate(m_points)],
        left=0,
    )
    console.print("A constant bytes x M/(b N^2 d^2) and a log-log slope near -1 are the Theta(N^2 d^2 / M) "
                  "behaviour; a slope near 0 means the tiles stopped growing (B_r capped at d).")
    if path is not None:
        console.print(f"Plot written to {path}")


def register(app: typer.Typer) -> None:
    """Add this group's commands to the simflash app."""
    app.command("roofline", context_settings=EXTRA_ARGS)(roofline)
    app.command("amdahl")(amdahl)
    app.command("report")(report)
    app.command("footprint")(footprint)
    app.command("sweep", context_settings=EXTRA_ARGS)(sweep)
