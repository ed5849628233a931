"""Correctness of the Flash-Decoding kernels against a float64 reference, the simulator and PyTorch SDPA.

For each configuration, on fresh random inputs: the instrumented and timed builds of the split and
combine kernels, the simulator's Flash-Decoding (sf.flash_decoding, same split count) and naive
attention in the same storage dtype, and PyTorch's SDPA (enable_gqa=True, each batch element's mask
aligned to the bottom right of its cache length). Recorded per configuration:

- FlashAttention's rule on max |out - ref| (simflash.numerics.fa_rule): at most twice naive's error;
- the bytes both kernels counted against the simulator's ledger and the closed form
  (sf.model.flash_decoding_traffic), exact;
- SDPA's output against ours, on the rows that see a key (SDPA's empty rows are NaN), held to the
  same bound;
- that the timed build writes the same bits as the instrumented one, and no NaN anywhere.
"""

from __future__ import annotations

from typing import TypedDict

import attrs
import numpy as np

import simflash as sf
from simflash.backends import decoding
from simflash.backends.kernels import DECODE_BLOCK_KV
from simflash.backends.validate import build_checks, inputs
from simflash.config import STORAGE_DTYPE_NAMES, StorageDtypeName, check_choice, check_window
from simflash.numerics import fa_rule, reference_attention, reference_mask, upcast


@attrs.frozen
class DecodeConfig:
    batch: int
    heads: int  # query heads per batch element
    kv_heads: int  # K/V heads per batch element
    n_q: int
    n_kv: int  # allocated cache rows
    d: int
    dtype: str
    num_splits: int | None = None  # None: FA-2's heuristic on the GPU's SMs
    block_kv: int | None = None  # None: the kernels' default for d
    pack_gqa: bool = True
    cache_seqlens: tuple[int, ...] | None = attrs.field(default=None, converter=lambda x: None if x is None else tuple(x))
    causal: bool = False
    window: tuple[int, int] = attrs.field(default=(-1, -1), converter=check_window)

    @property
    def tile(self) -> int:
        return DECODE_BLOCK_KV[self.d][0] if self.block_kv is None else self.block_kv

    @property
    def seqlens(self) -> tuple[int, ...]:
        return self.cache_seqlens if self.cache_seqlens is not None else (self.n_kv,) * self.batch

    @property
    def label(self) -> str:
        splits = "heuristic splits" if self.num_splits is None else f"{self.num_splits} splits"
        extra = ("" if self.cache_seqlens is None else f" seqlens={list(self.cache_seqlens)}") + (
            " causal" if self.causal else "") + ("" if self.window == (-1, -1) else f" window={self.window}")
        return (f"{self.dtype} batch={self.batch} H_q={self.heads} H_kv={self.kv_heads} n_q={self.n_q} "
                f"n_kv={self.n_kv} d={self.d} B_c={self.tile} {splits} {'packed' if self.pack_gqa else 'unpacked'}{extra}")


def decode_configs() -> list[DecodeConfig]:
    """Groups 1, 4, 8 (8 query heads), packed and not; one query row and several (tiles of 1 to 96
    packed rows: all three slicings of a tile's warps, and two query tiles); heuristic, one, several
    and the most splits; ragged cache lengths (splits and whole query tiles with nothing to visit),
    causal, windows; d = 64 and 128, each KV tile built; float16 and bfloat16."""
    return [
        DecodeConfig(1, 8, 8, 1, 1000, 128, "float16"),
        DecodeConfig(1, 8, 2, 1, 4096, 128, "bfloat16"),
        DecodeConfig(1, 8, 1, 1, 4096, 64, "float16"),
        DecodeConfig(1, 8, 2, 1, 4096, 128, "float16", pack_gqa=False),
        DecodeConfig(2, 8, 2, 1, 4096, 128, "float16", num_splits=32, cache_seqlens=(4096, 100)),
        DecodeConfig(3, 8, 2, 4, 2000, 128, "float16", num_splits=3, cache_seqlens=(2000, 999, 1), causal=True),
        DecodeConfig(3, 8, 1, 4, 2000, 64, "bfloat16", num_splits=5, cache_seqlens=(1, 1500, 2000), causal=True,
                     window=(256, 0)),
        DecodeConfig(2, 8, 8, 5, 1000, 128, "float16", num_splits=1, window=(100, 100)),
        DecodeConfig(2, 8, 1, 12, 3000, 128, "float16", num_splits=4, causal=True),
        DecodeConfig(1, 8, 4, 20, 3000, 64, "bfloat16", num_splits=2, window=(700, -1)),
        DecodeConfig(1, 8, 8, 1, 1000, 128, "float16", num_splits=8),
        DecodeConfig(1, 8, 8, 1, 1, 64, "bfloat16"),
        DecodeConfig(2, 8, 4, 8, 1000, 128, "float16", num_splits=2, pack_gqa=False, cache_seqlens=(4, 1000),
                     causal=True),
        DecodeConfig(2, 8, 2, 8, 1500, 128, "bfloat16", num_splits=6, cache_seqlens=(1500, 700), causal=True),
        DecodeConfig(2, 8, 2, 1, 4096, 128, "float16", block_kv=128, cache_seqlens=(4096, 1000)),
        DecodeConfig(2, 8, 1, 4, 3000, 64, "bfloat16", num_splits=3, block_kv=256, causal=True, window=(300, 0)),
    ]


