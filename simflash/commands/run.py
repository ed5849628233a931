"""`simflash run`: naive vs tiled attention, unmasked and causal, with the measured HBM ledgers;
`simflash run --backward`: forward + backward, naive against FlashAttention-2 (simflash.commands.run_backward)."""

from __future__ import annotations

import json
from typing import Annotated

import attrs
import numpy as np
import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import simflash as sf
from simflash.commands import make_console
from simflash.commands.run_backward import compare_backward, print_backward
from simflash.algorithms import FLASH_ALGORITHMS
from simflash.config import MiB, STORAGE_DTYPES, check_positive_int, storage_dtype
from simflash.model.footprint import backward_retention
from simflash.numerics import RELATIVE_TOLERANCE, reference_attention, relative_error, within_tolerance


@attrs.frozen
class Row:
    """One measured configuration of the comparison table."""

    name: str
    algorithm: str
    causal: bool
    traffic: sf.Traffic
    baseline_bytes: int  # total bytes of the matched baseline (same masking condition)
    model_matches: bool | None  # the closed-form model gives the same ledger, byte for byte (None: a model row)
    error: float | None = None  # relative error vs the float64 reference
    naive_error: float | None = None  # naive's error in the same dtype and masking condition
    passed: bool | None = None  # within the storage dtype's tolerance
    flops_by_kind: dict[str, int] = attrs.field(factory=dict)  # measured; the closed form is checked equal
    overflow: int = 0  # naive: entries of S beyond the storage dtype's range (stored as inf: output NaN)
    overflow_note: str = ""

    @property
    def versus_naive(self) -> float | None:
        """rel. error / naive's rel. error (same dtype and masking); None where either is missing or naive's is 0."""
        if self.error is None or not self.naive_error:
            return None
        return self.error / self.naive_error

    @property
    def reduction(self) -> float:
        return self.baseline_bytes / self.traffic.total_bytes

    def to_dict(self) -> dict:
        return {
            "name": self.name, "algorithm": self.algorithm, "causal": self.causal,
            "traffic": self.traffic.to_dict(), "reduction_vs_matched_baseline": self.reduction,
            "model_matches": self.model_matches, "relative_error": self.error,
            "naive_relative_error": self.naive_error, "passed": self.passed,
            "flops_by_kind": self.flops_by_kind, "s_overflow": self.overflow,
        }


def compare(n: int, d: int, dtype: str, block_q: int, block_kv: int, heads: int, seed: int,
            progress: Progress | None = None, fa1_o_accum: str = "storage", *,
            write_logsumexp: bool = False) -> list[Row]:
    """Run naive and every tiled variant, unmasked then causal, on one set of random inputs.

    fa1_o_accum: the dtype FA-1 keeps its running O in ("storage" as the paper, "float32" as the
    released kernel). write_logsumexp: the tiled variants also write L = m + log l (as
    FlashAttention-2's kernel always does). model_matches also holds the FLOPs by kind against their
    closed form."""
    for name, value in (("n", n), ("d", d), ("heads", heads), ("block_q", block_q), ("block_kv", block_kv)):
        check_positive_int(name, value)
    storage_dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, n, d)) for _ in range(3))
    rows: list[Row] = []
    for causal in (False, True):
        mask = "causal" if causal else "unmasked"
        task = progress.add_task(f"{mask}: float64 reference", total=None) if progress else None
        ref = reference_attention(q, k, v, causal=causal, dtype=dtype)

        def step(label: str) -> None:
            if progress is not None:
                progress.update(task, description=f"{mask}: {label}")

        step("naive (3 kernels)")
        naive = sf.naive_attention(q, k, v, causal=causal, dtype=dtype)
        naive_error = relative_error(naive.out, ref)
        baseline = naive.traffic.total_bytes
        rows.append(Row(
            f"naive, {mask}", "naive", causal, naive.traffic, baseline,
            naive.traffic == sf.model.naive_traffic(n, d, dtype, causal, heads=heads)
            and naive.flops_by_kind == sf.model.flops_by_kind(n, d, "naive", causal, heads=heads),
            naive_error, naive_error, within_tolerance(naive_error, dtype), naive.flops_by_kind,
            naive.overflow, naive.overflow_note,
        ))
        if causal:
            idealised = sf.model.idealized_causal_naive_traffic(n, d, dtype, heads=heads)
            rows.append(Row("naive, causal, idealised N^2/2 (model)", "naive", causal, idealised,
                            idealised.total_bytes, None))
        for variant, _ in FLASH_ALGORITHMS.items():
            step(f"{variant} tiled")
            o_accum = fa1_o_accum if variant == "fa1" else "storage"
            run = sf.flash_attention(q, k, v, block_q, block_kv, causal=causal, dtype=dtype,
                                     variant=variant, trace="none", o_accum_dtype=o_accum,
                                     write_logsumexp=write_logsumexp)
            error = relative_error(run.out, ref)
            model = sf.model.flash_traffic(n, d, block_q, block_kv, dtype, causal, variant, heads=heads,
                                           o_accum_dtype=o_accum, write_logsumexp=write_logsumexp)
            flops = sf.model.flops_by_kind(n, d, variant, causal, block_q, block_kv, heads=heads)
            name = f"{variant} (O in float32)" if o_accum == "float32" else variant
            rows.append(Row(f"{name}, {mask}", variant, causal, run.traffic, baseline,
                            run.traffic == model and run.flops_by_kind == flops, error, naive_error,
                            within_tolerance(error, dtype), run.flops_by_kind))
        if progress is not None:
            progress.update(task, description=f"{mask}: done", completed=1, total=1)
    return rows


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:,.2f}"


