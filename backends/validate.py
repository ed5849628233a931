"""Correctness of the GPU kernels against a float64 reference and against the simulator, same inputs.

For each configuration: the instrumented and timed builds of the FA-2 kernel, the simulator's FA-2
and naive attention in the same storage dtype, and (float16, one K/V head a query head, no window)
the naive GPU path all run on one set of fresh random inputs. Recorded per configuration:

- relative error ||out - ref|| / ||ref|| of each, and FlashAttention's rule: the kernel's error at
  most 2x that of naive attention in the same dtype (simflash.numerics.within_tolerance; the
  grouped-query and window rows also on max |out - ref|, simflash.numerics.fa_rule);
- the HBM bytes the kernel counted, against the simulator's ledger and the closed form (exact);
- m and l after every KV tile of one query tile, against the simulator's TileStep;
- that the timed build writes the same bits as the instrumented one, and no NaN anywhere.

The Flash-Decoding kernels have their own rows (simflash.backends.validate_decode); `suites` names
both sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import attrs
import numpy as np

import simflash as sf
from simflash.backends import flash2, naive
from simflash.config import (
    STORAGE_DTYPE_NAMES, CausalVariant, StorageDtypeName, check_causal_variant, check_choice, check_window,
)
from simflash.memory import Traffic
from simflash.numerics import fa_rule, reference_attention, relative_error, upcast, within_tolerance

if TYPE_CHECKING:
    from simflash.backends.validate_backward import BackwardConfig

TRACE_RTOL = 1e-3  # m and l: fp32 sums in a different order and a hardware exp2


@attrs.frozen
class CheckConfig:
    n_q: int
    n_kv: int
    d: int
    heads: int
    causal: bool
    causal_variant: str
    dtype: str
    block_q: int = 128
    block_kv: int = 64
    batch: int = 1  # leading dim of q, k, v when above 1: (batch, heads, n, d)
    kv_heads: int | None = None  # K/V heads per batch element (None: as many as query heads)
    window: tuple[int, int] = attrs.field(default=(-1, -1), converter=check_window)
    pack_gqa: bool = False

    def __attrs_post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be a positive integer, got {self.batch}")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads must divide heads = {self.heads}, got {self.kv_heads}")

    @property
    def group(self) -> int:
        return 1 if self.kv_heads is None else self.heads // self.kv_heads

    @property
    def cta_heads(self) -> int:
        """Heads the kernel's CTAs are indexed by, all batch elements: packed groups or query heads."""
        return self.batch * (self.heads // self.group if self.pack_gqa else self.heads)

    @property
    def label(self) -> str:
        mask = self.causal_variant if self.causal else "full"
        heads = f"H={self.heads}" if self.group == 1 else f"H_q={self.heads} H_kv={self.kv_heads}"
        extra = ("" if self.batch == 1 else f" batch={self.batch}") + (
            "" if self.window == (-1, -1) else f" window={self.window}") + (" packed" if self.pack_gqa else "")
        return (f"{self.dtype} n_q={self.n_q} n_kv={self.n_kv} d={self.d} {heads} {mask} "
                f"B_r={self.block_q} B_c={self.block_kv}{extra}")


MASKS = ((False, "upper_left"), (True, "upper_left"), (True, "lower_right"))


def default_configs(quick: bool = False) -> list[CheckConfig]:
    """N in {1, 17, 128, 1000, 4096} x d in {64, 128} x {full, both causal variants} x {fp16, bf16},
    n_q != n_kv both ways, the other tile shapes, and d = 256. quick: a small subset for sanitizers and smoke runs."""
    if quick:
        return [
            CheckConfig(200, 200, 64, 2, True, "upper_left", "float16", 64, 32),
            CheckConfig(130, 77, 128, 1, True, "lower_right", "bfloat16"),
            CheckConfig(77, 130, 64, 1, False, "upper_left", "float16", 128, 128),
        ]
    configs = []
    for n in (1, 17, 128, 1000, 4096):
        for d in (64, 128):
            for causal, variant in MASKS:
                for dtype in ("float16", "bfloat16"):
                    configs.append(CheckConfig(n, n, d, 1 if n == 4096 else 2, causal, variant, dtype))
    for n_q, n_kv in ((1, 1000), (17, 300), (300, 17), (1000, 4096), (4096, 1000)):
        for causal, variant in MASKS:
            for d, dtype in ((64, "float16"), (128, "bfloat16")):
                configs.append(CheckConfig(n_q, n_kv, d, 1, causal, variant, dtype))
    for block_q, block_kv in ((64, 32), (64, 64), (64, 128), (128, 32), (128, 128)):
        for causal, variant in MASKS:
            configs.append(CheckConfig(1000, 777, 128, 2, causal, variant, "float16", block_q, block_kv))
    # d = 256 (FlashAttention-2 supports it) with B_r = 128, B_c = 32: the accumulator alone is 128
    # registers per thread, and wider KV tiles spill
    for n_q, n_kv in ((17, 17), (1000, 1000), (300, 777)):
        for causal, variant in MASKS:
            for dtype in ("float16", "bfloat16"):
                configs.append(CheckConfig(n_q, n_kv, 256, 1, causal, variant, dtype, 128, 32))
    return configs


WINDOWS = (  # (window, causal, causal_variant): no window, both edges, two-sided, causal as a window
    ((-1, -1), True, "lower_right"), ((256, 0), False, "upper_left"), ((128, 128), False, "lower_right"),
    ((-1, 0), False, "upper_left"), ((64, -1), True, "upper_left"),
)


def gqa_window_configs() -> list[CheckConfig]:
    """Grouped-query heads (8 query heads over 8, 2 or 1 K/V heads: groups 1, 4, 8), each group size
    unpacked and packed, against every window of WINDOWS; n_q != n_kv both ways, d = 64 and 128,
    float16 and bfloat16, a batch of 2 and the ragged and empty query tiles these shapes make."""
    shapes = ((300, 700), (700, 300), (513, 513))
    configs = []
    for n, (kv_heads, pack) in enumerate(((8, False), (2, False), (2, True), (1, False), (1, True))):
        for m, (window, causal, variant) in enumerate(WINDOWS):
            k = n * len(WINDOWS) + m
            n_q, n_kv = shapes[k % len(shapes)]
            configs.append(CheckConfig(n_q, n_kv, (64, 128)[k % 2], 8, causal, variant, ("float16", "bfloat16")[k // 2 % 2],
                                       batch=1 + k % 3 // 2, kv_heads=kv_heads, window=window, pack_gqa=pack))
    return configs


def ledger_rows(traffic: Traffic) -> list[list]:
    """A ledger as JSON rows [kernel, tensor, read_bytes, write_bytes]."""
    return [[kernel, tensor, flow.read_bytes, flow.write_bytes] for (kernel, tensor), flow in traffic.ledger.items()]


def _trace_check(gpu_steps, sim_steps) -> dict:
    """The kernel's m, l per KV tile against the simulator's, for one tile."""
    if [s.j for s in gpu_steps] != [s.j for s in sim_steps]:
        return {"steps": len(gpu_steps), "ok": False, "reason": "different KV tiles visited"}
    m_diff = l_diff = 0.0
    same_infinities = True
    for mine, theirs in zip(gpu_steps, sim_steps):
        same_infinities &= bool(np.array_equal(np.isneginf(mine.m), np.isneginf(theirs.m)))
        finite = np.isfinite(theirs.m)
        if finite.any():
            m_diff = max(m_diff, float(np.max(np.abs(mine.m[finite] - theirs.m[finite]) / np.maximum(1, np.abs(theirs.m[finite])))))
        l_diff = max(l_diff, float(np.max(np.abs(mine.l - theirs.l) / np.maximum(1, np.abs(theirs.l)))))
    return {"steps": len(gpu_steps), "m_max_rel_diff": m_diff, "l_max_rel_diff": l_diff,
            "ok": same_infinities and m_diff <= TRACE_RTOL and l_diff <= TRACE_RTOL}


def equal_bytes(a: Traffic, b: Traffic) -> bool:
    """The same bytes under every (kernel, tensor) key; a key with no bytes counts as absent."""
    def moved(t: Traffic) -> dict:
        return {key: flow for key, flow in t.ledger.items() if flow.total_bytes}
    return moved(a) == moved(b)


def build_checks(gpu, timed, simulated: Traffic, model: Traffic) -> dict:
    """What both kernels' records hold of one run: no NaN, the timed build's bits, the counted bytes
    against the simulator's ledger and the closed form."""
    return {
        "nan_free": bool(np.isfinite(gpu.out.astype(np.float32)).all()),
        "timed_equals_instrumented": bool(np.array_equal(gpu.out.view(np.uint16), timed.out.view(np.uint16))),
        "traffic": {"instrumented": ledger_rows(gpu.traffic), "equals_simulator": equal_bytes(gpu.traffic, simulated),
                    "equals_model": equal_bytes(gpu.traffic, model)},
    }


class Inputs(TypedDict):
    """The masking and dtype every run of a configuration takes."""

    causal: bool
    causal_variant: CausalVariant
    dtype: StorageDtypeName


def inputs(causal: bool, causal_variant: str, dtype: str) -> Inputs:
    return Inputs(causal=causal, causal_variant=check_causal_variant(causal_variant),
                  dtype=check_choice("dtype", dtype, STORAGE_DTYPE_NAMES))


class Tiles(TypedDict):
    block_q: int
    block_kv: int
    window: tuple[int, int]
    pack_gqa: bool


def check(config: CheckConfig, rng: np.random.Generator, version: str = "v1") -> dict:
    """Run one configuration every way and record how the results compare (the naive GPU path with
    version 1 only: it does not depend on the FA-2 kernel's version)."""
    c = config
    lead = (c.batch,) if c.batch > 1 else ()
    kv_heads = c.heads if c.kv_heads is None else c.kv_heads
    q = rng.standard_normal((*lead, c.heads, c.n_q, c.d), dtype=np.float32)
    k = rng.standard_normal((*lead, kv_heads, c.n_kv, c.d), dtype=np.float32)
    v = rng.standard_normal((*lead, kv_heads, c.n_kv, c.d), dtype=np.float32)
    common = inputs(c.causal, c.causal_variant, c.dtype)
    tiles = Tiles(block_q=c.block_q, block_kv=c.block_kv, window=c.window, pack_gqa=c.pack_gqa)
    trace_head = c.cta_heads - 1  # the last head and the last (ragged, most masked) query tile
    trace_tile = sf.TileSchedule(c.n_q * (c.group if c.pack_gqa else 1), c.n_kv, c.block_q, c.block_kv).n_q_tiles - 1

    ref = reference_attention(q, k, v, **common, window=c.window)
    gpu = flash2.flash_attention(q, k, v, **tiles, **common, trace_head=trace_head, trace_tile=trace_tile,
                                 version=version)
    timed = flash2.flash_attention(q, k, v, **tiles, **common, instrumented=False, version=version)
    sim = sf.flash_attention(q, k, v, **tiles, **common, trace="stats", trace_heads=[trace_head],
                             trace_tiles=[trace_tile])
    sim_naive = sf.naive_attention(q, k, v, **common, window=c.window)
    model = sf.model.flash_traffic(c.n_q, c.d, c.block_q, c.block_kv, c.dtype, c.causal, n_kv=c.n_kv,
                                   heads=c.batch * c.heads, causal_variant=c.causal_variant, window=c.window,
                                   kv_heads=c.batch * kv_heads, pack_gqa=c.pack_gqa)

    err = relative_error(gpu.out, ref)
    err_naive = relative_error(sim_naive.out, ref)
    record = {
        "config": attrs.asdict(c),
        "error": {
            "gpu": err,
            "simulator": relative_error(sim.out, ref),
            "naive_same_dtype": err_naive,
            "gpu_vs_simulator_max_abs": float(np.max(np.abs(gpu.out.astype(np.float64) - sim.out.astype(np.float64)))),
            "within_fa_rule": within_tolerance(err, c.dtype, err_naive),
        },
        **build_checks(gpu, timed, sim.traffic, model),
        "trace": {"head": trace_head, "tile": trace_tile, **_trace_check(gpu.trace, list(sim.trace))},
        "resources": gpu.resources,
    }
    if c.kv_heads is not None or c.window != (-1, -1) or c.batch > 1:  # the grouped-query and window rows
        rule = fa_rule(gpu.out, sim_naive.out, ref, upcast(v, c.dtype))
        record["error"]["fa_rule"] = {"max_abs": rule.error, "naive_max_abs": rule.naive_error, "bound": rule.bound,
                                      "passed": rule.passed}
    elif c.dtype in naive.NAIVE_DTYPES and version == "v1":
        gpu_naive = naive.naive_attention(q, k, v, **common)
        assert gpu_naive.traffic is not None  # instrumented
        logical = sf.model.naive_traffic(c.n_q, c.d, c.dtype, c.causal, n_kv=c.n_kv, heads=c.heads,
                                         causal_variant=c.causal_variant)
        dense = sf.model.naive_traffic(c.n_q, c.d, c.dtype, False, n_kv=c.n_kv, heads=c.heads)
        softmax_keys = [("softmax", "S"), ("softmax", "P")]
        record["naive_gpu"] = {
            "error": relative_error(gpu_naive.out, ref),
            "ledger": ledger_rows(gpu_naive.traffic),
            "equals_model": gpu_naive.traffic == logical,
            "softmax_equals_model": all(gpu_naive.traffic.ledger[key] == logical.ledger[key] for key in softmax_keys),
            "gemms_equal_dense_model": all(gpu_naive.traffic.ledger[key] == dense.ledger[key]
                                           for key in dense.ledger if key not in softmax_keys),
            "nan_free": bool(np.isfinite(gpu_naive.out.astype(np.float32)).all()),
        }
    record["ok"] = passed(record)
    return record


def passed(record: dict) -> bool:
    """Every check of one record holds (the naive GPU path: exact ledger when not causal; the max-abs
    rule where it was recorded)."""
    ok = (record["error"]["within_fa_rule"] and record["nan_free"] and record["timed_equals_instrumented"]
          and record["traffic"]["equals_simulator"] and record["traffic"]["equals_model"] and record["trace"]["ok"])
    ok = ok and record["error"].get("fa_rule", {"passed": True})["passed"]
    naive_gpu = record.get("naive_gpu")
    if naive_gpu is not None:
        exact = naive_gpu["equals_model"] if not record["config"]["causal"] else naive_gpu["softmax_equals_model"]
        ok = ok and exact and naive_gpu["gemms_equal_dense_model"] and naive_gpu["nan_free"]
        ok = ok and within_tolerance(naive_gpu["error"], record["config"]["dtype"])
    return bool(ok)


def refusals() -> list[dict]:
    """Configurations the kernel is not built for are refused with a ValueError naming the argument."""
    # Any: arguments the kernel must refuse, so deliberately not of the types it takes
    cases: dict[str, dict[str, Any]] = {"d=96": dict(d=96), "d=512": dict(d=512), "block_q=100": dict(block_q=100),
             "block_kv=48": dict(block_kv=48), "dtype=float32": dict(dtype="float32"),
             "d=256 with 128x128 tiles (320 KiB of shared memory)": dict(d=256, block_kv=128)}
    out = []
    for label, change in cases.items():
        kwargs: dict[str, Any] = {"dtype": "float16", "block_q": 128, "block_kv": 64, "d": 64} | change
        q = np.ones((1, 8, kwargs.pop("d")), dtype=np.float32)
        try:
            flash2.flash_attention(q, q, q, **kwargs)
            out.append({"case": label, "refused": False, "message": ""})
        except ValueError as error:
            out.append({"case": label, "refused": True, "message": str(error)})
    return out


SUITES = ("fa2", "gqa-window", "decode")


def suite_configs(suites: tuple[str, ...], quick: bool = False) -> tuple[list[CheckConfig], list]:
    """The FA-2 configurations (fa2: default_configs; gqa-window: gqa_window_configs) and the
    Flash-Decoding ones (decode: simflash.backends.validate_decode.decode_configs) of the suites named."""
    unknown = [name for name in suites if name not in SUITES]
    if unknown:
        raise ValueError(f"suite must be among {list(SUITES)}, got {unknown}")
    configs = (default_configs(quick) if "fa2" in suites else []) + (gqa_window_configs() if "gqa-window" in suites else [])
    if "decode" not in suites:
        return configs, []
    from simflash.backends.validate_decode import decode_configs

    return configs, decode_configs()


def validate(configs: list[CheckConfig] | list[BackwardConfig], seed: int | None = None, progress=None, decode: list | None = None,
             version: str | None = "v1", check=check, refusals=refusals) -> dict:
    """Run every configuration on fresh inputs (seed recorded, so a run can be repeated); `decode`:
    Flash-Decoding configurations (simflash.backends.validate_decode), recorded apart. `check` and
    `refusals` are the forward's unless given (simflash.backends.validate_backward passes the backward's,
    with version None: its checks take no forward kernel version)."""
    if seed is None:
        entropy = np.random.SeedSequence().entropy  # an int when drawn fresh
        assert isinstance(entropy, int)
        seed = entropy
    rng = np.random.default_rng(seed)
    records = []
    for config in configs:
        records.append(check(config, rng) if version is None else check(config, rng, version))
        if progress is not None:
            progress(records[-1])
    result = {**({"kernel": version} if version is not None else {}), "seed": str(seed), "records": records,
              "refusals": refusals()}
    if decode:
        from simflash.backends import validate_decode

        result["decode"] = []
        for config in decode:
            result["decode"].append(validate_decode.check(config, rng))
            if progress is not None:
                progress(result["decode"][-1])
    result["all_ok"] = all(r["ok"] for r in records + result.get("decode", []))
    return result


def version_configs(version: str, quick: bool = False) -> list[CheckConfig]:
    """The configurations to validate a kernel version on: those of default_configs it is built for,
    and (full sweep) for versions after the first, 128x128 tiles at d = 64 as well."""
    configs = default_configs(quick)
    if version != "v1" and not quick:
        configs += [CheckConfig(1000, 777, 64, 2, causal, variant, dtype, 128, 128)
                    for causal, variant in MASKS for dtype in ("float16", "bfloat16")]
    if version.startswith("v3"):  # its 128x128 tile at d = 128 too, over more KV tiles than buffers
        configs += ([CheckConfig(1000, 777, 128, 2, True, "upper_left", "float16", 128, 128),
                     CheckConfig(300, 1000, 128, 2, True, "lower_right", "bfloat16", 128, 128)] if quick else
                    [CheckConfig(n_q, n_kv, 128, 2, causal, variant, dtype, 128, 128)
                     for n_q, n_kv in ((1000, 777), (300, 1000)) for causal, variant in MASKS
                     for dtype in ("float16", "bfloat16")])
    return [c for c in configs if flash2.builds(version, c.block_q, c.block_kv, c.d)]
