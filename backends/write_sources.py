"""Where a kernel's DRAM writes come from: the counters that separate the L2's write sources.

The calibration sweep (calibrate.py) found DRAM writes that the logical writes cannot explain:
PyTorch SDPA's flash kernel writes up to 1.7x its output to DRAM, and the naive path's PV GEMM
writes about 2 MiB even when its whole output (1 MiB at N = 4096, H = 2, d = 64) is written at the
end of the kernel. This run profiles a few of those configurations again, caches flushed before
each kernel (ncu --cache-control all, as the cold sweep), with counters that say who writes:

- local-memory stores (register spills) against global stores, as the L1 sees them;
- L2 write sectors from the SMs (srcunit_tex), from every source (op_write), and the L2 traffic
  between its two partitions (srcunit_ltcfabric);
- DRAM bytes read and written, registers per thread.

Plus one probe of the flush itself: a kernel that writes 48 MiB, then a read-only reduction over
another 256 MiB. If the reduction shows DRAM writes, what the flush before it left to write back
was counted against the next kernel.

    python -m simflash.backends.write_sources OUT_DIR     (on the GPU machine; runs ncu itself)
    python -m simflash.backends.write_sources --target SPEC.json RESULT.json   (what ncu runs)

Writes OUT_DIR/write_sources_ncu.csv (ncu's raw report) and OUT_DIR/write_sources.json, and, when
cuobjdump and PyTorch are there, OUT_DIR/sdpa_resource_usage.txt (registers, stack and local bytes
of PyTorch's flash forward kernels, from its fatbinary).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_write_sectors_sm": "lts__t_sectors_srcunit_tex_op_write.sum",
    "l2_write_sectors_all": "lts__t_sectors_op_write.sum",
    "l2_fabric_sectors": "lts__t_sectors_srcunit_ltcfabric.sum",
    "l2_fabric_write_sectors": "lts__t_sectors_srcunit_ltcfabric_op_write.sum",
    "local_store_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "local_load_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "global_store_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "local_store_instructions": "smsp__sass_inst_executed_op_local_st.sum",
    "time_ns": "gpu__time_duration.sum",
}
LAUNCH = {"registers_per_thread": "launch__registers_per_thread"}
MiB = 1024**2


def _config(algorithm: str, n: int, heads: int, d: int, causal: bool = False) -> dict:
    return {"algorithm": algorithm, "n": n, "heads": heads, "d": d, "causal": causal, "block_q": 128, "block_kv": 64}


CONFIGS = [  # the most telling first: ncu's report is streamed to disk, so a run cut short keeps them
    {"algorithm": "flush_probe", "write_bytes": 48 * MiB, "read_bytes": 256 * MiB},
    _config("naive", 4096, 2, 64),
    _config("sdpa_flash", 131072, 4, 64),
    _config("sdpa_flash", 4096, 32, 128),
    _config("fa2", 4096, 32, 128),
    _config("sdpa_flash", 16384, 8, 64),
    _config("sdpa_flash", 32768, 4, 64, causal=True),
    _config("naive", 512, 48, 128),
]


def _probe(config: dict):
    from simflash.backends.kernels import import_cupy

    cupy = import_cupy()
    written = cupy.empty(config["write_bytes"] // 4, dtype=cupy.float32)
    read = cupy.ones(config["read_bytes"] // 4, dtype=cupy.float32)
    total = cupy.empty((), dtype=cupy.float32)

    def run() -> None:
        written.fill(1.0)  # leaves up to the L2's size of dirty lines behind
        cupy.sum(read, out=total)  # reads only: any DRAM write it shows is not its own
    return run


def target(argv: list[str]) -> None:
    """The program ncu profiles: per configuration, one unprofiled warm-up, then marker and group."""
    from simflash.backends.calibrate_target import MARKER, _group, profile_marked, release_memory
    from simflash.backends.kernels import import_cupy

    spec = json.loads(Path(argv[0]).read_text())
    cupy = import_cupy()
    marker_buffer = cupy.zeros(32, dtype=cupy.float32)
    marker = cupy.ElementwiseKernel("", "float32 x", "x += 1.0f", MARKER)
    for index, config in enumerate(spec["configs"]):
        run = _probe(config) if config["algorithm"] == "flush_probe" else _group(config, index)
        run()  # warm-up
        profile_marked(run, marker, marker_buffer)
        release_memory()
    Path(argv[1]).write_text(json.dumps({"configs": len(spec["configs"])}))


def _ncu(metrics: list[str], spec_path: Path, result_path: Path, report: Path) -> int:
    from simflash.backends.profile import find_ncu

    command = [find_ncu(), "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
               "--csv", "--print-units", "base", "--metrics", ",".join(metrics),
               sys.executable, "-m", "simflash.backends.write_sources", "--target", str(spec_path), str(result_path)]
    with report.open("w") as stream:
        return subprocess.run(command, check=False, stdout=stream, stderr=subprocess.STDOUT).returncode


def measure(out: Path, configs: list[dict] = CONFIGS, metrics: dict[str, str] = METRICS,
            name: str = "write_sources") -> dict:
    """Profile `configs` cold with `metrics` ({our name: ncu's}; those this GPU lacks are left out and
    listed), keeping ncu's raw report as out/{name}_ncu.csv."""
    from simflash.backends.calibrate import split_groups
    from simflash.backends.profile import available_metrics, find_ncu, parse_ncu_csv

    have = available_metrics(find_ncu())
    wanted = [m for m in metrics.values() if not have or m.rsplit(".", 1)[0] in have]
    missing = sorted(set(metrics.values()) - set(wanted))
    with tempfile.TemporaryDirectory() as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps({"configs": configs}))
        report = out / f"{name}_ncu.csv"
        code = _ncu(wanted + list(LAUNCH.values()), spec_path, result_path, report)
        if code != 0 or not result_path.exists():  # the launch statistic may be refused
            code = _ncu(wanted, spec_path, result_path, report)
        if code != 0 or not result_path.exists():
            raise RuntimeError(f"ncu failed (exit {code}):\n{report.read_text()[-3000:]}")
    groups = split_groups(parse_ncu_csv(report.read_text()), configs)
    rows = []
    for config, group in zip(configs, groups):
        rows.append({"config": config, "kernels": [
            {"name": k["name"][:120], **{ours: k["metrics"].get(theirs) for ours, theirs in {**metrics, **LAUNCH}.items()}}
            for k in group]})
    return {"command": "python -m simflash.backends.write_sources $OUT", "cache": "cold (ncu --cache-control all)",
            "missing_metrics": missing, "configs": rows}


