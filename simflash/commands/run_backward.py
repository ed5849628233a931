"""`simflash run --backward`: forward + backward, naive's stored P against FlashAttention-2's recomputation.

Both run on the same random inputs and output gradient, unmasked then causal. For each: the bytes the
forward keeps for the backward, forward and backward traffic from the simulator's ledger (each held
against its closed form), FLOPs by kind, and the gradients' errors against the float64 reference.
"""

from __future__ import annotations

import attrs
import numpy as np
from rich.progress import Progress
from rich.table import Table

import simflash as sf
from simflash.config import GiB, MiB, check_positive_int, storage_dtype
from simflash.model.footprint import backward_retention
from simflash.numerics import (
    RELATIVE_TOLERANCE,
    ReferenceGradients,
    fa_rule,
    max_abs_error,
    reference_attention_backward,
    relative_error,
)

GRADIENTS = ("dq", "dk", "dv")


@attrs.frozen
class BackwardRow:
    """One algorithm, one masking condition: its forward and backward, measured."""

    name: str
    algorithm: str  # "naive" or "fa2"
    causal: bool
    kept_bytes: int  # what the forward keeps in HBM for the backward: P, or O and L
    forward: sf.Traffic
    backward: sf.Traffic
    forward_flops: dict[str, int]
    backward_flops: dict[str, int]
    model_matches: bool  # forward and backward ledgers and FLOPs equal their closed forms
    errors: dict[str, float]  # max |gradient - reference|, by gradient
    naive_errors: dict[str, float]  # naive's, same dtype and masking
    passed: bool

    @property
    def total_bytes(self) -> int:
        return self.forward.total_bytes + self.backward.total_bytes

    def to_dict(self) -> dict:
        return {
            "name": self.name, "algorithm": self.algorithm, "causal": self.causal, "kept_bytes": self.kept_bytes,
            "forward": self.forward.to_dict(), "backward": self.backward.to_dict(),
            "forward_flops_by_kind": self.forward_flops, "backward_flops_by_kind": self.backward_flops,
            "model_matches": self.model_matches, "max_abs_errors": self.errors,
            "naive_max_abs_errors": self.naive_errors, "passed": self.passed,
        }


def _gradients_pass(run: sf.BackwardRun, naive: sf.BackwardRun, ref: ReferenceGradients, dtype: str) -> bool:
    """naive, and any run in float32: each gradient's relative error within the dtype's tolerance;
    FA-2 in 16 bits: FlashAttention's rule against naive, each gradient (slack: its absolute terms)."""
    if run is naive or dtype == "float32":
        return all(relative_error(getattr(run, g), getattr(ref, g)) <= RELATIVE_TOLERANCE[dtype] for g in GRADIENTS)
    return all(fa_rule(getattr(run, g), getattr(naive, g), getattr(ref, g), getattr(ref, f"{g}_terms"))
               for g in GRADIENTS)


def compare_backward(n: int, d: int, dtype: str, block_q: int, block_kv: int, backward_block_q: int,
                     backward_block_kv: int, heads: int, seed: int,
                     progress: Progress | None = None) -> list[BackwardRow]:
    """naive and FA-2, forward then backward, unmasked then causal, on one set of random inputs."""
    for name, value in (("n", n), ("d", d), ("heads", heads), ("block_q", block_q), ("block_kv", block_kv),
                        ("backward_block_q", backward_block_q), ("backward_block_kv", backward_block_kv)):
        check_positive_int(name, value)
    storage_dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((heads, n, d)) for _ in range(4))
    task = progress.add_task("backward", total=None) if progress else None
    rows = []

    def step(description: str) -> None:
        if progress is not None and task is not None:
            progress.update(task, description=description)

    for causal in (False, True):
        mask = "causal" if causal else "unmasked"
        step(f"{mask}: float64 reference gradients")
        ref = reference_attention_backward(q, k, v, do, causal=causal, dtype=dtype)
        step(f"{mask}: naive forward + backward")
        naive = sf.naive_attention_backward(q, k, v, do, causal=causal, dtype=dtype)
        step(f"{mask}: fa2 forward + backward")
        flash = sf.flash_attention_backward(q, k, v, do, backward_block_q, backward_block_kv, causal=causal,
                                            dtype=dtype, forward_block_q=block_q, forward_block_kv=block_kv)
        models = {
            "naive": (sf.model.naive_traffic(n, d, dtype, causal, heads=heads),
                      sf.model.naive_backward_traffic(n, d, dtype, causal, heads=heads),
                      sf.model.flops_by_kind(n, d, "naive", causal, heads=heads),
                      sf.model.backward_flops_by_kind(n, d, "naive", causal, heads=heads)),
            "fa2": (sf.model.flash_traffic(n, d, block_q, block_kv, dtype, causal, heads=heads, write_logsumexp=True),
                    sf.model.flash_backward_traffic(n, d, backward_block_q, backward_block_kv, dtype, causal,
                                                    heads=heads),
                    sf.model.flops_by_kind(n, d, "fa2", causal, block_q, block_kv, heads=heads),
                    sf.model.backward_flops_by_kind(n, d, "fa2", causal, backward_block_q, backward_block_kv,
                                                    heads=heads)),
        }
        naive_errors = {g: max_abs_error(getattr(naive, g), getattr(ref, g)) for g in GRADIENTS}
        for algorithm, run in (("naive", naive), ("fa2", flash)):
            kept = run.forward.traffic.by_tensor
            kept_bytes = (kept["P"].write_bytes if algorithm == "naive"
                          else kept["O"].write_bytes + kept["L"].write_bytes)
            measured = (run.forward.traffic, run.traffic, run.forward.flops_by_kind, run.flops_by_kind)
            rows.append(BackwardRow(
                f"{algorithm}, {mask}", algorithm, causal, kept_bytes, run.forward.traffic, run.traffic,
                run.forward.flops_by_kind, run.flops_by_kind, measured == models[algorithm],
                {g: max_abs_error(getattr(run, g), getattr(ref, g)) for g in GRADIENTS}, naive_errors,
                _gradients_pass(run, naive, ref, dtype)))
    if progress is not None and task is not None:
        progress.update(task, description="done", completed=1, total=1)
    return rows


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:,.2f}"


