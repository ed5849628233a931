"""Logical against physical traffic: the naive path and the FA-2 kernel under Nsight Compute.

One `ncu` process profiles every configuration (simflash.backends.ncu_target runs them in order),
with the GPU's clocks left alone (--clock-control none) and every cache flushed before each kernel
(--cache-control all), so each kernel starts cold, as the logical model assumes. Per kernel:

- logical bytes: the simulator's closed form (sf.model.naive_traffic / flash_traffic);
- instrumented bytes: what the kernel itself counted (FA-2 and the softmax; cuBLAS is not ours);
- the bytes L2 returned to the SMs (l1tex__m_xbar2l1tex_read_bytes.sum) and the L2 lookups the SMs
  caused (lts__t_sectors_srcunit_tex_op_{read,write}.sum x 32-byte sectors); recorded besides:
  the lookups that hit (..._op_read_lookup_hit.sum) and lts__t_bytes.sum (every unit's L2 traffic);
- DRAM bytes read and written: dram__bytes_read.sum, dram__bytes_write.sum;
- the kernel's duration under the profiler (gpu__time_duration.sum).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

import simflash as sf
from simflash.backends.kernels import HEAD_DIMS
from simflash.config import check_causal_variant, check_positive_int

# Our names for the ncu metrics collected; a missing optional one is dropped and reported.
METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_sm_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_sm_write_sectors": "lts__t_sectors_srcunit_tex_op_write.sum",
    "l2_sm_read_hit_sectors": "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "l2_all_bytes": "lts__t_bytes.sum",
    "l1_from_l2_bytes": "l1tex__m_xbar2l1tex_read_bytes.sum",
    "time_ns": "gpu__time_duration.sum",
}
REQUIRED = ("dram_read_bytes", "dram_write_bytes", "time_ns")
SECTOR_BYTES = 32
NAIVE_STAGES = ("gemm_qk", "softmax", "gemm_pv")
# How each of our kernels shows in ncu's "Kernel Name" column.
SOFTMAX_NAME, FLASH_NAME = "naive_softmax", "flash2_forward"


@attrs.frozen
class ProfileConfig:
    n: int
    d: int = 128
    heads: int = 32
    causal: bool = False
    causal_variant: str = "upper_left"
    naive: bool = True  # also profile the naive path (S and P grow as heads * n^2)
    block_q: int = 128
    block_kv: int = 64

    def __attrs_post_init__(self) -> None:
        for name in ("n", "d", "heads", "block_q", "block_kv"):
            check_positive_int(name, getattr(self, name))
        check_causal_variant(self.causal_variant)
        if self.d not in HEAD_DIMS:
            raise ValueError(f"d must be one of {list(HEAD_DIMS)} for the GPU kernel, got {self.d}")


def sweep_configs(d: int = 128) -> list[ProfileConfig]:
    """Where logical and physical traffic meet and part: heads 1..64 at N = 4096, N 1024..16384 at 32
    heads (the naive path up to N = 8192, its S and P then 4 GiB each), and the causal mask."""
    heads = [ProfileConfig(4096, d, h) for h in (1, 2, 4, 8, 16, 32, 64)]
    lengths = [ProfileConfig(n, d, 32, naive=n <= 8192) for n in (1024, 2048, 8192, 16384)]
    causal = [ProfileConfig(4096, d, h, causal=True) for h in (1, 32)]
    return heads + lengths + causal


def find_ncu() -> str:
    path = shutil.which("ncu")
    if path is None:
        raise RuntimeError("Nsight Compute's `ncu` is not on PATH; it ships with the CUDA toolkit")
    return path


def available_metrics(ncu: str) -> set[str]:
    """Base names of the metrics this GPU's counters provide (`ncu --query-metrics`)."""
    listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, check=True).stdout
    return {match.group(1) for match in re.finditer(r"^\s*(\w+__\w+)", listing, flags=re.MULTILINE)}


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels in launch order from ncu's --csv report: name and {metric: value in base units}."""
    rows = list(csv.reader(io.StringIO("\n".join(line for line in text.splitlines() if line.startswith('"')))))
    if not rows:
        return []
    header = rows[0]
    at = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    kernels: dict[str, dict] = {}
    for row in rows[1:]:
        kernel = kernels.setdefault(row[at["ID"]], {"name": row[at["Kernel Name"]], "metrics": {}})
        value = row[at["Metric Value"]].replace(",", "")
        try:
            kernel["metrics"][row[at["Metric Name"]]] = float(value)
        except ValueError:  # "n/a": the counter had no value for this kernel
            continue
    return [kernels[key] for key in sorted(kernels, key=int)]


def _take_until(kernels: list[dict], start: int, marker: str) -> tuple[list[dict], int]:
    """Kernels from `start` up to (not including) the first whose name holds `marker`."""
    end = start
    while end < len(kernels) and marker not in kernels[end]["name"]:
        end += 1
    if end == len(kernels):
        names = [k["name"] for k in kernels[start:]]
        raise RuntimeError(f"expected a {marker} kernel in the profile after position {start}, got {names}")
    return kernels[start:end], end