def _split_count(c: DecodeConfig) -> int:
    return decoding.split_schedule(c.batch, c.batch * c.heads, c.batch * c.kv_heads, c.n_q, c.n_kv, c.d,
                                         c.num_splits, c.tile, c.pack_gqa).num_splits


def _by_batch(c: DecodeConfig, q, k, v, attend) -> np.ndarray:
    """attend(q_b, k_b, v_b) over each batch element's valid keys, stacked."""
    return np.stack([attend(q[b], k[b, :, :n], v[b, :, :n]) for b, n in enumerate(c.seqlens)])


def _sdpa(c: DecodeConfig, q, k, v) -> np.ndarray | str:
    """PyTorch SDPA on the GPU in the storage dtype, grouped-query heads as they are (enable_gqa=True)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[c.dtype]
    out = []
    for b, n in enumerate(c.seqlens):
        mask = torch.from_numpy(reference_mask(c.n_q, n, c.causal, "lower_right", c.window)).cuda()
        q_b, k_b, v_b = (torch.from_numpy(np.ascontiguousarray(x)).cuda().to(dtype) for x in (q[b], k[b, :, :n], v[b, :, :n]))
        o = torch.nn.functional.scaled_dot_product_attention(q_b[None], k_b[None], v_b[None], attn_mask=mask,
                                                             enable_gqa=True)
        out.append(o[0].float().cpu().numpy())
    return np.stack(out)


class DecodeOptions(TypedDict):
    """What the simulator's and the GPU's flash_decoding take alike."""

    num_splits: int | None
    block_kv: int | None
    pack_gqa: bool
    cache_seqlens: tuple[int, ...] | None
    causal: bool
    window: tuple[int, int]
    dtype: StorageDtypeName


def check(config: DecodeConfig, rng: np.random.Generator) -> dict:
    """Run one configuration every way and record how the results compare."""
    c = config
    q = rng.standard_normal((c.batch, c.heads, c.n_q, c.d), dtype=np.float32)
    k = rng.standard_normal((c.batch, c.kv_heads, c.n_kv, c.d), dtype=np.float32)
    v = rng.standard_normal((c.batch, c.kv_heads, c.n_kv, c.d), dtype=np.float32)
    splits = _split_count(c)
    common = DecodeOptions(num_splits=splits, block_kv=c.tile, pack_gqa=c.pack_gqa, cache_seqlens=c.cache_seqlens,
                           causal=c.causal, window=c.window, dtype=check_choice("dtype", c.dtype, STORAGE_DTYPE_NAMES))

    gpu = decoding.flash_decoding(q, k, v, **common)
    timed = decoding.flash_decoding(q, k, v, **common, instrumented=False)
    sim = sf.flash_decoding(q, k, v, **common)
    model = sf.model.flash_decoding_traffic(c.n_kv, c.d, batch=c.batch, heads=c.heads, kv_heads=c.kv_heads, n_q=c.n_q,
                                            num_splits=splits, block_kv=c.tile, pack_gqa=c.pack_gqa,
                                            cache_seqlens=c.cache_seqlens, causal=c.causal, window=c.window,
                                            dtype=c.dtype)
    masks = inputs(c.causal, "lower_right", c.dtype)
    ref = _by_batch(c, q, k, v, lambda q, k, v: reference_attention(q, k, v, **masks, window=c.window))
    naive = _by_batch(c, q, k, v, lambda q, k, v: sf.naive_attention(q, k, v, **masks, window=c.window).out)
    rule = fa_rule(gpu.out, naive, ref, upcast(v, c.dtype))
    record = {
        "config": attrs.asdict(c),
        "num_splits": splits,
        "block_kv": c.tile,
        "error": {"max_abs": rule.error, "naive_max_abs": rule.naive_error, "bound": rule.bound,
                  "fa_rule": rule.passed,
                  "gpu_vs_simulator_max_abs": float(np.abs(gpu.out.astype(np.float64) - sim.out.astype(np.float64)).max())},
        **build_checks(gpu, timed, sim.traffic, model),
        "resources": gpu.resources,
    }
    sdpa = _sdpa(c, q, k, v)
    if isinstance(sdpa, str):
        record["sdpa"] = {"skipped": sdpa}
    else:
        seen = np.stack([np.broadcast_to(reference_mask(c.n_q, n, c.causal, "lower_right", c.window).any(axis=1),
                                         (c.heads, c.n_q)) for n in c.seqlens])  # rows that see a key
        diff = np.abs(gpu.out.astype(np.float64) - sdpa)[seen]
        record["sdpa"] = {"max_abs_diff": float(diff.max(initial=0.0)), "within_bound": bool(diff.max(initial=0.0) <= rule.bound)}
    record["ok"] = passed(record)
    return record


def passed(record: dict) -> bool:
    """Every check of one record holds (SDPA's where it ran)."""
    return bool(record["error"]["fa_rule"] and record["nan_free"] and record["timed_equals_instrumented"]
                and record["traffic"]["equals_simulator"] and record["traffic"]["equals_model"]
                and record["sdpa"].get("within_bound", True))
