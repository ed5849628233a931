"""What the simulator's bookkeeping costs: the simulator against bare NumPy doing the same math.

Each measurement runs in a fresh child process (`in_child`) with BLAS on one thread. Ratios alternate
the two sides in that process, median of `repeat` runs each; the large run reports its wall time and
the child's peak resident set, everything included.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

import simflash as sf
from simflash.config import STATE_DTYPE, StorageDtypeName, storage_dtype
from simflash.numerics import round_to_storage


def bare_tiled_attention(Q, K, V, block_q: int, block_kv: int, scale: float) -> np.ndarray:
    """FA-2's tiled loop in plain NumPy, one head, no causal mask: the simulator's math, no ledger.

    The inputs are converted to float32 once, up front, tiles are views, and P is rounded to the storage
    dtype with the simulator's `round_to_storage` (NumPy's float16 cast is an element-by-element loop):
    the fastest natural way to write it by hand.
    """
    storage = Q.dtype
    n_q, d = Q.shape
    O = np.empty_like(Q)
    Q, K, V = (x.astype(STATE_DTYPE) for x in (Q, K, V))
    for r0 in range(0, n_q, block_q):
        Q_i = Q[r0:r0 + block_q]
        m_i = np.full(Q_i.shape[0], -np.inf, dtype=STATE_DTYPE)
        l_i = np.zeros(Q_i.shape[0], dtype=STATE_DTYPE)
        a_i = np.zeros((Q_i.shape[0], d), dtype=STATE_DTYPE)
        for c0 in range(0, K.shape[0], block_kv):
            K_j = K[c0:c0 + block_kv]
            V_j = V[c0:c0 + block_kv]
            S_ij = (Q_i @ K_j.T) * scale
            m_new = np.maximum(m_i, S_ij.max(axis=1))
            m_base = np.where(m_new == -np.inf, 0.0, m_new)
            alpha = np.exp(m_i - m_base)
            P_ij = np.exp(S_ij - m_base[:, None])
            l_i = alpha * l_i + P_ij.sum(axis=1)
            a_i = alpha[:, None] * a_i + round_to_storage(P_ij, storage) @ V_j
            m_i = m_new
        O[r0:r0 + block_q] = np.divide(a_i, l_i[:, None], out=np.zeros_like(a_i), where=l_i[:, None] > 0)
    return O


def plain_attention(Q, K, V, scale: float) -> np.ndarray:
    """Attention in plain NumPy with S and P kept in the storage dtype: naive's math, no ledger."""
    storage = Q.dtype
    S = (Q.astype(STATE_DTYPE) @ K.astype(STATE_DTYPE).T * scale).astype(storage)
    S = S.astype(STATE_DTYPE)
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    P = (E / E.sum(axis=-1, keepdims=True)).astype(storage)
    return (P.astype(STATE_DTYPE) @ V.astype(STATE_DTYPE)).astype(storage)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_pair(simulated: Callable[[], object], bare: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median seconds of each, alternating the two so both see the same machine state."""
    sim_times, bare_times = [], []
    for _ in range(repeat):
        sim_times.append(_seconds(simulated))
        bare_times.append(_seconds(bare))
    return statistics.median(sim_times), statistics.median(bare_times)


def random_inputs(n: int, d: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, d), dtype=np.float32).astype(storage_dtype(dtype)) for _ in range(3))
    return q, k, v


def flash_overhead(n: int = 4096, d: int = 128, dtype: StorageDtypeName = "float16", block_q: int = 128,
                   block_kv: int = 64, repeat: int = 3) -> dict:
    q, k, v = random_inputs(n, d, dtype)
    scale = 1 / math.sqrt(d)
    sim, bare = time_pair(
        lambda: sf.flash_attention(q, k, v, block_q, block_kv, dtype=dtype, trace="stats"),
        lambda: bare_tiled_attention(q, k, v, block_q, block_kv, scale),
        repeat,
    )
    return {"what": "FA-2 simulation (trace='stats') vs bare NumPy tiled loop (inputs converted once)",
            "n": n, "d": d, "dtype": dtype, "simulated_s": sim, "bare_s": bare, "ratio": sim / bare,
            "target_ratio": 1.5}


def naive_overhead(n: int = 4096, d: int = 128, dtype: StorageDtypeName = "float16", repeat: int = 3) -> dict:
    q, k, v = random_inputs(n, d, dtype)
    scale = 1 / math.sqrt(d)
    sim, bare = time_pair(
        lambda: sf.naive_attention(q, k, v, dtype=dtype),
        lambda: plain_attention(q, k, v, scale),
        repeat,
    )
    return {"what": "naive simulation vs plain NumPy attention (S, P in the storage dtype)", "n": n,
            "d": d, "dtype": dtype, "simulated_s": sim, "bare_s": bare, "ratio": sim / bare,
            "target_ratio": 1.3}


def flash_large_run(n: int = 32768, d: int = 128, dtype: StorageDtypeName = "float16") -> dict:
    """FA-2 with trace='none' at N = n: its wall time and the peak resident memory of this process.

    Run it with `in_child` for a figure of its own: VmHWM is the process's own high-water mark, while
    ru_maxrss would start from the parent's resident size, which Linux carries across fork and exec.
    """
    q, k, v = random_inputs(n, d, dtype)
    start = time.perf_counter()
    run = sf.flash_attention(q, k, v, dtype=dtype, trace="none")
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as status:
        peak = re.search(r"VmHWM:\s+(\d+) kB", status.read())
    if peak is None:
        raise RuntimeError("/proc/self/status has no VmHWM line")
    peak_kib = int(peak.group(1))
    return {"what": "FA-2 simulation (trace='none'): wall time and peak resident memory, whole child process",
            "n": n, "d": d, "dtype": dtype, "seconds": seconds, "target_s": 30,
            "peak_rss_mb": peak_kib * 1024 / 1e6, "target_mb": 250, "total_bytes": run.traffic.total_bytes,
            "naive_S_would_be_mb": n * n * 4 / 1e6}


def bare_large_run(n: int = 32768, d: int = 128, dtype: StorageDtypeName = "float16", block_q: int = 128,
                   block_kv: int = 64) -> dict:
    """The bare tiled loop at N = n: what the same math costs on this machine now, without the simulator."""
    q, k, v = random_inputs(n, d, dtype)
    return {"seconds": _seconds(lambda: bare_tiled_attention(q, k, v, block_q, block_kv, 1 / math.sqrt(d)))}


def physical_prediction_run(n: int = 131072, heads: int = 32, d: int = 128) -> dict:
    """The whole-chip model's traffic-only prediction of FA-2 (L2, DRAM bytes and time): its wall time."""
    from simflash.model.physical import predict

    start = time.perf_counter()
    kernel = predict("fa2", n, d, heads=heads).kernel("flash2_forward")
    return {"what": "whole-chip prediction of FA-2 (traffic only: schedule, L2, DRAM bytes, time)", "n": n,
            "heads": heads, "d": d, "seconds": time.perf_counter() - start, "target_s": 10,
            "dram_read_bytes": kernel.dram_read_bytes}


# Tiles are small matrices. With a second BLAS thread that had to wait for a core another process was
# using, single runs of 0.5 s took up to 48 s on the 2-core machine the figures come from.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def in_child(measurement: str, **kwargs: object) -> dict:
    """Run `simflash.bench.<measurement>(**kwargs)` in a fresh Python process, BLAS on one thread."""
    code = f"import json, simflash.bench as bench; print(json.dumps(bench.{measurement}(**{kwargs!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **ONE_BLAS_THREAD})
    return json.loads(done.stdout)