def resource_usage(out: Path) -> None:
    """Registers, stack and local bytes of PyTorch's flash forward kernels, from its fatbinary."""
    import shutil

    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None or not library.exists():
        return
    try:
        done = subprocess.run([cuobjdump, "--dump-resource-usage", str(library)], check=False, capture_output=True,
                              text=True, timeout=100)
    except subprocess.TimeoutExpired:
        return
    keep, arch, lines = [], "?", done.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("arch"):
            arch = line.split("=")[-1].strip()
        elif "flash_fwd" in line and i + 1 < len(lines):
            keep.append(f"{arch} {line.strip()} {lines[i + 1].strip()}")
    (out / "sdpa_resource_usage.txt").write_text("\n".join(keep) + "\n")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--target":
        target(argv[1:])
        return
    import threading

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    usage = threading.Thread(target=resource_usage, args=(out,))
    usage.start()
    result = measure(out)
    usage.join()
    (out / "write_sources.json").write_text(json.dumps(result, indent=1))
    for entry in result["configs"]:
        for k in entry["kernels"]:
            values = {key: k[key] for key in ("dram_write_bytes", "l2_write_sectors_sm", "l2_write_sectors_all",
                                              "local_store_sectors", "registers_per_thread")}
            print(entry["config"]["algorithm"], entry["config"].get("n"), k["name"][:40], values)


if __name__ == "__main__":
    main(sys.argv[1:])