def _print_tables(console, rows: list[Row], n: int, d: int, dtype: str, block_q: int,
                  block_kv: int, heads: int, fa1_o_accum: str = "storage") -> None:
    table = Table(title=f"Logical HBM traffic, N={n}, d={d}, {dtype}, B_r={block_q}, B_c={block_kv}, "
                        f"{heads} head(s) (MiB, measured by the simulator's ledger)")
    for column in ("configuration", "reads", "writes", "total", "vs matched baseline", "model = sim",
                   "rel. error", "/ naive's", "check"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
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
    for row in rows:
        if row.algorithm == "naive" and row.error is not None:
            console.print(f"{row.name}: S overflow: {row.overflow_note or f'none (0 entries beyond {dtype})'}")

    idealised = next(r for r in rows if "idealised" in r.name)
    for row in rows:
        if row.causal and row.algorithm != "naive":
            console.print(f"{row.name}: {idealised.traffic.total_bytes / row.traffic.total_bytes:.2f}x "
                          f"vs the idealised causal naive ({_mib(idealised.traffic.total_bytes)} MiB)")
    for row in rows:  # what each tiled variant moves besides its inputs: FA-1's O, l, m round trips
        if row.algorithm != "naive" and not row.causal:
            state = {t: f for t, f in row.traffic.by_tensor.items() if t not in ("Q", "K", "V")}
            console.print(f"{row.name}: output and state traffic " + ", ".join(
                f"{t} {_mib(f.total_bytes)} MiB" for t, f in state.items()))
    _print_flops(console, rows)
    console.print(f"FA-1 keeps its running O in HBM in {fa1_o_accum if fa1_o_accum == 'float32' else dtype} "
                  f"(--fa1-o-accum {fa1_o_accum}); its ledger labels the initialisation and the first tile's read "
                  f"of the known zeros \"O (init)\", \"l (init)\", \"m (init)\": the released kernel skips them")
    kernels = Table(title="Naive, unmasked, by kernel (MiB)")
    for column in ("kernel", "reads", "writes", "total"):
        kernels.add_column(column, justify="left" if column == "kernel" else "right")
    for kernel, flow in rows[0].traffic.by_kernel.items():
        kernels.add_row(kernel, _mib(flow.read_bytes), _mib(flow.write_bytes), _mib(flow.total_bytes))
    console.print(kernels)
    console.print(f"rel. error = ||out - ref|| / ||ref|| against float64 attention on the same rounded inputs; "
                  f"check: within {RELATIVE_TOLERANCE[dtype]:g} for {dtype}")
    console.print(f"K/V passes per head: unmasked {sf.model.kv_passes(n, block_q, block_kv):g}, "
                  f"causal {sf.model.kv_passes(n, block_q, block_kv, causal=True):g}")


def _print_flops(console, rows: list[Row]) -> None:
    """The arithmetic each algorithm does, by kind: the fused kernels' extra exp, rescale and division work."""
    table = Table(title="FLOPs by kind (MFLOP; tensor = matmuls on the tensor cores, the rest elementwise)")
    for column in ("configuration", "tensor", "exp", "fp32", "div", "non-matmul", "non-matmul vs naive"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        if not row.flops_by_kind:
            continue  # the idealised model row
        naive = next(r for r in rows if r.algorithm == "naive" and r.causal == row.causal and r.flops_by_kind)
        extra = sum(v for k, v in row.flops_by_kind.items() if k != "tensor")
        naive_extra = sum(v for k, v in naive.flops_by_kind.items() if k != "tensor")
        table.add_row(row.name, *(f"{row.flops_by_kind[k] / 1e6:,.2f}" for k in ("tensor", "exp", "fp32", "div")),
                      f"{extra / 1e6:,.2f}", f"{extra / naive_extra:.2f}x")
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
    if backward:
        _run_backward(n, d, dtype, block_q, block_kv, backward_block_q, backward_block_kv, heads, seed, as_json)
        return
    console = make_console(stderr=as_json)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        rows = compare(n, d, dtype, block_q, block_kv, heads, seed, progress, fa1_o_accum,
                       write_logsumexp=write_logsumexp)
    if as_json:
        print(json.dumps({"n": n, "d": d, "dtype": dtype, "block_q": block_q, "block_kv": block_kv,
                          "heads": heads, "seed": seed, "fa1_o_accum_dtype": fa1_o_accum,
                          "write_logsumexp": write_logsumexp, "rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        _print_tables(console, rows, n, d, dtype, block_q, block_kv, heads, fa1_o_accum)
    if not all(r.passed is not False and r.model_matches is not False for r in rows):
        raise typer.Exit(1)


def _run_backward(n: int, d: int, dtype: str, block_q: int, block_kv: int, backward_block_q: int,
                  backward_block_kv: int, heads: int, seed: int, as_json: bool) -> None:
    console = make_console(stderr=as_json)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        rows = compare_backward(n, d, dtype, block_q, block_kv, backward_block_q, backward_block_kv, heads, seed,
                                progress)
    if as_json:
        print(json.dumps({"n": n, "d": d, "dtype": dtype, "block_q": block_q, "block_kv": block_kv,
                          "backward_block_q": backward_block_q, "backward_block_kv": backward_block_kv,
                          "heads": heads, "seed": seed, "rows": [r.to_dict() for r in rows],
                          "kept_for_backward": [attrs.asdict(f) for f in backward_retention(n, d, dtype=dtype)]},
                         indent=2))
    else:
        print_backward(console, rows, n, d, dtype, block_q, block_kv, backward_block_q, backward_block_kv, heads)
    if not all(r.passed and r.model_matches for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
