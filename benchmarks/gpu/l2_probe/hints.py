"""Why the naive P V GEMM, warm, writes back the P the softmax left dirty at about the pace its misses come in
(benchmarks/gpu/naive_warm/pv_writes.txt), where a plain read stream leaves dirty data alone until it and the data
pass 35 to 45 MiB together (probe.py): an L2 eviction hint on cuBLAS's loads of P, or reading the dirty data while
the stream comes in? Each case after a read-only flush:

- `read`: a kernel writes W (X MiB, dirty), then a kernel reads W and a fresh buffer R (Y MiB) side by side, every
  load plain (`hint` 0) or with an L2 evict_first cache policy (`hint` 1): what of the dirty W the fills of R write
  back when the reads of W mark it to go first;
- `gemm`: a fill writes P (heads x N x N, fp16, dirty), then the naive backend's P V GEMM (cuBLAS,
  backends/naive.py) reads it, V of d columns.

Application replay, no cache control, as the warm sweeps are measured.

    python benchmarks/gpu/l2_probe/hints.py OUT_DIR     # runs ncu over itself: hints.json, hints_ncu.csv
    python benchmarks/gpu/l2_probe/hints.py --show benchmarks/gpu/l2_probe/hints.json

The SASS of the first P V GEMM kernel, where its TMA loads would carry an L2 cache-policy operand (hints_sass.csv):

    ncu --set none --section SourceCounters --kernel-name regex:nvjet --launch-count 1 --page source \
        --print-source sass --csv python3 benchmarks/gpu/l2_probe/hints.py --target > hints_sass.csv

Printed beside each `read` case: the DRAM writes of the read kernel the model's L2 predicts (the machine file's,
the kernels replayed in 256 KiB blocks), and what probe.py measured for R read alone after the same W (`stream`).
"""

import json
import sys
from pathlib import Path

from probe import BLOCK, GRID, MiB, SOURCE, chunks, kernel_row, profile, run

HERE = Path(__file__).resolve().parent
REPLAY_BLOCK = 256 * 1024

READS = [(24, y, hint) for y in (8, 16, 32) for hint in (0, 1)]  # (X, Y, hint)
GEMMS = [(heads, 2048, d) for heads in (2, 3) for d in (128, 1024)]  # (heads, N, d): P of 16 and 24 MiB
HINT_SOURCE = SOURCE + r"""
__device__ float4 load(const float4* p, int hint, unsigned long long policy) {
  if (!hint) return *p;
  float4 v;
  asm volatile("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(policy));
  return v;
}
extern "C" __global__ void hint_read(const float4* w, unsigned long long nw, const float4* r, unsigned long long nr,
                                     int hint, float* never) {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  float s = 0.f;
  const unsigned long long n = nw > nr ? nw : nr;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
    if (i < nw) { const float4 v = load(w + i, hint, policy); s += v.x + v.y + v.z + v.w; }
    if (i < nr) { const float4 v = load(r + i, hint, policy); s += v.x + v.y + v.z + v.w; }
  }
  if (s == -1.f) never[0] = s;
}
"""


def target() -> None:
    import cupy

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: backends/
    from backends.naive import gemm

    module = cupy.RawModule(code=HINT_SOURCE)
    write, flush, read = (module.get_function(k) for k in ("probe_write", "flush_read", "hint_read"))
    W, R = cupy.ones(64 * MiB // 4, dtype=cupy.float32), cupy.ones(64 * MiB // 4, dtype=cupy.float32)
    F = cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    grid, block = (GRID,), (BLOCK,)
    for x, y, hint in READS:
        flush(grid, block, (F, chunks(512), same, never))
        write(grid, block, (W, chunks(x)))
        read(grid, block, (W, chunks(x), R, chunks(y), cupy.int32(hint), never))
    for heads, n, d in GEMMS:
        P, O = cupy.empty((heads, n, n), dtype=cupy.float16), cupy.empty((heads, n, d), dtype=cupy.float16)
        V = cupy.full((heads, n, d), 1e-3, dtype=cupy.float16)
        flush(grid, block, (F, chunks(512), same, never))
        P.fill(1e-3)
        gemm("float16", False, d, n, n, 1.0, V, d, P, n, O, d)
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(__file__, out, "hints_ncu.csv")
    kernels = parse_ncu_csv(csv_text)
    after_flush = [kernels[i + 1:i + 3] for i, k in enumerate(kernels) if k["name"].startswith("flush_read")]
    cases = [{"pattern": "read", "x_mib": x, "y_mib": y, "hint": hint} for x, y, hint in READS]
    cases += [{"pattern": "gemm", "heads": heads, "n": n, "d": d} for heads, n, d in GEMMS]
    if len(after_flush) != len(cases):
        raise RuntimeError(f"{len(after_flush)} flushes profiled, {len(cases)} expected")
    rows = [{**case, "kernels": [kernel_row(k) for k in pair]} for case, pair in zip(cases, after_flush)]
    (out / "hints.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    show(rows)


def predicted_write_bytes(x_mib: int, y_mib: int, make=None, beside: bool = True) -> int:
    """DRAM bytes an L2 (`make(gpu)`; the machine file's, simflash.chip.l2_cache, by default) has the `read` case's
    second kernel write: W written, then R read, W read beside it block for block (`beside`) or not at all (probe.py's
    `stream` pattern)."""
    from simflash.chip import l2_cache
    from simflash.config import gpu_spec

    l2 = (make or l2_cache)(gpu_spec("H200"))
    l2.flush()
    written, fresh = x_mib * MiB // REPLAY_BLOCK, y_mib * MiB // REPLAY_BLOCK
    l2.kernel = "write"
    for block in range(written):
        l2.write(("W", block), REPLAY_BLOCK)
    l2.end_kernel()
    l2.kernel = "read"
    for block in range(max(written, fresh)):
        if beside and block < written:
            l2.read(("W", block), REPLAY_BLOCK)
        if block < fresh:
            l2.read(("R", block), REPLAY_BLOCK)
    l2.end_kernel()
    return l2.traffic().by_kernel["read"].dram_write_bytes


def stream_alone_write_bytes() -> dict[tuple[int, int], int]:
    """{(X, Y): DRAM bytes written by R read alone after W}, probe.py's `stream` pattern as measured."""
    return {(r["x_mib"], r["y_mib"]): r["kernels"][1]["dram_write_bytes"]
            for r in json.loads((HERE / "probe.json").read_text())["rows"] if r["pattern"] == "stream"}


def show(rows: list[dict]) -> None:
    alone = stream_alone_write_bytes()
    for r in rows:
        cells = "  ".join(f"{k['name'][:32]:32s}: R {k['dram_read_bytes'] / MiB:6.2f} W {k['dram_write_bytes'] / MiB:6.2f}"
                          for k in r["kernels"])
        if r["pattern"] == "gemm":
            print(f"gemm {r['heads']} heads N = {r['n']} d = {r['d']:4d}:  {cells}")
            continue
        hint = "evict_first" if r["hint"] else "plain      "
        extra = "" if r["hint"] else (f"  (the model: W {predicted_write_bytes(r['x_mib'], r['y_mib']) / MiB:5.2f}; "
                                      f"R alone: W {alone[r['x_mib'], r['y_mib']] / MiB:5.2f})")
        print(f"read X = {r['x_mib']} MiB, Y = {r['y_mib']:2d}, {hint}:  {cells}{extra}")


if __name__ == "__main__":
    run(target, main, lambda path: show(json.loads(path.read_text())["rows"]))
