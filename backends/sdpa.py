"""Which kernel did PyTorch's SDPA run? Constrain it to one backend at a time, watch with torch.profiler.

sdpa_kernel(backend) enables only that backend, so an input it cannot take fails instead of quietly
falling back to the math path; the profiler's kernel names are the evidence of what ran. A fused
backend whose kernels look like the math path's (a softmax kernel and no attention kernel) is flagged.
"""

from __future__ import annotations

import contextlib
from typing import Any

BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
FUSED_MARKERS = ("flash", "fmha", "attention", "attn", "sdpa")  # in a fused attention kernel's name
MATH_MARKERS = ("softmax",)  # the math path materialises P with a softmax kernel


def _looks_fused(name: str) -> bool:
    return any(marker in name.lower() for marker in FUSED_MARKERS)


def classify(backend: str, kernels: list[str]) -> str:
    """'fused', 'math', or 'FALLBACK TO MATH' (a fused backend that ran the math path's kernels)."""
    fused = any(_looks_fused(name) for name in kernels)
    mathlike = any(marker in name.lower() for name in kernels for marker in MATH_MARKERS)
    if backend != "MATH" and backend != "default" and mathlike and not fused:
        return "FALLBACK TO MATH"
    return "fused" if fused else "math"


def sdpa_check(n: int, d: int, causal: bool = False, heads: int = 32, dtype: str = "float16") -> dict:
    """Run SDPA once per backend (and unconstrained) on (1, heads, n, d) inputs; report kernel names."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.profiler import ProfilerActivity, profile
    except ImportError as error:
        raise RuntimeError("sdpa-check needs PyTorch with CUDA") from error
    if not torch.cuda.is_available():
        raise RuntimeError("sdpa-check needs a CUDA GPU visible to PyTorch")
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch_dtype) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    results = []
    for backend in (*BACKENDS, "default"):
        entry: dict[str, Any] = {"backend": backend}  # a JSON record
        try:
            context = sdpa_kernel(getattr(SDPBackend, backend)) if backend != "default" else contextlib.nullcontext()
            with context:
                sdpa(q, k, v, is_causal=causal)  # warm-up, and the refusal if the backend cannot run
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
                    sdpa(q, k, v, is_causal=causal)
                    torch.cuda.synchronize()
            kernels = sorted({event.key for event in prof.key_averages() if _on_device(event)})
            entry.update(kernels=kernels, verdict=classify(backend, kernels))
        except RuntimeError as error:
            entry.update(kernels=[], verdict="refused", error=str(error).splitlines()[0][:200])
        results.append(entry)
    return {"n": n, "d": d, "heads": heads, "causal": causal, "dtype": dtype, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "backends": results}


def _on_device(event) -> bool:
    """A kernel the GPU ran (not a CPU-side operator)."""
    return getattr(event, "device_type", None) is not None and "CUDA" in str(event.device_type) and (
        getattr(event, "self_device_time_total", 0) > 0 or getattr(event, "device_time_total", 0) > 0)

