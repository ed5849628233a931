"""`simflash run`: naive vs tiled attention, unmasked and causal, with the measured HBM ledgers (the
comparison is simflash.comparison's; this renders it); `simflash run --backward`: forward + backward, naive
against FlashAttention-2 (simflash.backward_comparison, rendered by simflash.commands.run_backward)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from simflash.api import O_ACCUM_DTYPES
from simflash.commands import make_console
from simflash.backward_comparison import compare_backward
from simflash.commands.run_backward import print_backward
from simflash.comparison import Comparison, compare
from simflash.config import STORAGE_DTYPE_NAMES, STORAGE_DTYPES, MiB, StorageDtypeName, check_choice
from simflash.numerics import RELATIVE_TOLERANCE


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:,.2f}"


def _print_tables(console, comparison: Comparison) -> None:
    c = comparison
    table = Table(title=f"Logical HBM traffic, N={c.n}, d={c.d}, {c.dtype}, B_r={c.block_q}, B_c={c.block_kv}, "
                        f"{c.heads} head(s) (MiB, measured by the simulator's ledger)")
    for column in ("configuration", "reads", "writes", "total", "vs matched baseline", "model = sim",
                   "rel. error", "/ naive's", "check"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in c.rows:
        baseline = "causal naive" if row.causal else "naive"
        reduction = "1.00x (baseline)" if row.algorithm == "naive" else f"{row.reduction:.2f}x vs {baseline}"
        error = "-" if row.error is None else f"{row.error:.2e}"
        versus_naive = "-" if row.versus_naive is None else f"{row.versus_naive:.2f}x"
        check = "-" if row.passed is None else ("ok" if row.passed else "FAIL")
        model = "-" if row.model_matches is None else "yes" if row.model_matches else "NO"
        table.add_row(row.name, _mib(row.traffic.read_bytes), _mib(row.traffic.write_bytes),
                      _mib(row.traffic.total_bytes), reduction, model, error, versus_naive, check)
    console.print(table)
    console.print("model = sim: the closed-form model gives the simulator's ledger byte for byte (\"-\": the row is "
                  "only a model); / naive's: the row's rel. error divided by naive's, same dtype and masking "
                  "(below 1x: more accurate than naive; \"-\" where naive's error is 0)")
    for row in c.rows:
        if row.algorithm == "naive" and row.error is not None:
            console.print(f"{row.name}: S overflow: {row.overflow_note or f'none (0 entries beyond {c.dtype})'}")
    idealised = c.idealised.traffic.total_bytes
    for row, ratio in c.versus_idealised():
        console.print(f"{row.name}: {ratio:.2f}x vs the idealised causal naive ({_mib(idealised)} MiB)")
    for row, state in c.output_and_state_traffic():
        console.print(f"{row.name}: output and state traffic " + ", ".join(
            f"{t} {_mib(f.total_bytes)} MiB" for t, f in state.items()))
    _print_flops(console, c)
    console.print(f"FA-1 keeps its running O in HBM in {c.fa1_o_accum if c.fa1_o_accum == 'float32' else c.dtype} "
                  f"(--fa1-o-accum {c.fa1_o_accum}); its ledger labels the initialisation and the first tile's read "
                  f"of the known zeros \"O (init)\", \"l (init)\", \"m (init)\": the released kernel skips them")
    kernels = Table(title="Naive, unmasked, by kernel (MiB)")
    for column in ("kernel", "reads", "writes", "total"):
        kernels.add_column(column, justify="left" if column == "kernel" else "right")
    for kernel, flow in c.naive_kernels.items():
        kernels.add_row(kernel, _mib(flow.read_bytes), _mib(flow.write_bytes), _mib(flow.total_bytes))
    console.print(kernels)
    console.print(f"rel. error = ||out - ref|| / ||ref|| against float64 attention on the same rounded inputs; "
                  f"check: within {RELATIVE_TOLERANCE[c.dtype]:g} for {c.dtype}")
    unmasked, causal = c.kv_passes
    console.print(f"K/V passes per head: unmasked {unmasked:g}, causal {causal:g}")


def _print_flops(console, comparison: Comparison) -> None:
    """The arithmetic each algorithm does, by kind: the fused kernels' extra exp, rescale and division work."""
    table = Table(title="FLOPs by kind (MFLOP; tensor = matmuls on the tensor cores, the rest elementwise)")
    for column in ("configuration", "tensor", "exp", "fp32", "div", "non-matmul", "non-matmul vs naive"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row, versus_naive in comparison.flops_versus_naive():
        table.add_row(row.name, *(f"{row.flops_by_kind[k] / 1e6:,.2f}" for k in ("tensor", "exp", "fp32", "div")),
                      f"{row.non_matmul_flops / 1e6:,.2f}", f"{versus_naive:.2f}x")
    console.print(table)


def run(
    n: Annotated[int, typer.Option(help="Sequence length N (n_q = n_kv).")] = 4096,
    d: Annotated[int, typer.Option(help="Head dimension.")] = 128,
    dtype: Annotated[str, typer.Option(help=f"HBM storage dtype: {', '.join(STORAGE_DTYPES)}.")] = "float16",
    block_q: Annotated[int, typer.Option(help="Query tile rows B_r.")] = 128,
    block_kv: Annotated[int, typer.Option(help="KV tile rows B_c.")] = 64,
    heads: Annotated[int, typer.Option(help="Number of heads (traffic sums over heads).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.", min=0)] = 0,
    fa1_o_accum: Annotated[str, typer.Option(
        "--fa1-o-accum", help="Where FA-1 keeps its running O in HBM: storage (the paper) or float32 "
                              "(the released kernel; twice O's round-trip bytes).")] = "storage",
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    write_logsumexp: Annotated[bool, typer.Option(
        "--write-logsumexp", help="Tiled variants also write the logsumexp L (FlashAttention-2's kernel always does: "
                                  "+4 bytes per query row).")] = False,
    backward: Annotated[bool, typer.Option(
        "--backward", help="Forward + backward instead: naive (P kept for the backward) against FA-2 (O and L kept, "
                           "P recomputed), traffic and FLOPs of each pass, gradients against float64. FA-2's "
                           "forward always writes L here; --fa1-o-accum and --write-logsumexp do not apply.")] = False,
    backward_block_q: Annotated[int, typer.Option(help="With --backward: the backward's query tile rows B_r.")] = 64,
    backward_block_kv: Annotated[int, typer.Option(help="With --backward: the backward's KV tile rows B_c.")] = 128,
) -> None:
    """Run naive and tiled attention (unmasked and causal) and print the lesson's traffic table."""
    storage = check_choice("dtype", dtype, STORAGE_DTYPE_NAMES)
    if backward:
        _run_backward(n, d, storage, block_q, block_kv, backward_block_q, backward_block_kv, heads, seed, as_json)
        return
    o_accum = check_choice("fa1_o_accum", fa1_o_accum, O_ACCUM_DTYPES)
    console = make_console(stderr=as_json)
    with _progress(console) as report:
        comparison = compare(n, d, storage, block_q, block_kv, heads, seed, o_accum,
                             write_logsumexp=write_logsumexp, progress=report)
    if as_json:
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        _print_tables(console, comparison)
    if not comparison.passed:
        raise typer.Exit(1)


@contextlib.contextmanager
def _progress(console) -> Iterator[Callable[[str], None]]:
    """A transient spinner that shows what runs now, as a function of its description."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda description: progress.update(task, description=description)


def _run_backward(n: int, d: int, dtype: StorageDtypeName, block_q: int, block_kv: int, backward_block_q: int,
                  backward_block_kv: int, heads: int, seed: int, as_json: bool) -> None:
    console = make_console(stderr=as_json)
    with _progress(console) as report:
        comparison = compare_backward(n, d, dtype, block_q, block_kv, backward_block_q, backward_block_kv, heads,
                                      seed, progress=report)
    if as_json:
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        print_backward(console, comparison)
    if not comparison.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
