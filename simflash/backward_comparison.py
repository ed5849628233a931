"""The comparison `simflash run --backward` prints: forward + backward, naive's stored P against
FlashAttention-2's recomputation, on the same random inputs and output gradient, unmasked then causal.
For each: the bytes the forward keeps for the backward, forward and backward traffic from the
simulator's ledger (each held against its closed form), FLOPs by kind, and the gradients' errors
against the float64 reference; the command only renders them."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from simflash.backward import BackwardRun, flash_attention_backward, naive_attention_backward
from simflash.config import StorageDtypeName, check_positive_int, storage_dtype
from simflash.memory import Traffic
from simflash.model.backward import backward_flops_by_kind, flash_backward_traffic, naive_backward_traffic
from simflash.model.flops import flops_by_kind
from simflash.model.footprint import Footprint, backward_retention
from simflash.model.traffic import flash_traffic, naive_traffic
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
    forward: Traffic
    backward: Traffic
    forward_flops: dict[str, int]
    backward_flops: dict[str, int]
    model_matches: bool  # forward and backward ledgers and FLOPs equal their closed forms
    errors: dict[str, float]  # max |gradient - reference|, by gradient
    naive_errors: dict[str, float]  # naive's, same dtype and masking
    passed: bool

    @property
    def total_bytes(self) -> int:
        return self.forward.total_bytes + self.backward.total_bytes

    @property
    def error_ratios(self) -> dict[str, float | None]:
        """Each gradient's max error over naive's (None where naive's is 0)."""
        return {g: self.errors[g] / self.naive_errors[g] if self.naive_errors[g] else None for g in GRADIENTS}

    @property
    def elementwise_flops(self) -> int:
        """fp32 and division FLOPs, forward and backward together."""
        return sum(f[kind] for f in (self.forward_flops, self.backward_flops) for kind in ("fp32", "div"))

    def to_dict(self) -> dict:
        return {
            "name": self.name, "algorithm": self.algorithm, "causal": self.causal, "kept_bytes": self.kept_bytes,
            "forward": self.forward.to_dict(), "backward": self.backward.to_dict(),
            "forward_flops_by_kind": self.forward_flops, "backward_flops_by_kind": self.backward_flops,
            "model_matches": self.model_matches, "max_abs_errors": self.errors,
            "naive_max_abs_errors": self.naive_errors, "passed": self.passed,
        }


@attrs.frozen
class BackwardComparison:
    """The rows of one forward + backward comparison with the configuration that produced them."""

    n: int
    d: int
    dtype: StorageDtypeName
    block_q: int
    block_kv: int
    backward_block_q: int
    backward_block_kv: int
    heads: int
    seed: int
    rows: tuple[BackwardRow, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed and r.model_matches for r in self.rows)

    def pair(self, causal: bool) -> tuple[BackwardRow, BackwardRow]:
        """naive's and FA-2's rows in one masking condition."""
        naive, flash = (next(r for r in self.rows if r.algorithm == a and r.causal == causal) for a in ("naive", "fa2"))
        return naive, flash

    def versus_naive(self, row: BackwardRow) -> float:
        """naive's forward + backward bytes over the row's, same masking condition."""
        return self.pair(row.causal)[0].total_bytes / row.total_bytes

    def kept_for_backward(self) -> list[Footprint]:
        """What a training step keeps for the backward at this N and d, one layer and a model's worth."""
        return backward_retention(self.n, self.d, dtype=self.dtype)

    def to_dict(self) -> dict:
        return {"n": self.n, "d": self.d, "dtype": self.dtype, "block_q": self.block_q, "block_kv": self.block_kv,
                "backward_block_q": self.backward_block_q, "backward_block_kv": self.backward_block_kv,
                "heads": self.heads, "seed": self.seed, "rows": [r.to_dict() for r in self.rows],
                "kept_for_backward": [attrs.asdict(f) for f in self.kept_for_backward()]}


def _gradients_pass(run: BackwardRun, naive: BackwardRun, ref: ReferenceGradients, dtype: str) -> bool:
    """naive, and any run in float32: each gradient's relative error within the dtype's tolerance;
    FA-2 in 16 bits: FlashAttention's rule against naive, each gradient (slack: its absolute terms)."""
    if run is naive or dtype == "float32":
        return all(relative_error(getattr(run, g), getattr(ref, g)) <= RELATIVE_TOLERANCE[dtype] for g in GRADIENTS)
    return all(fa_rule(getattr(run, g), getattr(naive, g), getattr(ref, g), getattr(ref, f"{g}_terms"))
               for g in GRADIENTS)


def compare_backward(n: int, d: int, dtype: StorageDtypeName, block_q: int, block_kv: int, backward_block_q: int,
                     backward_block_kv: int, heads: int, seed: int,
                     progress: Callable[[str], None] | None = None) -> BackwardComparison:
    """naive and FA-2, forward then backward, unmasked then causal, on one set of random inputs; progress, when
    given, is told what runs next."""
    for name, value in (("n", n), ("d", d), ("heads", heads), ("block_q", block_q), ("block_kv", block_kv),
                        ("backward_block_q", backward_block_q), ("backward_block_kv", backward_block_kv)):
        check_positive_int(name, value)
    storage_dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((heads, n, d)) for _ in range(4))
    rows = []

    def step(description: str) -> None:
        if progress is not None:
            progress(description)

    for causal in (False, True):
        mask = "causal" if causal else "unmasked"
        step(f"{mask}: float64 reference gradients")
        ref = reference_attention_backward(q, k, v, do, causal=causal, dtype=dtype)
        step(f"{mask}: naive forward + backward")
        naive = naive_attention_backward(q, k, v, do, causal=causal, dtype=dtype)
        step(f"{mask}: fa2 forward + backward")
        flash = flash_attention_backward(q, k, v, do, backward_block_q, backward_block_kv, causal=causal,
                                            dtype=dtype, forward_block_q=block_q, forward_block_kv=block_kv)
        models = {
            "naive": (naive_traffic(n, d, dtype, causal, heads=heads),
                      naive_backward_traffic(n, d, dtype, causal, heads=heads),
                      flops_by_kind(n, d, "naive", causal, heads=heads),
                      backward_flops_by_kind(n, d, "naive", causal, heads=heads)),
            "fa2": (flash_traffic(n, d, block_q, block_kv, dtype, causal, heads=heads, write_logsumexp=True),
                    flash_backward_traffic(n, d, backward_block_q, backward_block_kv, dtype, causal,
                                                    heads=heads),
                    flops_by_kind(n, d, "fa2", causal, block_q, block_kv, heads=heads),
                    backward_flops_by_kind(n, d, "fa2", causal, backward_block_q, backward_block_kv,
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
    return BackwardComparison(n, d, dtype, block_q, block_kv, backward_block_q, backward_block_kv, heads, seed,
                              tuple(rows))


def recomputed_s_flops(flash: BackwardRow) -> int:
    """FA-2's backward tensor-core FLOPs that recompute S_ij = Q_i K_j^T: one of its five matmuls of 2 r c d."""
    return flash.backward_flops["tensor"] // 5