def assign_stages(kernels: list[dict], configs: list[ProfileConfig]) -> list[dict[str, list[dict]]]:
    """Split the launch-ordered kernels into each configuration's stages: before the softmax is
    gemm_qk (cuBLAS may launch more than one kernel), between it and FA-2 is gemm_pv."""
    out, at = [], 0
    for config in configs:
        stages: dict[str, list[dict]] = {}
        if config.naive:
            stages["gemm_qk"], at = _take_until(kernels, at, SOFTMAX_NAME)
            stages["softmax"], at = kernels[at:at + 1], at + 1
            stages["gemm_pv"], at = _take_until(kernels, at, FLASH_NAME)
        else:
            _, flash_at = _take_until(kernels, at, FLASH_NAME)
            if flash_at != at:
                raise RuntimeError(f"unexpected kernels before {FLASH_NAME}: {[k['name'] for k in kernels[at:flash_at]]}")
        stages[FLASH_NAME], at = kernels[at:at + 1], at + 1
        out.append(stages)
    if at != len(kernels):
        raise RuntimeError(f"{len(kernels) - at} profiled kernels left over: {[k['name'] for k in kernels[at:]]}")
    return out


def _measured(kernels: list[dict], metrics: dict[str, str]) -> dict:
    sums = {ours: sum(k["metrics"].get(theirs, 0.0) for k in kernels) for ours, theirs in metrics.items()}
    out = {key: round(value) for key, value in sums.items() if not key.endswith("_sectors")}
    if "l2_sm_read_sectors" in metrics and "l2_sm_write_sectors" in metrics:
        out["l2_sm_bytes"] = round(sums["l2_sm_read_sectors"] + sums["l2_sm_write_sectors"]) * SECTOR_BYTES
    if "l2_sm_read_sectors" in metrics and "l2_sm_read_hit_sectors" in metrics and sums["l2_sm_read_sectors"]:
        out["l2_read_hit_rate"] = sums["l2_sm_read_hit_sectors"] / sums["l2_sm_read_sectors"]
    out["dram_bytes"] = out["dram_read_bytes"] + out["dram_write_bytes"]
    out["ncu_kernels"] = [k["name"][:120] for k in kernels]
    return out


def _ledger_total(rows: list[list], kernel: str) -> int:
    return sum(read + write for name, _, read, write in rows if name == kernel)


def kernel_rows(config: ProfileConfig, stages: dict[str, list[dict]], counted: dict, metrics: dict[str, str]) -> list[dict]:
    """Per kernel of one configuration: logical, instrumented and measured bytes."""
    c = config
    rows = []
    if c.naive:
        logical = sf.model.naive_traffic(c.n, c.d, "float16", c.causal, heads=c.heads, causal_variant=c.causal_variant)
        for stage in NAIVE_STAGES:
            path_bytes = _ledger_total(counted["naive_ledger"], stage)
            rows.append({"kernel": stage, "logical_bytes": logical.by_kernel[stage].total_bytes,
                         "path_bytes": path_bytes, "instrumented_bytes": path_bytes if stage == "softmax" else None,
                         **_measured(stages[stage], metrics)})
    flash = sf.model.flash_traffic(c.n, c.d, c.block_q, c.block_kv, "float16", c.causal, heads=c.heads,
                                   causal_variant=c.causal_variant)
    instrumented = _ledger_total(counted["flash_instrumented"], FLASH_NAME)
    rows.append({"kernel": FLASH_NAME, "logical_bytes": flash.total_bytes, "path_bytes": instrumented,
                 "instrumented_bytes": instrumented, **_measured(stages[FLASH_NAME], metrics)})
    return rows


def run_ncu(ncu: str, metrics: list[str], target: str, spec: dict, raw_csv: Path | None = None) -> tuple[str, list, Any]:
    """Run `python -m target SPEC.json RESULT.json` under ncu: the GPU's clocks left alone, every cache
    flushed before each kernel (cold, as the logical model assumes), only the target's profiler range.
    Returns the command as one line (paths left out), the profiled kernels in launch order
    (parse_ncu_csv) and the target's RESULT; raw_csv keeps ncu's report."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path, result = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(spec))
        command = [ncu, "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
                   "--csv", "--print-units", "base", "--metrics", ",".join(metrics),
                   sys.executable, "-m", target, str(spec_path), str(result)]
        done = subprocess.run(command, capture_output=True, text=True)
        if raw_csv is not None:
            raw_csv.write_text(done.stdout)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"ncu failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        counted = json.loads(result.read_text())
    line = " ".join(["ncu", *command[1:command.index(sys.executable)]]) + f" python -m {target}"
    return line, parse_ncu_csv(done.stdout), counted


def profile(configs: list[ProfileConfig], seed: int = 0, raw_csv: Path | None = None) -> dict:
    """Profile every configuration in one ncu process; return the per-kernel rows."""
    ncu = find_ncu()
    have = available_metrics(ncu)
    metrics = {ours: theirs for ours, theirs in METRICS.items() if not have or theirs.rsplit(".", 1)[0] in have}
    missing = [theirs for ours, theirs in METRICS.items() if ours not in metrics]
    if any(name not in metrics for name in REQUIRED):
        raise RuntimeError(f"this GPU's counters lack required metrics: {missing}")
    command, kernels, counted = run_ncu(ncu, list(metrics.values()), "simflash.backends.ncu_target",
                                        {"seed": seed, "configs": [attrs.asdict(c) for c in configs]}, raw_csv)
    stages = assign_stages(kernels, configs)
    return {
        "ncu_command": command,
        "metrics": metrics,
        "metrics_missing": missing,
        "configs": [{"config": attrs.asdict(c), "kernels": kernel_rows(c, s, counts, metrics)}
                    for c, s, counts in zip(configs, stages, counted)],
    }
