"""The whole-chip calibration sweep: DRAM and L2 bytes and time of every kernel, under Nsight Compute.

Three implementations (the naive path, our FA-2 kernel, PyTorch SDPA's flash forward) over the
regimes where physical traffic departs from the logical count: naive with H x N^2 x 2 bytes of S
from 1 to 512 MiB; FA-2 with one head's K + V from 1 to 64 MiB, up to 96 heads, d = 64 and 128,
causal and not. Two cache modes:

- cold: `ncu --cache-control all` flushes every cache before each kernel;
- warm: `ncu --cache-control none --replay-mode application`, and the program flushes the L2 once
  before each group with a read-only reduction, so the naive path's three kernels share the L2 as in
  an application. (Kernel replay, ncu's default, saves and restores device memory around each
  profiled kernel when its metrics need more than one pass; that copy traffic evicts what the
  previous kernel left in the L2, so a warm measurement under kernel replay reads like a cold one.)

One ncu process per mode profiles every configuration (calibrate_target), with a marker kernel
before each group; the metric list is short enough for one pass. A third, unprofiled pass times
each group with CUDA events (warm, median of repeats).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from simflash.backends.calibrate_target import MARKER
from simflash.backends.profile import available_metrics, find_ncu, parse_ncu_csv
from simflash.model.measured import flash_stage

METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_write_sectors": "lts__t_sectors_srcunit_tex_op_write.sum",
    "l2_read_hit_sectors": "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "time_ns": "gpu__time_duration.sum",
    # launch statistics: free (no counter pass)
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "registers_per_thread": "launch__registers_per_thread",
    "shared_bytes_dynamic": "launch__shared_mem_per_block_dynamic",
    "shared_bytes_static": "launch__shared_mem_per_block_static",
    "occupancy_limit_registers": "launch__occupancy_limit_registers",
    "occupancy_limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "occupancy_limit_warps": "launch__occupancy_limit_warps",
}
# Warm runs replay the whole application once per pass: the fewest metrics, one pass.
WARM_METRICS = {ours: METRICS[ours] for ours in ("dram_read_bytes", "dram_write_bytes", "time_ns")}
SECTOR_BYTES = 32
CACHE_CONTROL = {"cold": ["--cache-control", "all"], "warm": ["--cache-control", "none", "--replay-mode", "application"]}
MiB = 1024**2


def _config(algorithm: str, n: int, heads: int, d: int = 128, causal: bool = False) -> dict:
    return {"algorithm": algorithm, "n": n, "heads": heads, "d": d, "causal": causal, "block_q": 128, "block_kv": 64}


def _sweep(naive_n: tuple[int, ...], s_mib: tuple[int, ...], naive_d64: tuple[tuple[int, int], ...],
           flash_shapes: tuple[tuple[int, int], ...]) -> list[dict]:
    """The naive path at each N with the head count giving about each size of S (within 30%), and at
    d = 64 for the (N, heads) given; then our FA-2 kernel and SDPA flash at each (N, heads), d = 128 and
    64, causal and not."""
    naive = []
    for n in naive_n:
        per_head = n * n * 2
        for target_mib in s_mib:
            heads = round(target_mib * MiB / per_head)
            if heads >= 1 and abs(heads * per_head / MiB - target_mib) / target_mib < 0.3:
                naive.append(_config("naive", n, heads))
    naive += [_config("naive", n, heads, d=64) for n, heads in naive_d64]
    flash = [_config(algorithm, n, heads, d, causal) for d in (128, 64) for causal in (False, True)
             for n, heads in flash_shapes for algorithm in ("fa2", "sdpa_flash")]
    return naive + flash


def sweep_configs() -> list[dict]:
    """Every configuration of the calibration sweep (the fit and the held-out rows are chosen later)."""
    return _sweep((256, 512, 1024, 2048, 4096, 8192), (1, 4, 12, 24, 32, 48, 64, 128, 256, 512),
                  ((1024, 16), (2048, 4), (4096, 2), (4096, 8)),
                  ((4096, 32), (4096, 96), (8192, 16), (8192, 64), (16384, 8), (16384, 32), (32768, 4), (32768, 24),
                   (65536, 2), (65536, 12), (131072, 1), (131072, 4)))


def validation_configs() -> list[dict]:
    """A second sweep over the same regimes on configurations the calibration sweep does not hold (other
    sequence lengths and head counts). The L2's capacity spread was chosen with it in view."""
    return _sweep((384, 768, 1536, 3072, 6144), (2, 8, 20, 40, 100, 300), ((768, 40), (1536, 12), (3072, 6)),
                  ((6144, 48), (12288, 24), (24576, 6), (24576, 16), (49152, 3), (49152, 8), (98304, 2)))


