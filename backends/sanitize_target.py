"""The program compute-sanitizer runs: `python -m simflash.backends.sanitize_target GROUP...`.

Each group launches the kernels of its sources (see sanitize.PLAN), both builds (instrumented and
timed), on small configurations: ragged tiles, both causal variants, n_q != n_kv both ways, and
windows, grouped-query heads and split counts where the kernel takes them. Every result is checked
against the float64 reference, and every launch prints one LAUNCH line naming its kernel, so the
sanitizer's report can be read kernel by kernel. Only our kernels run (no cuBLAS); the backward
group also runs the forward kernel, which writes the O and L it starts from. The last line, DONE,
says the program reached its end.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs
import numpy as np

from simflash.backends.kernels import SOFTMAX_THREADS, SoftmaxKernel, import_cupy
from simflash.backends.validate import CheckConfig, default_configs
from simflash.backends.validate_backward import BackwardConfig, gradient_atol, naive_backward, reference_backward
from simflash.backends.validate_backward import default_configs as backward_configs
from simflash.config import STORAGE_DTYPES
from simflash.numerics import max_abs_error, reference_attention, relative_error, unit_roundoff, upcast, within_tolerance
from simflash.schedule import TileSchedule

LAUNCH = "launched {kernel}, {build} build, {label}: {check}"
DONE = "sanitize target: done"
BUILDS = {True: "instrumented", False: "timed"}

# FA-2 forward: the validation's quick set (ragged tiles, both causal variants, n_q != n_kv both ways,
# fp16 and bf16), d = 256, grouped-query heads unpacked and packed with windows, and query tiles that
# see no key (lower_right, n_q > n_kv) with L written. Version 2 takes those without windows or groups.
FORWARD_CONFIGS = (
    *default_configs(quick=True),
    CheckConfig(100, 150, 256, 1, True, "lower_right", "bfloat16", 128, 32),
    CheckConfig(130, 300, 64, 4, False, "upper_left", "float16", kv_heads=2, window=(64, 0)),
    CheckConfig(300, 130, 128, 4, False, "lower_right", "bfloat16", batch=2, kv_heads=1, window=(128, 128),
                pack_gqa=True),
    CheckConfig(200, 40, 64, 2, True, "lower_right", "float16", 64, 32, window=(16, -1)),
)
LOGSUMEXP_CONFIG = FORWARD_CONFIGS[-1]  # its first query tiles see no key: L = +inf there


@attrs.frozen
class DecodeCase:
    """One Flash-Decoding launch (backends.decoding.flash_decoding's arguments)."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_kv: int
    d: int
    num_splits: int
    block_kv: int
    pack_gqa: bool = True
    cache_seqlens: tuple[int, ...] | None = None
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    dtype: str = "float16"

    @property
    def label(self) -> str:
        return (f"{self.dtype} batch={self.batch} H_q={self.heads} H_kv={self.kv_heads} n_q={self.n_q} "
                f"n_kv={self.n_kv} d={self.d} B_c={self.block_kv} splits={self.num_splits}"
                f"{' packed' if self.pack_gqa else ''}{f' cache_seqlens={self.cache_seqlens}' if self.cache_seqlens else ''}"
                f"{' causal' if self.causal else ''}{f' window={self.window}' if self.window != (-1, -1) else ''}")


# Flash-Decoding: one split (the split kernel writes O itself), several (split and combine), ragged
# caches, causal with a window, packed and unpacked groups, and query tiles of 1 to 40 rows (4, 2 and 1
# warps a 16-row group: every `slices` instantiation).
DECODE_CASES = (
    DecodeCase(1, 8, 2, 1, 300, 128, 1, 64),
    DecodeCase(2, 8, 2, 1, 700, 128, 4, 128, cache_seqlens=(700, 65), dtype="bfloat16"),
    DecodeCase(2, 8, 1, 4, 600, 64, 2, 256, causal=True, window=(96, 0)),
    DecodeCase(1, 2, 2, 40, 300, 64, 3, 128, pack_gqa=False, causal=True, dtype="bfloat16"),
)
# FA-2 backward: the validation's quick set (ragged, both causal variants, n_q != n_kv) and B_r = 128.
BACKWARD_CONFIGS = (*backward_configs(quick=True),
                    BackwardConfig(130, 200, 64, 2, False, "upper_left", "bfloat16", block_q=128, block_kv=128))
# Naive softmax: rows whose length takes the vector path and the scalar one, both causal variants.
SOFTMAX_CASES = ((33, 200, True, "lower_right", "float16"), (40, 77, True, "upper_left", "bfloat16"),
                 (5, 64, False, "upper_left", "float16"))


def inputs(rng: np.random.Generator, c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random q, k, v of a configuration: (batch, heads, n, d), the batch axis only when above 1."""
    lead = (c.batch,) if c.batch > 1 else ()
    kv_heads = c.heads if c.kv_heads is None else c.kv_heads
    q = rng.standard_normal((*lead, c.heads, c.n_q, c.d), dtype=np.float32)
    k, v = (rng.standard_normal((*lead, kv_heads, c.n_kv, c.d), dtype=np.float32) for _ in range(2))
    return q, k, v


def _report(kernel: str, instrumented: bool, label: str, check: str) -> None:
    print(LAUNCH.format(kernel=kernel, build=BUILDS[instrumented], label=label, check=check), flush=True)


def _forward(version: str, rng: np.random.Generator) -> None:
    from simflash.backends import flash2

    kernel = {"v1": "flash2_forward", "v2": "flash2_forward_v2", "v3": "flash2_forward_v3",
              "v3-nopp": "flash2_forward_v3"}[version]
    for c in FORWARD_CONFIGS:
        if version != "v1" and (c.window != (-1, -1) or c.group != 1
                                or not flash2.builds(version, c.block_q, c.block_kv, c.d)):
            continue  # versions 2 and 3 are built without windows or grouped heads, for fewer tile shapes
        q, k, v = inputs(rng, c)
        common: dict[str, Any] = dict(
            causal=c.causal, causal_variant=c.causal_variant, dtype=c.dtype, window=c.window, pack_gqa=c.pack_gqa,
            version=version, write_logsumexp=version == "v1" and c == LOGSUMEXP_CONFIG)
        ref = reference_attention(q, k, v, c.causal, c.causal_variant, dtype=c.dtype, window=c.window)
        # the traced (head, tile): the last head and the last (ragged, most masked) query tile, as validate does
        tile = TileSchedule(c.n_q * (c.group if c.pack_gqa else 1), c.n_kv, c.block_q, c.block_kv).n_q_tiles - 1
        for instrumented in (True, False):
            trace: dict[str, Any] = dict(trace_head=c.cta_heads - 1, trace_tile=tile) if instrumented else {}
            run = flash2.flash_attention(q, k, v, c.block_q, c.block_kv, **common, instrumented=instrumented, **trace)
            error = relative_error(run.out, ref)
            if not within_tolerance(error, c.dtype):
                raise AssertionError(f"{kernel} {c.label} {BUILDS[instrumented]}: relative error {error:.3g}")
            if run.logsumexp is not None and not np.isposinf(run.logsumexp[..., : c.n_q - c.n_kv]).all():
                raise AssertionError(f"{kernel} {c.label}: rows that see no key must get L = +inf")
            _report(kernel, instrumented, c.label, f"relative error {error:.2e}")


def forward_v1(rng: np.random.Generator) -> None:
    _forward("v1", rng)


def forward_v2(rng: np.random.Generator) -> None:
    _forward("v2", rng)


def forward_v3(rng: np.random.Generator) -> None:
    _forward("v3", rng)
    _forward("v3-nopp", rng)


def decode(rng: np.random.Generator) -> None:
    from simflash.backends.decoding import flash_decoding

    for c in DECODE_CASES:
        q = rng.standard_normal((c.batch, c.heads, c.n_q, c.d), dtype=np.float32)
        k, v = (rng.standard_normal((c.batch, c.kv_heads, c.n_kv, c.d), dtype=np.float32) for _ in range(2))
        seqlens = c.cache_seqlens or (c.n_kv,) * c.batch
        ref = np.stack([reference_attention(q[b], k[b, :, :n], v[b, :, :n], c.causal, "lower_right", dtype=c.dtype,
                                            window=c.window) for b, n in enumerate(seqlens)])
        for instrumented in (True, False):
            run = flash_decoding(q, k, v, c.num_splits, c.block_kv, pack_gqa=c.pack_gqa, cache_seqlens=c.cache_seqlens,
                                 causal=c.causal, window=c.window, dtype=c.dtype, instrumented=instrumented)
            error = relative_error(run.out, ref)
            if not within_tolerance(error, c.dtype):
                raise AssertionError(f"Flash-Decoding {c.label} {BUILDS[instrumented]}: relative error {error:.3g}")
            _report("flash_decoding_split", instrumented, c.label, f"relative error {error:.2e}")
            if c.num_splits > 1:
                _report("flash_decoding_combine", instrumented, c.label, f"relative error {error:.2e}")


def backward(rng: np.random.Generator) -> None:
    from simflash.backends.flash2_backward import flash_attention_backward

    for c in BACKWARD_CONFIGS:
        q, k, v = inputs(rng, c)
        do = rng.standard_normal(q.shape, dtype=np.float32)
        common: dict[str, Any] = dict(causal=c.causal, causal_variant=c.causal_variant, dtype=c.dtype)
        _, _, *exact = reference_backward(q, k, v, do, **common)
        naive = naive_backward(q, k, v, do, **common)
        atol = gradient_atol(upcast(v, c.dtype), upcast(do, c.dtype))
        for instrumented in (True, False):
            run = flash_attention_backward(q, k, v, do, c.block_q, c.block_kv, **common, instrumented=instrumented)
            errors = []
            for name, mine, theirs, ref in zip(("dq", "dk", "dv"), (run.dq, run.dk, run.dv), naive, exact):
                error = max_abs_error(mine, ref)
                # FlashAttention's rule, as the backward's validation holds it
                if not error <= 2 * max_abs_error(theirs, ref) + atol:
                    raise AssertionError(f"backward {c.label} {BUILDS[instrumented]}: {name} max error {error:.3g} "
                                         f"beyond twice naive's")
                errors.append(f"{name} {error:.2e}")
            for kernel in ("flash2_backward_preprocess", "flash2_backward", "flash2_backward_convert"):
                _report(kernel, instrumented, c.label, "max abs error " + ", ".join(errors))


def _softmax_reference(S: np.ndarray, visible: np.ndarray) -> np.ndarray:
    x = np.where(visible, S.astype(np.float64), -np.inf)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(m), 0.0, m))
    l = e.sum(axis=-1, keepdims=True)
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0)


def naive_softmax(rng: np.random.Generator) -> None:
    cupy = import_cupy()
    for n_q, n_kv, causal, variant, dtype in SOFTMAX_CASES:
        S = (rng.standard_normal((n_q, n_kv)) * 2).astype(STORAGE_DTYPES[dtype])  # scaled scores
        sched = TileSchedule(n_q, n_kv, n_q, n_kv, causal=causal, causal_variant=variant)
        label = f"{dtype} n_q={n_q} n_kv={n_kv} {variant if causal else 'full'}"
        for instrumented in (True, False):
            S_d = cupy.asarray(S.view(np.uint16))
            P_d = cupy.zeros_like(S_d)
            counters = cupy.zeros(2, dtype=cupy.uint64)
            SoftmaxKernel(dtype, instrumented).function(n_kv)(
                (n_q,), (SOFTMAX_THREADS,),
                (S_d, P_d, np.int32(n_q), np.int32(n_kv), np.int32(causal),
                 np.int32(sched.diagonal_offset), counters if instrumented else np.uint64(0)),
                shared_mem=n_kv * 2)
            P = P_d.get().view(STORAGE_DTYPES[dtype]).astype(np.float64)
            error = float(np.max(np.abs(P - _softmax_reference(S, sched.mask(0, 0)))))
            if error > 2 * unit_roundoff(dtype):  # P <= 1, rounded once to the storage dtype
                raise AssertionError(f"naive_softmax {label}: max abs error {error:.3g}")
            _report("naive_softmax", instrumented, label, f"max abs error {error:.2e}")


GROUPS = {"forward-v1": forward_v1, "forward-v2": forward_v2, "forward-v3": forward_v3, "decode": decode,
          "backward": backward, "naive-softmax": naive_softmax}


def main(groups: list[str]) -> None:
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise SystemExit(f"usage: python -m simflash.backends.sanitize_target GROUP... (GROUP one of {list(GROUPS)})")
    rng = np.random.default_rng()
    for group in groups:
        GROUPS[group](rng)
    print(DONE, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
