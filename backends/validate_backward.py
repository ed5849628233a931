"""Correctness of the GPU backward against float64, a naive backward in the same dtype, and SDPA.

For each configuration, on fresh random q, k, v and output gradient dO:

- dQ, dK, dV: max |g - ref| against the float64 analytic gradients (`reference_backward`), and
  FlashAttention's rule per gradient: at most 2x the max error of a naive backward computed in the same
  storage dtype (`naive_backward`) plus a small atol (`gradient_atol`);
- the same numbers for PyTorch SDPA's flash backward where SDPA's flash backend takes the mask (none,
  or causal with n_q = n_kv), and the largest difference between its gradients and ours;
- the bytes the three kernels counted against the simulator's closed form
  sf.model.flash_backward_traffic (`defined_traffic`): exact integers;
- the forward's logsumexp L against float64's, and the forward's bytes (L included) against the
  simulator's closed form;
- the timed build: dK and dV bit for bit the instrumented build's (each CTA owns its KV tile), dQ
  within the rule (float32 atomics add in no fixed order); no NaN anywhere.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

import simflash as sf
from simflash.backends import flash2_backward
from simflash.backends.validate import CheckConfig, inputs, ledger_rows
from simflash.backends.validate import validate as forward_validate
from simflash.config import storage_dtype
from simflash.memory import Traffic
from simflash.numerics import ATOL_ROUNDOFFS, FLOAT32_UNIT_ROUNDOFF, max_abs_error, reference_mask, relative_error, upcast

GRADIENTS = ("dq", "dk", "dv")
LOGSUMEXP_RTOL = 1e-4  # the forward kernel's L (float32) against float64
MASKS = ((False, "upper_left"), (True, "upper_left"), (True, "lower_right"))


@attrs.frozen
class BackwardConfig(CheckConfig):
    """The forward's validation configuration, with the backward's default tiles."""

    # keyword-only: redeclared here, they follow the forward's fields (batch, kv_heads, ...) in positional order
    block_q: int = attrs.field(default=64, kw_only=True)
    block_kv: int = attrs.field(default=128, kw_only=True)

    @property
    def label(self) -> str:
        return "backward " + super().label


def default_configs(quick: bool = False) -> list[BackwardConfig]:
    """N in {1, 17, 128, 1000} x d in {64, 128} x {full, both causal variants} x {fp16, bf16}, n_q != n_kv
    both ways (KV tiles no query tile sees, query rows that see no key), and B_r = 128 at d = 64.
    quick: a small subset for smoke runs."""
    if quick:
        return [BackwardConfig(200, 200, 64, 2, True, "upper_left", "float16"),
                BackwardConfig(130, 77, 128, 1, True, "lower_right", "bfloat16"),
                BackwardConfig(77, 300, 64, 1, True, "upper_left", "float16")]
    configs = [BackwardConfig(n, n, d, 2, causal, variant, dtype)
               for n in (1, 17, 128, 1000) for d in (64, 128) for causal, variant in MASKS
               for dtype in ("float16", "bfloat16")]
    configs += [BackwardConfig(n_q, n_kv, d, 1, causal, variant, dtype)
                for n_q, n_kv in ((1, 1000), (17, 300), (300, 17), (1000, 2048), (2048, 1000))
                for causal, variant in MASKS for d, dtype in ((64, "float16"), (128, "bfloat16"))]
    configs += [BackwardConfig(1000, 777, 64, 2, causal, variant, "float16", block_q=128, block_kv=128) for causal, variant in MASKS]
    return configs


def reference_backward(q, k, v, do, causal: bool = False, causal_variant: str = "upper_left",
                       scale: float | None = None, dtype: str = "float16") -> tuple[np.ndarray, ...]:
    """(O, L, dq, dk, dv) in float64 on the storage-rounded inputs, from the definitions (FA-2, Algorithm 2):
    S = scale Q K^T (invisible keys -inf), P = softmax(S) (0 for a row with no visible key), O = P V,
    L = log rowsum(exp S) (+inf for a row with no visible key, as the forward writes it),
    dV = P^T dO, dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q."""
    Q, K, V, dO = (upcast(x, dtype) for x in (q, k, v, do))
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
    S = np.where(reference_mask(Q.shape[-2], K.shape[-2], causal, causal_variant), scale * Q @ K.swapaxes(-1, -2),
                 -np.inf)  # (..., n_q, n_kv)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = E.sum(axis=-1, keepdims=True)
    P = np.divide(E, l, out=np.zeros_like(E), where=l > 0)
    L = np.full(l.shape[:-1], np.inf)
    seen = l[..., 0] > 0
    L[seen] = m[..., 0][seen] + np.log(l[..., 0][seen])
    O = P @ V
    dP = dO @ V.swapaxes(-1, -2)
    dS = P * (dP - (dO * O).sum(axis=-1, keepdims=True))
    return O, L, scale * dS @ K, scale * dS.swapaxes(-1, -2) @ Q, P.swapaxes(-1, -2) @ dO


def naive_backward(q, k, v, do, causal: bool = False, causal_variant: str = "upper_left", scale: float | None = None,
                   dtype: str = "float16") -> tuple[np.ndarray, ...]:
    """(dq, dk, dv) as an eager framework computes them in the storage dtype: every tensor it keeps (S, P,
    O, dP, dS and the gradients) stored in that dtype, matrix products accumulated in float32, and the
    softmax's backward D = rowsum(P o dP) in float32."""
    store = storage_dtype(dtype)

    def stored(x: np.ndarray) -> np.ndarray:
        return x.astype(store).astype(np.float32)

    Q, K, V, dO = (stored(np.asarray(x, dtype=np.float32)) for x in (q, k, v, do))
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
    visible = reference_mask(Q.shape[-2], K.shape[-2], causal, causal_variant)
    S = np.where(visible, stored(np.float32(scale) * (Q @ K.swapaxes(-1, -2))), -np.inf)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = E.sum(axis=-1, keepdims=True)
    P = stored(np.divide(E, l, out=np.zeros_like(E), where=l > 0))
    dP = stored(dO @ V.swapaxes(-1, -2))
    dS = stored(P * (dP - (P * dP).sum(axis=-1, keepdims=True)))
    return (stored(np.float32(scale) * (dS @ K)), stored(np.float32(scale) * (dS.swapaxes(-1, -2) @ Q)),
            stored(P.swapaxes(-1, -2) @ dO))