def print_backward(console, rows: list[BackwardRow], n: int, d: int, dtype: str, block_q: int, block_kv: int,
                   backward_block_q: int, backward_block_kv: int, heads: int) -> None:
    table = Table(title=f"Forward + backward, N={n}, d={d}, {dtype}, {heads} head(s): forward B_r={block_q}, "
                        f"B_c={block_kv}; backward B_r={backward_block_q}, B_c={backward_block_kv} "
                        f"(MiB, measured by the simulator's ledger)")
    for column in ("configuration", "kept for backward", "forward", "backward", "forward + backward",
                   "vs naive", "model = sim", "max error dq, dk, dv / naive's", "check"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        naive = next(r for r in rows if r.algorithm == "naive" and r.causal == row.causal)
        ratios = ", ".join("-" if not row.naive_errors[g] else f"{row.errors[g] / row.naive_errors[g]:.2f}"
                           for g in GRADIENTS)
        table.add_row(row.name, _mib(row.kept_bytes), _mib(row.forward.total_bytes), _mib(row.backward.total_bytes),
                      _mib(row.total_bytes), f"{naive.total_bytes / row.total_bytes:.2f}x",
                      "yes" if row.model_matches else "NO", ratios, "ok" if row.passed else "FAIL")
    console.print(table)
    console.print("kept for backward: what the forward leaves in HBM for the backward besides Q, K, V: naive's P "
                  "(N x N), FA-2's O and logsumexp L. model = sim: forward and backward ledgers and FLOPs by kind "
                  "equal their closed forms. check: naive (and float32) within the dtype's relative tolerance; "
                  "FA-2 in 16 bits at most 2x naive's max error per gradient (FlashAttention's rule)")

    flops = Table(title="FLOPs by kind (GFLOP): the backward recomputes S and P instead of reading P")
    for column in ("configuration", "tensor fwd", "tensor bwd", "exp fwd", "exp bwd", "fp32 + div fwd + bwd"):
        flops.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        elementwise = sum(f[kind] for f in (row.forward_flops, row.backward_flops) for kind in ("fp32", "div"))
        flops.add_row(row.name, *(f"{x / 1e9:,.3f}" for x in (
            row.forward_flops["tensor"], row.backward_flops["tensor"], row.forward_flops["exp"],
            row.backward_flops["exp"], elementwise)))
    console.print(flops)
    for causal in (False, True):
        naive, flash = (next(r for r in rows if r.algorithm == a and r.causal == causal) for a in ("naive", "fa2"))
        recompute = flash.backward_flops["tensor"] // 5  # S_ij = Q_i K_j^T: one of its five matmuls of 2 r c d
        console.print(
            f"{'causal' if causal else 'unmasked'}: FA-2's backward does {flash.backward_flops['tensor'] / 1e9:,.3f} "
            f"GFLOP on the tensor cores against naive's {naive.backward_flops['tensor'] / 1e9:,.3f} "
            f"({flash.backward_flops['tensor'] / naive.backward_flops['tensor'] - 1:+.0%}), "
            f"{recompute / 1e9:,.3f} of them recomputing S, and {flash.backward_flops['exp'] / 1e6:,.2f} M "
            f"exponentials recomputing P (naive's: {naive.backward_flops['exp']:,}), and moves "
            f"{_mib(naive.backward.total_bytes - flash.backward.total_bytes)} MiB less in the backward "
            f"({_mib(naive.total_bytes - flash.total_bytes)} MiB less forward + backward)")
    console.print("(naive's causal GEMMs run over the full N x N, the masked entries as zeros; FA-2 skips the "
                  "tiles no row sees)")

    kernels = Table(title="Backward by kernel, unmasked (MiB)")
    for column in ("configuration", "kernel", "reads", "writes", "total"):
        kernels.add_column(column, justify="left" if column in ("configuration", "kernel") else "right")
    for row in rows:
        if not row.causal:
            for kernel, flow in row.backward.by_kernel.items():
                kernels.add_row(row.name, kernel, _mib(flow.read_bytes), _mib(flow.write_bytes),
                                _mib(flow.total_bytes))
    console.print(kernels)
    console.print("dQ_accum in flash2_backward: the float32 addends the SM sends by atomic adds (the L2 adds them); "
                  "Algorithm 2 as written would read dQ_i and write it back for every (j, i)")

    console.print(f"Kept for the backward at the lesson's training scale (unmasked, N={n}, d={d}, {dtype}):")
    for footprint in backward_retention(n, d, dtype=dtype):
        size = (f"{footprint.size_bytes / GiB:,.1f} GiB" if footprint.size_bytes >= GiB
                else f"{footprint.size_bytes / MiB:,.2f} MiB")
        console.print(f"  {footprint.scope}: {size} ({footprint.assumption})")
