"""The FA-2 kernel versions under Nsight Compute: where each one's time goes.

One `ncu` process, clocks left alone (--clock-control none), caches flushed before each kernel,
profiles the timed build of every version asked for, and SDPA's flash kernel where PyTorch is there,
on the same inputs, per configuration. A short metric list, so one replay pass collects it:

- tensor_active_pct: sm__pipe_tensor_op_hmma_cycles_active (% of peak sustained, over active cycles);
- shared_wavefronts: l1tex__data_pipe_lsu_wavefronts_mem_shared (shared-memory wavefronts, all
  warps: ldmatrix, the async copies' stores, the epilogue);
- warps_active_pct: sm__warps_active (achieved occupancy, % of the SM's warp slots);
- dram_read_bytes, time_ns: dram__bytes_read, gpu__time_duration.

    python -m simflash.backends.kernel_profile SPEC.json   (the program ncu runs; prints nothing)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs
import numpy as np

from simflash.backends.bench import BenchConfig
from simflash.backends.flash2 import kernel_version, launch, poisoned_output
from simflash.backends.kernels import import_cupy
from simflash.backends.profile import available_metrics, find_ncu, parse_ncu_csv
from simflash.schedule import TileSchedule

METRICS = {
    "tensor_active_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "shared_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "warps_active_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_read_bytes": "dram__bytes_read.sum",
    "time_ns": "gpu__time_duration.sum",
}
SDPA_FLASH = "sdpa_flash"
DTYPE = "float16"


def _sdpa():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    return torch, SDPBackend, sdpa_kernel


def target(spec: dict) -> None:
    """Per configuration: every version's timed build once unprofiled (compiling it), then, inside
    one profiler range, each version once and SDPA flash once."""
    cupy = import_cupy()
    block_q, block_kv = spec["tiles"]
    found = _sdpa()
    for index, config in enumerate(spec["configs"]):
        c = BenchConfig(**config)
        rng = cupy.random.default_rng(spec["seed"] + index)
        Q, K, V = (rng.standard_normal((c.heads, c.n, c.d), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
        O = poisoned_output(Q.shape, DTYPE)
        sched = TileSchedule(c.n, c.n, block_q, block_kv, causal=c.causal)
        kernels = [kernel_version(version)(DTYPE, block_q, block_kv, c.d) for version in spec["versions"]]
        scale = 1.0 / float(np.sqrt(c.d))
        for kernel in kernels:
            launch(kernel, Q, K, V, O, sched, scale)
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.profilerStart()
        for kernel in kernels:
            launch(kernel, Q, K, V, O, sched, scale)
        if found is not None:
            torch, SDPBackend, sdpa_kernel = found
            q, k, v = (torch.from_dlpack(x).view(1, c.heads, c.n, c.d) for x in (Q, K, V))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c.causal)
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.profilerStop()
        del Q, K, V, O
        cupy.get_default_memory_pool().free_all_blocks()


def profile_versions(configs: list[BenchConfig], versions: tuple[str, ...], tiles: tuple[int, int] = (128, 64),
                     seed: int = 0, raw_csv: Path | None = None) -> dict:
    """Profile every version (and SDPA flash) on every configuration in one ncu process."""
    ncu = find_ncu()
    have = available_metrics(ncu)
    metrics = {ours: theirs for ours, theirs in METRICS.items() if not have or theirs.split(".", 1)[0] in have}
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.json"
        spec.write_text(json.dumps({"seed": seed, "tiles": list(tiles), "versions": list(versions),
                                    "configs": [attrs.asdict(c) for c in configs]}))
        command = [ncu, "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
                   "--csv", "--print-units", "base", "--metrics", ",".join(metrics.values()),
                   sys.executable, "-m", "simflash.backends.kernel_profile", str(spec)]
        done = subprocess.run(command, capture_output=True, text=True)
    if raw_csv is not None:
        raw_csv.write_text(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"ncu failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    kernels = parse_ncu_csv(done.stdout)
    mine = [k for k in kernels if "flash2_forward" in k["name"]]
    sdpa = [k for k in kernels if "flash_fwd" in k["name"]]  # SDPA flash's forward kernel, one per configuration
    if len(mine) != len(versions) * len(configs):
        raise RuntimeError(f"expected {len(versions)} of our kernels per configuration, profiled "
                           f"{[k['name'][:60] for k in kernels]}")
    rows = []
    for index, config in enumerate(configs):
        profiled = list(zip(versions, mine[index * len(versions):(index + 1) * len(versions)]))
        if len(sdpa) == len(configs):
            profiled.append((SDPA_FLASH, sdpa[index]))
        for name, kernel in profiled:
            measured = {key: kernel["metrics"].get(name) for key, name in metrics.items()}
            rows.append({"config": attrs.asdict(config), "kernel": name, "ncu_name": kernel["name"][:120],
                         "flops": config.flops, **measured})
    check_names(rows)
    return {
        "ncu_command": " ".join(["ncu", *command[1:command.index(sys.executable)]])
        + " python -m simflash.backends.kernel_profile",
        "metrics": metrics,
        "metrics_missing": [theirs for ours, theirs in METRICS.items() if ours not in metrics],
        "tiles": list(tiles),
        "rows": rows,
    }


def check_names(rows: list[dict]) -> None:
    """Each profiled kernel is the one its row names (ours by template name, SDPA's by its own)."""
    for row in rows:
        expected = {"v1": "flash2_forward<", "v2": "flash2_forward_v2<", "v3": "flash2_forward_v3<",
                    "v3-nopp": "flash2_forward_v3<", SDPA_FLASH: "flash_fwd"}[row["kernel"]]
        if expected not in row["ncu_name"]:
            raise RuntimeError(f"row {row['kernel']} profiled {row['ncu_name']!r}")


if __name__ == "__main__":
    target(json.loads(Path(sys.argv[1]).read_text()))