def gradient_atol(v, do) -> float:
    """The rule's absolute slack: ATOL_ROUNDOFFS float32 roundoffs of max |dO| max |V|, the scale of dP's
    terms. It decides only gradients naive gets exactly (one key: dS = 0 there, while the kernel's
    D = rowsum(dO o O) and dP = dO V^T differ by float32 rounding)."""
    scale = float(np.abs(np.asarray(v, dtype=np.float64)).max(initial=0.0)
                  * np.abs(np.asarray(do, dtype=np.float64)).max(initial=0.0))
    return ATOL_ROUNDOFFS * FLOAT32_UNIT_ROUNDOFF * scale


def defined_traffic(n_q: int, n_kv: int, d: int, block_q: int = 64, block_kv: int = 128, dtype: str = "float16",
                    causal: bool = False, causal_variant: str = "upper_left", heads: int = 1) -> Traffic:
    """The three kernels' ledger: the simulator's closed form sf.model.flash_backward_traffic, in the
    backend's argument order (valid rows only; a KV tile no query tile visits writes zero dK_j, dV_j
    without loading K_j, V_j)."""
    return sf.model.flash_backward_traffic(n_q, d, block_q, block_kv, dtype, causal, n_kv=n_kv, heads=heads,
                                           causal_variant=causal_variant)