def unseen_configs() -> list[dict]:
    """A third sweep, on configurations neither of the others holds, measured after every figure of the
    model was fixed: nothing in the model has seen it."""
    return _sweep((320, 640, 1280, 2560, 5120), (3, 10, 30, 60, 150, 400), ((640, 56), (1280, 20), (2560, 8)),
                  ((5120, 64), (10240, 20), (20480, 10), (20480, 24), (40960, 4), (40960, 12), (81920, 3),
                   (114688, 1)))


def blind_configs() -> list[dict]:
    """A fourth sweep, on configurations none of the others holds, defined and measured after the naive
    path's P V GEMM waves and the flush residue's ramp were chosen (with the first three in view)."""
    return _sweep((448, 896, 1792, 3584, 7168), (6, 16, 50, 80, 200, 350), ((896, 24), (1792, 10), (3584, 4)),
                  ((7168, 40), (14336, 12), (28672, 8), (28672, 20), (57344, 2), (57344, 6), (90112, 2),
                   (122880, 1)))


def confirm_configs() -> list[dict]:
    """A fifth sweep, on configurations none of the others holds, defined and measured after the cohort
    weight was chosen with the first four in view."""
    return _sweep((576, 1152, 2304, 4608, 6656), (5, 14, 36, 90, 180, 450), ((1152, 16), (2304, 6), (4608, 2)),
                  ((9216, 28), (18432, 14), (36864, 5), (36864, 16), (53248, 4), (73728, 2), (106496, 1),
                   (126976, 2)))


def fresh_configs() -> list[dict]:
    """A sixth sweep, on configurations none of the others holds, defined and measured after SDPA's spill
    figures were fitted (with the first five in view)."""
    return _sweep((704, 1408, 2816, 5632, 7424), (7, 18, 45, 110, 220, 380), ((1408, 14), (2816, 5), (5632, 2)),
                  ((11264, 24), (22528, 9), (45056, 6), (45056, 10), (61440, 3), (86016, 2), (110592, 1),
                   (129024, 2)))


def recheck_configs() -> list[dict]:
    """A seventh sweep, on configurations none of the others holds, defined and measured after SDPA's KV
    order and the busiest-SM compute term were chosen (with the first six in view)."""
    return _sweep((832, 1664, 3328, 4992, 7936), (9, 26, 60, 130, 260, 420), ((1664, 9), (3328, 3), (4992, 2)),
                  ((7680, 48), (15360, 20), (30720, 6), (51200, 5), (69632, 3), (94208, 2), (102400, 3),
                   (118784, 1)))


def verify_configs() -> list[dict]:
    """An eighth sweep, on configurations none of the others holds, defined and measured after the
    seventh's figures were fixed; it judged an L2 for the naive path built on the streaming probe
    (docs/physical.md), which was not kept."""
    return _sweep((480, 960, 1920, 3840, 5888), (11, 22, 50, 120, 240, 400), ((960, 30), (1920, 7), (3840, 3)),
                  ((6656, 40), (13312, 16), (26624, 10), (47104, 4), (63488, 3), (77824, 2), (100352, 2),
                   (116736, 1)))


def splitkv_configs() -> list[dict]:
    """A ninth sweep: PyTorch SDPA's grids too small to fill the chip, which it runs split-KV (FA-2's
    heuristic, heads x ceil(N / 64) below 0.8 x 2 x SMs), at d = 128 and 64, causal and not; defined and
    measured after that path was modelled on the five split-KV rows of the floor probe
    (benchmarks/gpu/sdpa_kv_order/floor.json)."""
    shapes = ((512, 2), (1024, 1), (1024, 3), (2048, 2), (3072, 1), (3072, 3), (4096, 2), (6144, 1), (6144, 2),
              (8192, 1), (10240, 1), (12288, 1))
    return [_config("sdpa_flash", n, heads, d, causal) for d in (128, 64) for causal in (False, True)
            for n, heads in shapes]


def later_configs() -> list[dict]:
    """A tenth sweep, on configurations none of the others holds, defined and measured after O's write weight in
    the FA-2 kernels was adopted (with the first nine in view)."""
    return _sweep((544, 1088, 2176, 4352, 6912), (13, 28, 55, 140, 280, 460), ((1088, 20), (2176, 8), (4352, 2)),
                  ((6400, 44), (12800, 18), (25600, 7), (25600, 14), (43008, 5), (59392, 3), (83968, 2),
                   (108544, 1)))


