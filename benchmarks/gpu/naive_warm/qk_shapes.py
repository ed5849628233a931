"""Which operand cuBLAS's Q K^T GEMM reads again, and how that grows: S = Q K^T for one head with Q of N rows
and K of M rows (d = 128, fp16; PyTorch's matmul), N and M each 2,048 to 16,384, cold (Nsight Compute flushes
the caches before it): the DRAM bytes it reads beyond Q + K, as a share of Q and of K, and the nvjet kernel
that ran. If the excess follows one operand's size and the other's count of tiles, that operand is the one
read again (qk_large.txt has the square shapes' growth with N).

    python benchmarks/gpu/naive_warm/qk_shapes.py OUT_DIR     # ncu over itself: qk_shapes.json, qk_shapes_ncu.csv
    python benchmarks/gpu/naive_warm/qk_shapes.py --show benchmarks/gpu/naive_warm/qk_shapes.json
"""

import json
import subprocess
import sys
from pathlib import Path

SIZES = (2048, 4096, 8192, 16384)
SHAPES = [(n, m) for n in SIZES for m in SIZES]  # (rows of Q, rows of K)
D = 128
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def run_gemms(shapes: list[tuple[int, ...]]) -> None:
    """S = Q K^T at each (rows of Q, rows of K[, heads]), one head where no count is given: what ncu profiles."""
    import torch

    for n, m, *heads in shapes:
        q = torch.randn(*heads or [1], n, D, device="cuda", dtype=torch.float16)
        k = torch.randn(*heads or [1], m, D, device="cuda", dtype=torch.float16)
        torch.matmul(q, k.transpose(-1, -2))
        del q, k
    torch.cuda.synchronize()


def profile_gemms(script: str, out: Path, name: str, shapes: list[tuple[int, ...]]) -> Path:
    """Run `script --target` (which calls run_gemms(shapes)) under ncu, cold; write out/{name}_ncu.csv and
    out/{name}.json (the command and a row per GEMM: n, m, heads, d, the kernel, the metrics); the JSON's path."""
    from simflash.backends.profile import parse_ncu_csv

    command = ["ncu", "--clock-control", "none", "--cache-control", "all", "--kernel-name", "regex:nvjet|gemm|Kernel",
               "--csv", "--print-units", "base", "--metrics", ",".join(METRICS), sys.executable, script, "--target"]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}_ncu.csv").write_text(run.stdout)
    kernels = [k for k in parse_ncu_csv(run.stdout) if "nvjet" in k["name"] or "gemm" in k["name"].lower()]
    if len(kernels) != len(shapes):
        raise RuntimeError(f"{len(kernels)} GEMM kernels profiled, {len(shapes)} expected: "
                           f"{[k['name'][:60] for k in kernels]}")
    rows = [{"n": n, "m": m, "heads": heads[0] if heads else 1, "d": D, "kernel": k["name"].split("(")[0],
             **{x: k["metrics"][x] for x in METRICS}} for (n, m, *heads), k in zip(shapes, kernels)]
    (out / f"{name}.json").write_text(json.dumps({"command": " ".join(command), "rows": rows}, indent=1))
    return out / f"{name}.json"


def show(path: Path) -> None:
    print("N (Q rows)  M (K rows)  DRAM read MiB  beyond Q + K MiB  of Q  of K  time us  kernel")
    for row in json.loads(path.read_text())["rows"]:
        q, k = row["n"] * row["d"] * 2, row["m"] * row["d"] * 2
        beyond = row["dram__bytes_read.sum"] - q - k
        print(f"{row['n']:10d}  {row['m']:10d}  {row['dram__bytes_read.sum'] / 2**20:13.1f}  {beyond / 2**20:16.2f}"
              f"  {beyond / q:4.0%}  {beyond / k:4.0%}  {row['gpu__time_duration.sum'] / 1e3:7.0f}  {row['kernel'][:60]}")


def cli(script: str, name: str, shapes: list[tuple[int, ...]], show) -> None:
    """A GEMM probe's entry: --target runs the GEMMs (what ncu profiles), --show JSON prints a saved run,
    OUT_DIR profiles them into it."""
    if sys.argv[1:] == ["--target"]:
        run_gemms(shapes)
    elif sys.argv[1:2] == ["--show"]:
        show(Path(sys.argv[2]))
    else:
        show(profile_gemms(script, Path(sys.argv[1]), name, shapes))


if __name__ == "__main__":
    cli(__file__, "qk_shapes", SHAPES, show)