def model_traffic(c: BackwardConfig) -> Traffic:
    """The simulator's closed form for one validation configuration."""
    return defined_traffic(c.n_q, c.n_kv, c.d, c.block_q, c.block_kv, c.dtype, c.causal, c.causal_variant, c.heads)


def sdpa_gradients(q, k, v, do, causal: bool, scale: float, dtype: str) -> tuple[np.ndarray, ...] | str:
    """(dq, dk, dv) from PyTorch SDPA's flash backend on the same storage-rounded inputs, or why not."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return "torch is not installed"
    if causal and q.shape[-2] != k.shape[-2]:
        return "SDPA's flash backend takes is_causal only for n_q = n_kv"
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]

    def tensor(x, grad: bool = True):
        return torch.tensor(upcast(x, dtype)[None], device="cuda", dtype=torch_dtype, requires_grad=grad)

    Q, K, V = (tensor(x) for x in (q, k, v))
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # only flash: a refusal raises, never falls back
            out = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal, scale=scale)
            out.backward(tensor(do, grad=False))
    except RuntimeError as error:
        return f"SDPA refused: {str(error).splitlines()[0][:200]}"
    return tuple(x.grad[0].float().cpu().numpy() for x in (Q, K, V))


def _gradient_record(gpu, naive, ref, atol: float, dtype: str, sdpa=None) -> dict:
    error, naive_error = max_abs_error(gpu, ref), max_abs_error(naive, ref)
    record = {"gpu": error, "naive_same_dtype": naive_error, "atol": atol, "relative_gpu": relative_error(gpu, ref),
              "within_fa_rule": error <= 2 * naive_error + atol}
    if sdpa is not None:
        sdpa_error = max_abs_error(sdpa, ref)
        record.update(sdpa=sdpa_error, sdpa_within_fa_rule=sdpa_error <= 2 * naive_error + atol,
                      gpu_vs_sdpa_max_abs=max_abs_error(gpu, sdpa))
    return record


def check(config: BackwardConfig, rng: np.random.Generator) -> dict:
    """Run one configuration every way and record how the results compare."""
    c = config
    q = rng.standard_normal((c.heads, c.n_q, c.d), dtype=np.float32)
    k, v = (rng.standard_normal((c.heads, c.n_kv, c.d), dtype=np.float32) for _ in range(2))
    do = rng.standard_normal((c.heads, c.n_q, c.d), dtype=np.float32)
    common = inputs(c.causal, c.causal_variant, c.dtype)
    scale = 1.0 / math.sqrt(c.d)

    gpu = flash2_backward.flash_attention_backward(q, k, v, do, c.block_q, c.block_kv, **common)
    timed = flash2_backward.flash_attention_backward(q, k, v, do, c.block_q, c.block_kv, **common, instrumented=False)
    _, lse_ref, *ref = reference_backward(q, k, v, do, **common)
    naive = naive_backward(q, k, v, do, **common)
    sdpa = sdpa_gradients(q, k, v, do, c.causal, scale, c.dtype)
    forward_model = sf.model.flash_traffic(c.n_q, c.d, *flash2_backward.FORWARD_TILES, c.dtype, c.causal, n_kv=c.n_kv,
                                           heads=c.heads, causal_variant=c.causal_variant, write_logsumexp=True)
    atol = gradient_atol(upcast(v, c.dtype), upcast(do, c.dtype))
    mine = (gpu.dq, gpu.dk, gpu.dv)

    gradients = {}
    for index, name in enumerate(GRADIENTS):
        gradients[name] = _gradient_record(mine[index], naive[index], ref[index], atol, c.dtype,
                                           None if isinstance(sdpa, str) else sdpa[index])
    timed_dq_error = max_abs_error(timed.dq, ref[0])
    lse_gpu = gpu.forward.logsumexp
    assert lse_gpu is not None and gpu.traffic is not None  # the backward's forward writes L; instrumented
    same_infinities = bool(np.array_equal(np.isposinf(lse_gpu), np.isinf(lse_ref)))
    seen = np.isfinite(lse_ref)
    lse_diff = float(np.max(np.abs(lse_gpu[seen] - lse_ref[seen]) / np.maximum(1, np.abs(lse_ref[seen])), initial=0.0))
    model = model_traffic(c)
    record = {
        "config": attrs.asdict(c),
        "gradients": gradients,
        "sdpa": "ran" if not isinstance(sdpa, str) else sdpa,
        "nan_free": bool(all(np.isfinite(g.astype(np.float32)).all() for g in (*mine, timed.dq, timed.dk, timed.dv))
                         and not np.isnan(lse_gpu).any()),
        "timed": {
            "dk_dv_equal_instrumented": bool(np.array_equal(gpu.dk.view(np.uint16), timed.dk.view(np.uint16))
                                             and np.array_equal(gpu.dv.view(np.uint16), timed.dv.view(np.uint16))),
            "dq_error": timed_dq_error,
            "dq_within_fa_rule": timed_dq_error <= 2 * gradients["dq"]["naive_same_dtype"] + atol,
        },
        "forward": {
            "logsumexp_max_rel_diff": lse_diff,
            "logsumexp_same_infinities": same_infinities,
            "traffic_equals_model": gpu.forward.traffic == forward_model,
        },
        "traffic": {
            "instrumented": ledger_rows(gpu.traffic),
            "equals_definition": gpu.traffic == defined_traffic(c.n_q, c.n_kv, c.d, c.block_q, c.block_kv, c.dtype,
                                                                c.causal, c.causal_variant, c.heads),
            "equals_model": gpu.traffic == model,
        },
        "resources": gpu.resources,
    }
    record["ok"] = passed(record)
    return record


def within_rule(gradient: dict) -> bool:
    """FlashAttention's 2x rule against naive in the same dtype, or, where SDPA flash (FlashAttention-2's
    own backward) misses it too on the same inputs, an error no larger than SDPA flash's."""
    sdpa = gradient.get("sdpa")
    return bool(gradient["within_fa_rule"] or (sdpa is not None and gradient["gpu"] <= sdpa + gradient["atol"]))


