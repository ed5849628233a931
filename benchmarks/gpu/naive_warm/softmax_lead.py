"""Why the naive softmax leaves more of P dirty in the L2 the longer its rows are (pv_kernels.txt: a median 20.9
MiB below N = 2,048, 27.0 at 8,192, P of 40 MiB or more, cold). Each of its CTAs takes one row: it reads the row
of S whole, then writes the row of P. So the writes trail the reads by the rows resident at once (8 CTAs an SM on
the H200: 1,056 rows, 2 N bytes each), and when the kernel ends the L2's most recent data is that many rows of P
with no S among them: 0.5 MiB at N = 256, 16.5 MiB at 8,192. If that is the cause, fewer resident CTAs leave
less of P dirty at long rows and change nothing at short ones.

The project's own naive_softmax kernel (fp16) on 128 MiB of S, N = 1,024 to 8,192, with 1, 2, 4 or 8 CTAs an SM
(fewer than its occupancy allows by asking for more dynamic shared memory than the row needs), each after a
read-only flush; ncu, application replay, no cache control. Per case: DRAM bytes read and written and P's bytes
still dirty at the end (P written less DRAM writes), measured, beside the model's with the same resident rows (--show).

    python benchmarks/gpu/naive_warm/softmax_lead.py OUT_DIR     # ncu over itself: softmax_lead.json, _ncu.csv
    python benchmarks/gpu/naive_warm/softmax_lead.py --show benchmarks/gpu/naive_warm/softmax_lead.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "l2_probe"))

from probe import BLOCK, GRID, MiB, SOURCE, chunks, kernel_row, profile, run

from simflash.config import gpu_spec

S_BYTES = 128 * MiB
ROW_LENGTHS = (1024, 2048, 4096, 8192)
CTAS_PER_SM = (1, 2, 4, 8)
CASES = [{"n": n, "heads": S_BYTES // (2 * n * n), "ctas_per_sm": k} for n in ROW_LENGTHS for k in CTAS_PER_SM]


def shared_bytes(n: int, ctas_per_sm: int, per_sm: int, static: int) -> int:
    """Dynamic shared memory that lets at most `ctas_per_sm` CTAs share an SM (at least the row, 2 n bytes): the
    SM's share less what the driver reserves per CTA (the machine file's figure), the static part, and 16 bytes so
    that the allocation unit's rounding cannot fit one more."""
    reserved = gpu_spec("H200").shared_reserved_bytes_per_cta
    return max(2 * n, per_sm // ctas_per_sm - reserved - static - 16)


def launches() -> tuple:
    """The compiled softmax and, per case, the dynamic shared memory it launches with."""
    import cupy

    from simflash.backends.kernels import SoftmaxKernel

    per_sm = cupy.cuda.Device().attributes["MaxSharedMemoryPerMultiprocessor"]
    softmax = SoftmaxKernel("float16").function(max(ROW_LENGTHS))
    sizes = [shared_bytes(c["n"], c["ctas_per_sm"], per_sm, softmax.shared_size_bytes) for c in CASES]
    return SoftmaxKernel("float16").function(-(-max(sizes) // 2)), sizes


def target() -> None:
    import cupy
    import numpy as np

    from simflash.backends.kernels import SOFTMAX_THREADS

    flush = cupy.RawModule(code=SOURCE).get_function("flush_read")
    F, never, same = cupy.ones(512 * MiB // 4, dtype=cupy.float32), cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    S = cupy.random.standard_normal(S_BYTES // 2, dtype=cupy.float32).astype(cupy.float16).view(cupy.uint16)
    P = cupy.zeros_like(S)
    softmax, sizes = launches()
    for case, dynamic in zip(CASES, sizes):
        n = np.int32(case["n"])
        flush((GRID,), (BLOCK,), (F, chunks(512), same, never))
        softmax((case["heads"] * case["n"],), (SOFTMAX_THREADS,), (S, P, n, n, np.int32(0), np.int32(0), np.uint64(0)),
                shared_mem=dynamic)
    cupy.cuda.Device().synchronize()


def resources() -> list[dict]:
    """Per case: the kernel's registers, its dynamic shared memory and the CTAs an SM the occupancy rules allow."""
    import cupy

    from simflash.backends.kernels import SOFTMAX_THREADS

    softmax, sizes = launches()
    return [{"registers": softmax.num_regs, "shared_bytes": dynamic + softmax.shared_size_bytes,
             "occupancy_ctas_per_sm": cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                 softmax.kernel.ptr, SOFTMAX_THREADS, dynamic)} for dynamic in sizes]


def main(out: Path) -> None:
    from simflash.backends.profile import parse_ncu_csv

    command, csv_text = profile(__file__, out, "softmax_lead_ncu.csv")
    kernels = [kernel_row(k) for k in parse_ncu_csv(csv_text) if "naive_softmax" in k["name"]]
    if len(kernels) != len(CASES):
        raise RuntimeError(f"{len(kernels)} softmax kernels profiled, {len(CASES)} expected")
    rows = [{**case, **used, **kernel} for case, used, kernel in zip(CASES, resources(), kernels)]
    (out / "softmax_lead.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    show(out / "softmax_lead.json")


def predicted_dirty(n: int, heads: int, ctas_per_sm: int) -> float:
    """MiB of P the model leaves dirty at the softmax's end, S read from DRAM into a clean L2 (the machine file's),
    its writes trailing its reads by the rows `ctas_per_sm` CTAs on every SM hold."""
    from simflash.chip import gemm_pv_wave_rows, l2_cache
    from simflash.model.physical import _play_naive_kernel
    from simflash.schedule import TileSchedule

    spec = gpu_spec("H200")
    l2 = l2_cache(spec)
    l2.flush()
    l2.kernel = "softmax"
    _play_naive_kernel("softmax", TileSchedule(n, n, n, n), heads, 128, 2, gemm_pv_wave_rows(spec),
                       ctas_per_sm * spec.sm_count, l2)
    l2.end_kernel()
    return (S_BYTES - l2.traffic().by_kernel["softmax"].dram_write_bytes) / MiB


def show(path: Path) -> None:
    print("P dirty at the softmax's end, MiB: measured / the model with the same resident rows (132 SMs x CTAs an SM)")
    for r in json.loads(path.read_text())["rows"]:
        dirty = (S_BYTES - r["dram_write_bytes"]) / MiB
        model = predicted_dirty(r["n"], r["heads"], r["ctas_per_sm"])
        print(f"N {r['n']:5d} heads {r['heads']:3d} CTAs an SM {r['ctas_per_sm']} ({r['occupancy_ctas_per_sm']} allowed, "
              f"{r['registers']} registers): read {r['dram_read_bytes'] / MiB:6.1f} MiB, written "
              f"{r['dram_write_bytes'] / MiB:6.1f} in {r['time_ns'] / 1e3:6.1f} us; P dirty at the end {dirty:5.1f} / "
              f"{model:5.1f}")


if __name__ == "__main__":
    run(target, main, show)
