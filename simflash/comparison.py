"""The comparison `simflash run` prints: naive attention and every tiled variant, unmasked and causal, on
one set of random inputs. Each run's measured HBM ledger is held against its matched baseline (naive in
the same masking condition) and its closed form, and its output against float64 attention; the
derived numbers of the tables (idealised causal baseline, output and state traffic, FLOPs beyond the
matmuls) are computed here, and the command only renders them."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from simflash.api import VARIANTS, OAccumDtype, flash_attention, naive_attention
from simflash.config import StorageDtypeName, check_positive_int, storage_dtype
from simflash.memory import Flow, Traffic
from simflash.model.flops import flops_by_kind
from simflash.model.traffic import flash_traffic, idealized_causal_naive_traffic, kv_passes, naive_traffic
from simflash.numerics import reference_attention, relative_error, within_tolerance

INPUTS = ("Q", "K", "V")  # what every algorithm reads; the rest of a tiled ledger is its output and state


@attrs.frozen
class Row:
    """One measured configuration of the comparison (or the idealised causal baseline, a model only)."""

    name: str
    algorithm: str
    causal: bool
    traffic: Traffic
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
        """Bytes of the matched baseline over this row's bytes."""
        return self.baseline_bytes / self.traffic.total_bytes

    @property
    def non_matmul_flops(self) -> int:
        """The elementwise work (exp, fp32, div): all but the tensor-core matmuls."""
        return sum(v for k, v in self.flops_by_kind.items() if k != "tensor")

    def to_dict(self) -> dict:
        return {
            "name": self.name, "algorithm": self.algorithm, "causal": self.causal,
            "traffic": self.traffic.to_dict(), "reduction_vs_matched_baseline": self.reduction,
            "model_matches": self.model_matches, "relative_error": self.error,
            "naive_relative_error": self.naive_error, "passed": self.passed,
            "flops_by_kind": self.flops_by_kind, "s_overflow": self.overflow,
        }


@attrs.frozen
class Comparison:
    """The rows of one comparison with the configuration that produced them."""

    n: int
    d: int
    dtype: StorageDtypeName
    block_q: int
    block_kv: int
    heads: int
    seed: int
    fa1_o_accum: OAccumDtype  # the dtype FA-1 keeps its running O in between KV tiles
    write_logsumexp: bool
    rows: tuple[Row, ...]

    @property
    def passed(self) -> bool:
        """Every row within its dtype's tolerance and equal to its closed form (model rows aside)."""
        return all(r.passed is not False and r.model_matches is not False for r in self.rows)

    @property
    def idealised(self) -> Row:
        """The lesson's causal naive baseline, N^2/2 entries of S and P: a model row."""
        return next(r for r in self.rows if r.model_matches is None)

    def versus_idealised(self) -> list[tuple[Row, float]]:
        """Each causal tiled row with the idealised causal naive baseline's bytes over its own."""
        total = self.idealised.traffic.total_bytes
        return [(r, total / r.traffic.total_bytes) for r in self.rows if r.causal and r.algorithm != "naive"]

    def output_and_state_traffic(self) -> list[tuple[Row, dict[str, Flow]]]:
        """What each unmasked tiled variant moves besides its inputs (FA-1: its O, l, m round trips)."""
        return [(r, {t: f for t, f in r.traffic.by_tensor.items() if t not in INPUTS})
                for r in self.rows if r.algorithm != "naive" and not r.causal]

    def flops_versus_naive(self) -> list[tuple[Row, float]]:
        """Each measured row with its non-matmul FLOPs over naive's in the same masking condition."""
        measured = [r for r in self.rows if r.flops_by_kind]
        naive = {r.causal: r for r in measured if r.algorithm == "naive"}
        return [(r, r.non_matmul_flops / naive[r.causal].non_matmul_flops) for r in measured]

    @property
    def naive_kernels(self) -> dict[str, Flow]:
        """Unmasked naive's traffic by kernel (QKᵀ GEMM, softmax, PV GEMM)."""
        return self.rows[0].traffic.by_kernel

    @property
    def kv_passes(self) -> tuple[float, float]:
        """K/V passes per head of the tiled variants: unmasked, causal."""
        return (kv_passes(self.n, self.block_q, self.block_kv),
                kv_passes(self.n, self.block_q, self.block_kv, causal=True))

    def to_dict(self) -> dict:
        return {"n": self.n, "d": self.d, "dtype": self.dtype, "block_q": self.block_q, "block_kv": self.block_kv,
                "heads": self.heads, "seed": self.seed, "fa1_o_accum_dtype": self.fa1_o_accum,
                "write_logsumexp": self.write_logsumexp, "rows": [r.to_dict() for r in self.rows]}


