"""Where SDPA's causal DRAM reads beyond Q, K and V come from when K and V cannot outgrow the L2.

Over the committed sweeps, PyTorch's FA-2 kernel at d = 128 with the causal mask reads about 1% of its
K and V re-reads from DRAM even when one head's K + V is 2 MiB (miss_rates.txt); at d = 64, or without
the mask, about 0.01%. The whole-chip model has none of it. This run profiles, cold (ncu
--cache-control all), grids that fit the L2 whole: one head (or a few) whose CTAs are all resident at
once, so no K or V tile can be evicted between two of its reads. Beside the DRAM bytes: the L2's read
sectors from the SMs and those that missed, and the kernel's local-memory (register spill) loads, all of
them and those that missed the L1 (those go to the L2). Simflash's own kernel (no spills) is the control.

    python benchmarks/gpu/sdpa_kv_order/floor.py OUT_DIR   # on the GPU machine: OUT_DIR/floor.json, floor_ncu.csv
    python benchmarks/gpu/sdpa_kv_order/floor.py --show benchmarks/gpu/sdpa_kv_order/floor.json

Printed per configuration: DRAM MiB read beyond Q + K + V, as a share of the logical K and V re-reads,
and the local loads that went to the L2, in MiB.
"""

import json
import sys
from pathlib import Path

from simflash.backends import write_sources
from simflash.chip import kernel_profile
from simflash.config import MiB
from simflash.model.calibration import KERNEL_OF
from simflash.model.traffic import flash_traffic


def _config(algorithm: str, n: int, heads: int, d: int, causal: bool) -> dict:
    return {"algorithm": algorithm, "n": n, "heads": heads, "d": d, "causal": causal, "block_q": 128, "block_kv": 64}


CONFIGS = [
    *(_config("sdpa_flash", n, 1, 128, True) for n in (2048, 4096, 8192, 16384, 32768)),
    _config("sdpa_flash", 16384, 2, 128, True),
    *(_config("sdpa_flash", n, 1, 128, False) for n in (4096, 16384)),
    *(_config("sdpa_flash", n, 1, 64, True) for n in (4096, 16384, 32768)),
    *(_config("fa2", n, 1, 128, True) for n in (4096, 16384)),
    _config("sdpa_flash", 4096, 8, 128, True),  # 256 CTAs: one wave of eight heads
    _config("sdpa_flash", 4096, 32, 128, True),  # four waves, as in the calibration sweep
]
METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_read_sectors_sm": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_read_miss_sectors_sm": "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
    "local_load_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "local_load_l1_miss_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum",
    "local_store_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "time_ns": "gpu__time_duration.sum",
}


def kv_rereads(config: dict) -> int:
    """Bytes of K and V the CTAs read beyond the first read of each tile: the FA-2 ledger's reads at the
    kernel's own tiles, less the compulsory Q, K and V."""
    n, d, heads = config["n"], config["d"], config["heads"]
    block_q, block_kv = kernel_profile(KERNEL_OF[config["algorithm"]]).tiles(d)
    logical = flash_traffic(n, d, block_q, block_kv, causal=config["causal"], heads=heads).read_bytes
    return logical - 3 * n * d * 2 * heads


def show(result: dict) -> None:
    """A row per configuration, its kernels summed: PyTorch runs grids of fewer CTAs than about 0.8 x the
    SMs as split-KV (a split kernel and a combine kernel, marked), whose partial outputs add reads."""
    print("algorithm   d    causal N       heads  beyond Q+K+V MiB  share of K/V re-reads  local loads to L2 MiB"
          "  L2 read misses MiB")
    for entry in result["configs"]:
        c, kernels = entry["config"], entry["kernels"]
        total = {key: sum(k.get(key) or 0 for k in kernels)
                 for key in ("dram_read_bytes", "local_load_l1_miss_sectors", "l2_read_miss_sectors_sm")}
        beyond = total["dram_read_bytes"] - 3 * c["n"] * c["d"] * 2 * c["heads"]
        print(f"{c['algorithm']:11s} {c['d']:<4d} {c['causal']!s:6s} {c['n']:<7d} {c['heads']:<6d} "
              f"{beyond / MiB:16.2f}  {100 * beyond / kv_rereads(c):20.3f}%  "
              f"{total['local_load_l1_miss_sectors'] * 32 / MiB:20.1f}  {total['l2_read_miss_sectors_sm'] * 32 / MiB:18.1f}"
              + ("  (split-KV)" if len(kernels) > 1 else ""))


def probe_main(argv: list[str], name: str, configs: list[dict], metrics: dict[str, str], show) -> None:
    """`--show FILE` prints a committed result; `OUT_DIR` profiles `configs` cold into OUT_DIR/{name}.json."""
    if argv[0] == "--show":
        show(json.loads(Path(argv[1]).read_text()))
        return
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    result = write_sources.measure(out, configs, metrics, name=name)
    result["command"] = f"python benchmarks/gpu/sdpa_kv_order/{name}.py $OUT"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    show(result)


if __name__ == "__main__":
    probe_main(sys.argv[1:], "floor", CONFIGS, METRICS, show)
