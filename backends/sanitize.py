"""compute-sanitizer over the simflash kernels on small configurations.

`python -m simflash.backends.sanitize` is the program the sanitizer runs: both builds of every
version of the FA-2 kernel (ragged tiles, both causal variants, n_q != n_kv, fp16 and bf16) and both builds of the naive
softmax (vector and scalar row paths), each result checked against the float64 reference. Only our
kernels run (no cuBLAS), so what the sanitizer reports is about them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np

from simflash.backends import flash2
from simflash.backends.kernels import SOFTMAX_THREADS, SoftmaxKernel, import_cupy
from simflash.backends.validate import default_configs, inputs
from simflash.numerics import reference_attention, relative_error, within_tolerance
from simflash.schedule import TileSchedule

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
CLEAN = re.compile(r"ERROR SUMMARY: 0 errors|0 hazards displayed \(0 errors, 0 warnings\)")


def _softmax_reference(S: np.ndarray, visible: np.ndarray) -> np.ndarray:
    x = np.where(visible, S.astype(np.float64), -np.inf)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(m), 0.0, m))
    l = e.sum(axis=-1, keepdims=True)
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0)


def target() -> None:
    """Run the small configurations; raise if any result is wrong."""
    cupy = import_cupy()
    rng = np.random.default_rng()
    for c in default_configs(quick=True):
        q, k, v = (rng.standard_normal((c.heads, n, c.d), dtype=np.float32) for n in (c.n_q, c.n_kv, c.n_kv))
        common = inputs(c.causal, c.causal_variant, c.dtype)
        ref = reference_attention(q, k, v, c.causal, c.causal_variant, dtype=c.dtype)
        for version in flash2.VERSIONS:
            for instrumented in (True, False):
                traced = 0 if instrumented else None  # the first head's first tile
                out = flash2.flash_attention(q, k, v, c.block_q, c.block_kv, **common, instrumented=instrumented,
                                             version=version, trace_head=traced, trace_tile=traced).out
                error = relative_error(out, ref)
                if not within_tolerance(error, c.dtype):
                    raise AssertionError(f"{version} {c.label} instrumented={instrumented}: relative error {error:.3g}")
                print(f"checked flash2_forward {version}, {'instrumented' if instrumented else 'timed'} build, "
                      f"{c.label}: relative error {error:.2e}")
    for n_q, n_kv, causal, variant in ((33, 200, True, "lower_right"), (40, 77, True, "upper_left"), (5, 64, False, "upper_left")):
        S = (rng.standard_normal((n_q, n_kv), dtype=np.float32) * 2).astype(np.float16)  # scaled scores
        sched = TileSchedule(n_q, n_kv, n_q, n_kv, causal=causal, causal_variant=variant)
        for instrumented in (True, False):
            S_d = cupy.asarray(S)
            P_d = cupy.zeros_like(S_d)
            counters = cupy.zeros(2, dtype=cupy.uint64)
            SoftmaxKernel("float16", instrumented).function(n_kv)(
                (n_q,), (SOFTMAX_THREADS,),
                (S_d, P_d, np.int32(n_q), np.int32(n_kv), np.int32(causal),
                 np.int32(sched.diagonal_offset), counters if instrumented else np.uint64(0)),
                shared_mem=n_kv * 2)
            expected = _softmax_reference(S, sched.mask(0, 0))
            error = float(np.max(np.abs(P_d.get().astype(np.float64) - expected)))
            if error > 1e-3:
                raise AssertionError(f"softmax n_q={n_q} n_kv={n_kv}: max abs error {error:.3g}")
            print(f"checked naive_softmax, {'instrumented' if instrumented else 'timed'} build, n_q={n_q} "
                  f"n_kv={n_kv} causal={causal} {variant}: max abs error {error:.2e}")


def run(tool: str) -> dict:
    """Run the target under `compute-sanitizer --tool tool`; the output and whether it came back clean."""
    if tool not in TOOLS:
        raise ValueError(f"tool must be one of {list(TOOLS)}, got {tool!r}")
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        raise RuntimeError("compute-sanitizer is not on PATH; it ships with the CUDA toolkit")
    command = [sanitizer, "--tool", tool, "--error-exitcode", "1", sys.executable, "-m", "simflash.backends.sanitize"]
    done = subprocess.run(command, capture_output=True, text=True)
    output = done.stdout + done.stderr
    return {"tool": tool, "command": " ".join(["compute-sanitizer", *command[1:command.index(sys.executable)]])
            + " python -m simflash.backends.sanitize",
            "exit_code": done.returncode, "clean": done.returncode == 0 and bool(CLEAN.search(output)), "output": output}


if __name__ == "__main__":
    target()
