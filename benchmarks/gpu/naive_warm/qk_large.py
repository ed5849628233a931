"""The naive path's Q K^T GEMM (PyTorch's matmul, cuBLAS) for one head at N beyond the sweeps' 8,192, d = 128,
fp16, cold (Nsight Compute flushes the caches before it): the DRAM bytes it reads beyond Q + K, as a share
of K, and the nvjet kernel that ran, to see whether the re-reads of qk_rereads.txt keep growing with N.

    python benchmarks/gpu/naive_warm/qk_large.py OUT_DIR     # ncu over itself: qk_large.json, qk_large_ncu.csv
    python benchmarks/gpu/naive_warm/qk_large.py --show benchmarks/gpu/naive_warm/qk_large.json
"""

import json
import subprocess
import sys
from pathlib import Path

SEQUENCES = (4096, 6144, 8192, 10240, 12288, 16384)
D = 128
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def target() -> None:
    import torch

    for n in SEQUENCES:
        q, k = (torch.randn(1, n, D, device="cuda", dtype=torch.float16) for _ in range(2))
        torch.matmul(q, k.transpose(-1, -2))
        del q, k
    torch.cuda.synchronize()


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command = ["ncu", "--clock-control", "none", "--cache-control", "all", "--kernel-name", "regex:nvjet|gemm|Kernel",
               "--csv", "--print-units", "base", "--metrics", ",".join(METRICS), sys.executable, __file__, "--target"]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qk_large_ncu.csv").write_text(run.stdout)
    kernels = [k for k in parse_ncu_csv(run.stdout) if "nvjet" in k["name"] or "gemm" in k["name"].lower()]
    if len(kernels) != len(SEQUENCES):
        raise RuntimeError(f"{len(kernels)} GEMM kernels profiled, {len(SEQUENCES)} expected: "
                           f"{[k['name'][:60] for k in kernels]}")
    rows = [{"n": n, "d": D, "kernel": k["name"].split("(")[0], **{m: k["metrics"][m] for m in METRICS}}
            for n, k in zip(SEQUENCES, kernels)]
    (out / "qk_large.json").write_text(json.dumps({"command": " ".join(command), "rows": rows}, indent=1))
    show(out / "qk_large.json")


def show(path: Path) -> None:
    print("    N  DRAM read MiB  beyond Q + K, of K  time us  kernel")
    for row in json.loads(path.read_text())["rows"]:
        operand = row["n"] * row["d"] * 2
        beyond = row["dram__bytes_read.sum"] - 2 * operand
        print(f"{row['n']:5d}  {row['dram__bytes_read.sum'] / 2**20:13.1f}  {beyond / operand:18.0%}"
              f"  {row['gpu__time_duration.sum'] / 1e3:7.0f}  {row['kernel'][:70]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--target"]:
        target()
    elif sys.argv[1:2] == ["--show"]:
        show(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
