"""Logical against physical traffic of the backward: our three kernels and PyTorch SDPA's FA-2 backward
kernels under Nsight Compute, every configuration in one ncu process (ncu_target_backward runs them),
the clocks left alone (--clock-control none) and every cache flushed before each kernel
(--cache-control all), so each kernel starts cold as the logical model assumes.

Per kernel: the logical bytes of the ledger at the tile sizes that kernel uses (ours: B_r x B_c as
configured; FA-2's: read off its Flash_bwd_kernel_traits<d, B_r, B_c, ...> name), what our kernels
counted themselves, DRAM bytes read and written, every unit's L2 traffic (lts__t_bytes.sum) and the
duration under the profiler.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

import simflash as sf

from simflash.backends.kernels import BACKWARD_BLOCK_KV, BACKWARD_BLOCK_Q, BACKWARD_HEAD_DIMS
from simflash.backends.profile import available_metrics, find_ncu, run_ncu
from simflash.config import check_positive_int

METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_all_bytes": "lts__t_bytes.sum",
    "time_ns": "gpu__time_duration.sum",
}
OURS = ("flash2_backward_preprocess", "flash2_backward", "flash2_backward_convert")  # launch order
# The ledger kernel each of FA-2's backward kernels does the work of, by a marker in its name.
FA2_ROLES = {"dot_do_o": "flash2_backward_preprocess", "dq_dk_dv": "flash2_backward",
             "convert_dq": "flash2_backward_convert"}
FA2_TRAITS = re.compile(r"Flash_bwd_kernel_traits<\s*(\d+),\s*(\d+),\s*(\d+)")  # <d, kBlockM, kBlockN, ...>


@attrs.frozen
class BackwardProfileConfig:
    n: int = 4096
    d: int = 128
    heads: int = 32
    causal: bool = False
    block_q: int = 64
    block_kv: int = 128

    def __attrs_post_init__(self) -> None:
        for name in ("n", "d", "heads"):
            check_positive_int(name, getattr(self, name))
        for name, value, choices in (("d", self.d, BACKWARD_HEAD_DIMS), ("block_q", self.block_q, BACKWARD_BLOCK_Q),
                                     ("block_kv", self.block_kv, BACKWARD_BLOCK_KV)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {list(choices)} for the GPU backward, got {value}")


def split_kernels(kernels: list[dict], configs: list[BackwardProfileConfig]) -> list[tuple[list[dict], list[dict]]]:
    """Each configuration's (ours, SDPA's) kernels from the launch-ordered profile: our three, by name,
    then everything up to the next configuration's first kernel."""
    starts = [at for at, kernel in enumerate(kernels) if OURS[0] in kernel["name"]]
    if len(starts) != len(configs):
        raise RuntimeError(f"expected {len(configs)} runs of {OURS[0]} in the profile, found {len(starts)}: "
                           f"{[k['name'][:60] for k in kernels]}")
    out = []
    for at, end in zip(starts, [*starts[1:], len(kernels)]):
        ours = kernels[at:at + len(OURS)]
        names = [re.sub(r"^void\s+", "", k["name"]).split("<")[0] for k in ours]
        if names != list(OURS):
            raise RuntimeError(f"expected our kernels {list(OURS)} in order, got {names}")
        out.append((ours, kernels[at + len(OURS):end]))
    return out


def measured(kernel: dict) -> dict:
    """The collected metrics of one kernel under our names (base units, integers)."""
    return {ours: round(kernel["metrics"][theirs]) for ours, theirs in METRICS.items()
            if theirs in kernel["metrics"]}


def _logical(c: BackwardProfileConfig, block_q: int, block_kv: int) -> dict[str, int]:
    """Logical bytes per ledger kernel at these tiles: the simulator's closed form."""
    traffic = sf.model.flash_backward_traffic(c.n, c.d, block_q, block_kv, "float16", c.causal, heads=c.heads)
    return {kernel: flow.total_bytes for kernel, flow in traffic.by_kernel.items()}


def kernel_rows(c: BackwardProfileConfig, ours: list[dict], theirs: list[dict], counted: dict) -> list[dict]:
    """Per kernel of one configuration: who ran it, its ledger role and tiles, logical, instrumented and
    measured bytes."""
    instrumented: dict[str, int] = {}
    for kernel, _, read, write in counted["instrumented"]:
        instrumented[kernel] = instrumented.get(kernel, 0) + read + write
    logical = _logical(c, c.block_q, c.block_kv)
    rows = [{"side": "ours", "kernel": role, "name": k["name"][:120], "tiles": f"{c.block_q}x{c.block_kv}",
             "logical_bytes": logical[role], "instrumented_bytes": instrumented[role], **measured(k)}
            for role, k in zip(OURS, ours)]
    traits = next((FA2_TRAITS.search(k["name"]) for k in theirs if FA2_TRAITS.search(k["name"])), None)
    fa2_tiles = (int(traits[2]), int(traits[3])) if traits else None
    fa2_logical = _logical(c, *fa2_tiles) if fa2_tiles else {}
    for k in theirs:
        role = next((ledger for marker, ledger in FA2_ROLES.items() if marker in k["name"]), None)
        rows.append({"side": "sdpa_flash", "kernel": role, "name": k["name"][:120],
                     "tiles": f"{fa2_tiles[0]}x{fa2_tiles[1]}" if fa2_tiles else None,
                     "logical_bytes": None if role is None else fa2_logical.get(role), "instrumented_bytes": None, **measured(k)})
    return rows


def profile(configs: list[BackwardProfileConfig], seed: int = 0, raw_csv: Path | None = None) -> dict:
    """Profile every configuration in one ncu process; return the per-kernel rows."""
    ncu = find_ncu()
    have = available_metrics(ncu)
    missing = [theirs for theirs in METRICS.values() if have and theirs.rsplit(".", 1)[0] not in have]
    if missing:
        raise RuntimeError(f"this GPU's counters lack required metrics: {missing}")
    command, kernels, counted = run_ncu(ncu, list(METRICS.values()), "simflash.backends.ncu_target_backward",
                                        {"seed": seed, "configs": [attrs.asdict(c) for c in configs]}, raw_csv)
    groups = split_kernels(kernels, configs)
    return {
        "ncu_command": command,
        "metrics": METRICS,
        "configs": [{"config": attrs.asdict(c), "sdpa_call": counts["sdpa_call"],
                     "kernels": kernel_rows(c, ours, theirs, counts)}
                    for c, (ours, theirs), counts in zip(configs, groups, counted)],
    }
