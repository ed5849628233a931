"""What the H200's L2 does with dirty data: four access patterns of plain streaming kernels, each
after a read-only flush, measured by Nsight Compute (DRAM bytes read and written per kernel).

    python benchmarks/gpu/l2_probe/probe.py OUT_DIR          # runs ncu over itself: OUT_DIR/probe.json, probe_ncu.csv
    python benchmarks/gpu/l2_probe/probe.py --target         # the program ncu profiles

Patterns (sizes in MiB; W and R are distinct buffers, each kernel reads or writes its buffer once, in
address order, from every SM):
- stream:        write W (X), then read R (Y): how much of the dirty W a read stream writes back;
- reread:        write W (X), then read W: how much of a written buffer is still in the L2;
- stream_reread: write W (X), read R (Y), read W: what of W a stream leaves;
- write_write:   write W (X), then write R (Y): how much of the dirty W a write stream writes back.
"""

import json
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20


def read_kernel(name: str) -> str:
    """A kernel that reads n 16-byte chunks in address order, chunk i by CTA (i + shift) mod the grid's,
    and writes nothing (the buffers never sum to -1). Named apart so the flushes can be told apart."""
    return r"""
extern "C" __global__ void NAME(const float4* p, unsigned long long n, int shift, float* never) {
  const unsigned long long block = (blockIdx.x + shift) % gridDim.x;
  float s = 0.f;
  for (unsigned long long i = block * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == -1.f) never[0] = s;
}
""".replace("NAME", name)


SOURCE = r"""
extern "C" __global__ void probe_write(float4* p, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] = make_float4(i, i, i, i);
}
""" + read_kernel("probe_read") + read_kernel("flush_read")
GRID, BLOCK = 132 * 4, 256
STREAM = [(x, y) for x in (8, 16, 24, 32) for y in (4, 8, 16, 32, 64, 128)]
REREAD = [(x, 0) for x in (8, 12, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 96)]
STREAM_REREAD = [(x, y) for x in (8, 16, 24) for y in (8, 16, 32, 64)]
WRITE_WRITE = [(x, y) for x in (8, 16, 24, 32) for y in (8, 16, 32, 64)]
PATTERNS = {"stream": STREAM, "reread": REREAD, "stream_reread": STREAM_REREAD, "write_write": WRITE_WRITE}
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def chunks(mib: int):
    """16-byte chunks in `mib` MiB, as the kernels take a count."""
    import cupy

    return cupy.uint64(mib * MiB // 16)


def profile(script: str, out: Path, csv_name: str) -> tuple[str, str]:
    """Run `script --target` under ncu (application replay, no cache control: the program flushes) and save
    the raw CSV as out/csv_name; the command and the CSV text."""
    command = ["ncu", "--clock-control", "none", "--cache-control", "none", "--replay-mode", "application",
               "--csv", "--print-units", "base", "--metrics", ",".join(METRICS), sys.executable, script, "--target"]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / csv_name).write_text(run.stdout)
    return " ".join(command), run.stdout


def profile_cases(script: str, out: Path, name: str, kernel: str, cases: list[dict], show) -> None:
    """Profile `script --target`, which launches one kernel named `kernel` per case (dicts of the case's
    fields, in launch order); write out/{name}_ncu.csv and out/{name}.json (the command, the grid's CTAs and
    a row per case: its fields, DRAM bytes read and time) and show the JSON."""
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(script, out, f"{name}_ncu.csv")
    profiled = [k["metrics"] for k in parse_ncu_csv(csv_text) if k["name"].startswith(kernel)]
    if len(profiled) != len(cases):
        raise RuntimeError(f"{len(profiled)} {kernel} kernels profiled, {len(cases)} expected")
    rows = [{**case, "dram_read_bytes": k["dram__bytes_read.sum"], "time_ns": k["gpu__time_duration.sum"]}
            for case, k in zip(cases, profiled)]
    (out / f"{name}.json").write_text(json.dumps({"command": command, "ctas": GRID, "rows": rows}, indent=1))
    show(out / f"{name}.json")