def compare(n: int, d: int, dtype: StorageDtypeName, block_q: int, block_kv: int, heads: int, seed: int,
            fa1_o_accum: OAccumDtype = "storage", *, write_logsumexp: bool = False,
            progress: Callable[[str], None] | None = None) -> Comparison:
    """Run naive and every tiled variant, unmasked then causal, on one set of random inputs.

    fa1_o_accum: the dtype FA-1 keeps its running O in ("storage" as the paper, "float32" as the
    released kernel). write_logsumexp: the tiled variants also write L = m + log l (as
    FlashAttention-2's kernel always does). model_matches also holds the FLOPs by kind against their
    closed form. progress, when given, is told what runs next."""
    for name, value in (("n", n), ("d", d), ("heads", heads), ("block_q", block_q), ("block_kv", block_kv)):
        check_positive_int(name, value)
    storage_dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, n, d)) for _ in range(3))
    rows: list[Row] = []
    for causal in (False, True):
        mask = "causal" if causal else "unmasked"
        if progress is not None:
            progress(f"{mask}: float64 reference")
        ref = reference_attention(q, k, v, causal=causal, dtype=dtype)
        if progress is not None:
            progress(f"{mask}: naive (3 kernels)")
        naive = naive_attention(q, k, v, causal=causal, dtype=dtype)
        naive_error = relative_error(naive.out, ref)
        baseline = naive.traffic.total_bytes
        rows.append(Row(
            f"naive, {mask}", "naive", causal, naive.traffic, baseline,
            naive.traffic == naive_traffic(n, d, dtype, causal, heads=heads)
            and naive.flops_by_kind == flops_by_kind(n, d, "naive", causal, heads=heads),
            naive_error, naive_error, within_tolerance(naive_error, dtype), naive.flops_by_kind,
            naive.overflow, naive.overflow_note,
        ))
        if causal:
            idealised = idealized_causal_naive_traffic(n, d, dtype, heads=heads)
            rows.append(Row("naive, causal, idealised N^2/2 (model)", "naive", causal, idealised,
                            idealised.total_bytes, None))
        for variant in VARIANTS:
            if progress is not None:
                progress(f"{mask}: {variant} tiled")
            o_accum: OAccumDtype = fa1_o_accum if variant == "fa1" else "storage"
            run = flash_attention(q, k, v, block_q, block_kv, causal=causal, dtype=dtype, variant=variant,
                                  trace="none", o_accum_dtype=o_accum, write_logsumexp=write_logsumexp)
            error = relative_error(run.out, ref)
            model = flash_traffic(n, d, block_q, block_kv, dtype, causal, variant, heads=heads,
                                  o_accum_dtype=o_accum, write_logsumexp=write_logsumexp)
            flops = flops_by_kind(n, d, variant, causal, block_q, block_kv, heads=heads)
            name = f"{variant} (O in float32)" if o_accum == "float32" else variant
            rows.append(Row(f"{name}, {mask}", variant, causal, run.traffic, baseline,
                            run.traffic == model and run.flops_by_kind == flops, error, naive_error,
                            within_tolerance(error, dtype), run.flops_by_kind))
    return Comparison(n, d, dtype, block_q, block_kv, heads, seed, fa1_o_accum, write_logsumexp, tuple(rows))