def passed(record: dict) -> bool:
    """Every check of one record holds (records made before the closed form existed hold None for it)."""
    forward = record["forward"]
    return bool(all(within_rule(g) for g in record["gradients"].values()) and record["nan_free"]
                and record["timed"]["dk_dv_equal_instrumented"] and record["timed"]["dq_within_fa_rule"]
                and forward["logsumexp_same_infinities"] and forward["logsumexp_max_rel_diff"] <= LOGSUMEXP_RTOL
                and forward["traffic_equals_model"] and record["traffic"]["equals_definition"]
                and record["traffic"]["equals_model"] in (True, None))


def refusals() -> list[dict]:
    """Configurations the backward kernels are not built for are refused with a ValueError naming the argument."""
    # Any: arguments the kernels must refuse, so deliberately not of the types they take
    cases: dict[str, dict[str, Any]] = {"d=256": dict(d=256), "block_q=32": dict(block_q=32), "block_kv=64": dict(block_kv=64),
             "dtype=float32": dict(dtype="float32"),
             "block_q=128 at d=128 (256 KiB of shared memory)": dict(block_q=128, d=128)}
    out = []
    for label, change in cases.items():
        kwargs: dict[str, Any] = {"dtype": "float16", "block_q": 64, "block_kv": 128, "d": 64} | change
        q = np.ones((1, 8, kwargs.pop("d")), dtype=np.float32)
        try:
            flash2_backward.flash_attention_backward(q, q, q, q, **kwargs)
            out.append({"case": label, "refused": False, "message": ""})
        except ValueError as error:
            out.append({"case": label, "refused": True, "message": str(error)})
    return out


def validate(configs: list[BackwardConfig], seed: int | None = None, progress=None) -> dict:
    """Run every configuration on fresh inputs (seed recorded, so a run can be repeated)."""
    return forward_validate(configs, seed, progress, version=None, check=check, refusals=refusals)