def read_pairs(script: str, out: Path, name: str, kernels: tuple[str, ...], cases: list) -> list[dict]:
    """Profile `script --target`, whose kernels named `kernels` come in pairs (a first read, the read
    again), one pair per case in launch order; write out/{name}_ncu.csv and out/{name}.json (the command
    and a row per case: its fields, both reads' DRAM bytes, the first's time) and print them."""
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(script, out, f"{name}_ncu.csv")
    profiled = [k["metrics"] for k in parse_ncu_csv(csv_text) if k["name"].startswith(kernels)]
    if len(profiled) != 2 * len(cases):
        raise RuntimeError(f"{len(profiled)} kernels profiled, {2 * len(cases)} expected")
    rows = []
    for case, first, again in zip(cases, profiled[::2], profiled[1::2]):
        rows.append({**case, "first_dram_read_bytes": first["dram__bytes_read.sum"],
                     "second_dram_read_bytes": again["dram__bytes_read.sum"],
                     "first_time_ns": first["gpu__time_duration.sum"]})
        print("  ".join(f"{k}={v}" for k, v in case.items()),
              f" first read {rows[-1]['first_dram_read_bytes'] / MiB:6.1f} MiB from DRAM,"
              f" second {rows[-1]['second_dram_read_bytes'] / MiB:6.1f}")
    (out / f"{name}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    return rows


def target() -> None:
    import cupy

    module = cupy.RawModule(code=SOURCE)
    write, read, flush = (module.get_function(name) for name in ("probe_write", "probe_read", "flush_read"))
    W, R, F = (cupy.ones(size // 4, dtype=cupy.float32) for size in (128 * MiB, 256 * MiB, 512 * MiB))
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    grid, block = (GRID,), (BLOCK,)

    for pattern, sizes in PATTERNS.items():
        for x, y in sizes:
            flush(grid, block, (F, chunks(512), same, never))
            write(grid, block, (W, chunks(x)))
            if pattern in ("stream", "stream_reread"):
                read(grid, block, (R, chunks(y), same, never))
            if pattern == "write_write":
                write(grid, block, (R, chunks(y)))
            if pattern in ("reread", "stream_reread"):
                read(grid, block, (W, chunks(x), same, never))
    cupy.cuda.Device().synchronize()


def rows_from_csv(text: str) -> list[dict]:
    """Each pattern's kernels from ncu's CSV, in launch order (the flushes and CuPy's fills left out)."""
    from simflash.backends.profile import parse_ncu_csv

    kernels = [k for k in parse_ncu_csv(text) if k["name"].startswith("probe_")]
    rows, at = [], 0
    for pattern, sizes in PATTERNS.items():
        steps = 3 if pattern == "stream_reread" else 2
        for x, y in sizes:
            group = kernels[at:at + steps]
            at += steps
            rows.append({"pattern": pattern, "x_mib": x, "y_mib": y, "kernels": [kernel_row(k) for k in group]})
    if at != len(kernels):
        raise RuntimeError(f"{len(kernels)} probe kernels profiled, {at} expected")
    return rows


def kernel_row(kernel: dict) -> dict:
    """A profiled kernel's name, DRAM bytes read and written and duration, as the probes' JSON holds them."""
    return {"name": kernel["name"].split("(")[0], "dram_read_bytes": kernel["metrics"].get("dram__bytes_read.sum"),
            "dram_write_bytes": kernel["metrics"].get("dram__bytes_write.sum"),
            "time_ns": kernel["metrics"].get("gpu__time_duration.sum")}


def main(out: Path) -> None:
    command, csv_text = profile(__file__, out, "probe_ncu.csv")
    rows = rows_from_csv(csv_text)
    (out / "probe.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    for row in rows:
        cells = "  ".join(f"{k['name']}: R {k['dram_read_bytes'] / MiB:6.1f} W {k['dram_write_bytes'] / MiB:6.1f}"
                          for k in row["kernels"])
        print(f"{row['pattern']:14s} X={row['x_mib']:3d} Y={row['y_mib']:3d}  {cells}")


def run(target, main, show=None) -> None:
    """A probe script's entry: with --target, launch its kernels (what ncu profiles); with --show JSON, print
    the table of a saved run (where the probe has one); with OUT_DIR, profile them into it."""
    if sys.argv[1:] == ["--target"]:
        target()
    elif show is not None and sys.argv[1:2] == ["--show"]:
        show(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))


if __name__ == "__main__":
    run(target, main)