def lead_configs() -> list[dict]:
    """An eleventh sweep, on configurations none of the others holds, defined and measured after the naive
    softmax's writes came to trail its reads (with the first ten in view)."""
    return _sweep((608, 1216, 2432, 4864, 7680), (10, 24, 45, 90, 200, 400), ((1216, 18), (2432, 6), (4864, 2)),
                  ((9728, 30), (19456, 12), (38912, 6), (87040, 2)))


SWEEPS = {"calibration": sweep_configs, "validation": validation_configs, "unseen": unseen_configs,
          "blind": blind_configs, "confirm": confirm_configs, "fresh": fresh_configs, "recheck": recheck_configs,
          "verify": verify_configs, "splitkv": splitkv_configs, "later": later_configs, "lead": lead_configs}


def split_groups(kernels: list[dict], configs: list[dict]) -> list[list[dict]]:
    """Cut the launch-ordered kernels at the marker kernels: one group per configuration."""
    groups: list[list[dict]] = []
    for kernel in kernels:
        if MARKER in kernel["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(kernel)
    if len(groups) != len(configs):
        raise RuntimeError(f"found {len(groups)} marked groups in the profile for {len(configs)} configurations")
    return groups


def kernel_rows(config: dict, group: list[dict]) -> list[dict]:
    """One row per kernel of the group, named as the simulator's ledger names it."""
    names = [k["name"] for k in group]
    if config["algorithm"] == "naive":
        softmax = next(i for i, name in enumerate(names) if "naive_softmax" in name)
        stages = {"gemm_qk": group[:softmax], "softmax": group[softmax:softmax + 1], "gemm_pv": group[softmax + 1:]}
    else:  # flash2_forward, or PyTorch's split-KV pair where the grid is small
        stages = {}
        for kernel in group:
            stages.setdefault(flash_stage(kernel["name"]), []).append(kernel)
    rows = []
    for stage, kernels in stages.items():
        sums = {ours: sum(k["metrics"].get(theirs, 0.0) for k in kernels) for ours, theirs in METRICS.items()
                if not ours.startswith(("grid", "block", "registers", "shared", "occupancy"))}
        launch = {ours: kernels[0]["metrics"].get(theirs) for ours, theirs in METRICS.items()
                  if ours.startswith(("grid", "block", "registers", "shared", "occupancy"))}
        rows.append({
            "kernel": stage,
            "ncu_kernels": [k["name"][:100] for k in kernels],
            "dram_read_bytes": round(sums["dram_read_bytes"]),
            "dram_write_bytes": round(sums["dram_write_bytes"]),
            "l2_read_bytes": round(sums["l2_read_sectors"]) * SECTOR_BYTES,
            "l2_write_bytes": round(sums["l2_write_sectors"]) * SECTOR_BYTES,
            "l2_read_hit_bytes": round(sums["l2_read_hit_sectors"]) * SECTOR_BYTES,
            "time_s": sums["time_ns"] * 1e-9,
            "launch": launch,
        })
    return rows


def _run_target(spec: dict, prefix: list[str]) -> tuple[str, list]:
    with tempfile.TemporaryDirectory() as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(spec))
        command = [*prefix, sys.executable, "-m", "simflash.backends.calibrate_target", str(spec_path), str(result_path)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not result_path.exists():
            raise RuntimeError(f"{command[0]} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout, json.loads(result_path.read_text())


def measure(configs: list[dict], cache: str, seed: int = 0, raw_csv: Path | None = None) -> dict:
    """Profile every configuration in one ncu process in cache mode `cache`."""
    ncu = find_ncu()
    have = available_metrics(ncu)
    wanted = WARM_METRICS if cache == "warm" else METRICS
    metrics = [theirs for theirs in wanted.values() if not have or theirs.rsplit(".", 1)[0] in have]
    prefix = [ncu, "--clock-control", "none", *CACHE_CONTROL[cache], "--profile-from-start", "off",
              "--csv", "--print-units", "base", "--metrics", ",".join(metrics)]
    stdout, _ = _run_target({"seed": seed, "cache": cache, "configs": configs}, prefix)
    if raw_csv is not None:
        raw_csv.write_text(stdout)
    groups = split_groups(parse_ncu_csv(stdout), configs)
    return {
        "cache": cache,
        "ncu_command": " ".join(["ncu", *prefix[1:]]) + " python -m simflash.backends.calibrate_target",
        "configs": [{"config": c, "kernels": kernel_rows(c, g)} for c, g in zip(configs, groups)],
    }


def time_groups(configs: list[dict], seed: int = 0) -> dict:
    """CUDA-event time of each configuration's group, warm from the read-only flush (no profiler)."""
    _, results = _run_target({"seed": seed, "cache": "warm", "time": True, "configs": configs}, [])
    return {"timer": "CUDA events around the group, after a read-only L2 flush; median of 5", "configs": results}
