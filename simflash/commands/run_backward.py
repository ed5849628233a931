"""`simflash run --backward`: renders simflash.backward_comparison's forward + backward comparison, naive's
stored P against FlashAttention-2's recomputation."""

from __future__ import annotations

from rich.table import Table

from simflash.backward_comparison import BackwardComparison, recomputed_s_flops
from simflash.config import GiB, MiB


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:,.2f}"


def print_backward(console, comparison: BackwardComparison) -> None:
    c, rows = comparison, comparison.rows
    table = Table(title=f"Forward + backward, N={c.n}, d={c.d}, {c.dtype}, {c.heads} head(s): forward B_r={c.block_q}, "
                        f"B_c={c.block_kv}; backward B_r={c.backward_block_q}, B_c={c.backward_block_kv} "
                        f"(MiB, measured by the simulator's ledger)")
    for column in ("configuration", "kept for backward", "forward", "backward", "forward + backward",
                   "vs naive", "model = sim", "max error dq, dk, dv / naive's", "check"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        ratios = ", ".join("-" if ratio is None else f"{ratio:.2f}" for ratio in row.error_ratios.values())
        table.add_row(row.name, _mib(row.kept_bytes), _mib(row.forward.total_bytes), _mib(row.backward.total_bytes),
                      _mib(row.total_bytes), f"{c.versus_naive(row):.2f}x",
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
        flops.add_row(row.name, *(f"{x / 1e9:,.3f}" for x in (
            row.forward_flops["tensor"], row.backward_flops["tensor"], row.forward_flops["exp"],
            row.backward_flops["exp"], row.elementwise_flops)))
    console.print(flops)
    for causal in (False, True):
        naive, flash = c.pair(causal)
        recompute = recomputed_s_flops(flash)
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

    console.print(f"Kept for the backward at the lesson's training scale (unmasked, N={c.n}, d={c.d}, {c.dtype}):")
    for footprint in c.kept_for_backward():
        size = (f"{footprint.size_bytes / GiB:,.1f} GiB" if footprint.size_bytes >= GiB
                else f"{footprint.size_bytes / MiB:,.2f} MiB")
        console.print(f"  {footprint.scope}: {size} ({footprint.assumption})")
