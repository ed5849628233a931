"""Which SM each CTA of a grid runs on, and when: the placement the whole-chip model's compute term
assumes (simflash.model.physical.busiest_sm_steps: slot i on SM i mod SMs, so the first wave puts a CTA
on every SM before any holds two, and a CTA that starts in a freed slot stays on that slot's SM).

A kernel of 128 threads and 100 KiB of dynamic shared memory (two CTAs an SM, as SDPA's FA-2 kernel
at d = 128 and simflash's at d = 64) records, per CTA, its SM (%smid) and its start and end
(%globaltimer), after spinning for a time proportional to its length. Lengths as a causal grid's: CTA k
of `ctas` does k + 1 units (ascending, as SDPA launches them) or `ctas` - k (descending, simflash's
longest-first order). Printed: how many first-wave CTAs sit where the model puts them (CTA k on SM
k mod SMs), which CTAs share an SM in the first wave, and the busiest SM's CTA-time against the model's.

    python benchmarks/gpu/sm_placement/placement.py OUT_DIR    # on the GPU machine: OUT_DIR/placement.json
"""

import json
import sys
from pathlib import Path

SOURCE = r"""
extern "C" __global__ void placed(const int* units, int spin, unsigned long long* out, float* sink) {
  extern __shared__ float pad[];
  unsigned long long start, end;
  unsigned sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  float a = threadIdx.x, b = 1.f, c = 2.f, d = 3.f;
  for (int i = 0; i < units[blockIdx.x] * spin; ++i) {  // independent chains: the SM's issue slots, shared
    a = a * 1.0000001f + 0.5f; b = b * 0.9999999f + 0.25f; c = c * 1.0000002f + 0.125f; d = d * 0.9999998f + 1.f;
  }
  pad[threadIdx.x] = a + b + c + d;
  __syncthreads();
  if (pad[(threadIdx.x + 1) % blockDim.x] == -1.f) sink[0] = 1.f;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
  if (threadIdx.x == 0) {
    out[3 * blockIdx.x] = sm; out[3 * blockIdx.x + 1] = start; out[3 * blockIdx.x + 2] = end;
  }
}
"""
CTAS = 1056  # four waves of 264 slots on an H200
SHARED = 100 * 1024
SPIN = 2000


def run(order: str) -> dict:
    import cupy

    kernel = cupy.RawKernel(SOURCE, "placed")
    kernel.max_dynamic_shared_size_bytes = SHARED
    units = cupy.arange(1, CTAS + 1, dtype=cupy.int32)
    if order == "descending":
        units = units[::-1].copy()
    out = cupy.zeros(3 * CTAS, dtype=cupy.uint64)
    sink = cupy.zeros(1, dtype=cupy.float32)
    for _ in range(2):  # the second launch is the one kept (the first compiles and warms)
        kernel((CTAS,), (128,), (units, cupy.int32(SPIN), out, sink), shared_mem=SHARED)
    cupy.cuda.Device().synchronize()
    sm, start, end = out.get().reshape(CTAS, 3).T
    return {"order": order, "units": units.get().tolist(), "sm": sm.tolist(), "start_ns": start.tolist(),
            "end_ns": end.tolist(), "sm_count": cupy.cuda.Device().attributes["MultiProcessorCount"]}


def summary(result: dict) -> str:
    """First-wave placement against the model's, the first-wave CTAs that share an SM, and how often a later
    CTA starts on the SM of the CTA that ended last before it (the slot it takes)."""
    sm, start, end, n_sm = result["sm"], result["start_ns"], result["end_ns"], result["sm_count"]
    t0 = min(start)
    first_wave = [k for k in range(len(sm)) if start[k] - t0 < 2_000]  # started within 2 µs of the first
    on_model_sm = sum(sm[k] == k % n_sm for k in first_wave)
    by_sm: dict[int, list[int]] = {}
    for k in first_wave:
        by_sm.setdefault(sm[k], []).append(k)
    pairs = sorted(tuple(v) for v in by_sm.values() if len(v) > 1)
    later = [k for k in range(len(sm)) if k not in set(first_wave)]
    ends = sorted(range(len(sm)), key=end.__getitem__)
    same = 0
    for k in later:
        before = [j for j in ends if end[j] <= start[k]]
        same += bool(before) and sm[before[-1]] == sm[k]
    return (f"{result['order']}: {len(first_wave)} CTAs start within 2 µs of the first, {on_model_sm} of them on SM k mod "
            f"{n_sm} (the model's placement); first-wave CTAs sharing an SM, the first 6: {pairs[:6]}; "
            f"{same} of the {len(later)} later CTAs start on the SM of the CTA that ended last before them; "
            f"makespan {(max(end) - t0) / 1e3:.1f} µs, the model's {model_makespan(result) / 1e3:.1f}")


def model_makespan(result: dict) -> float:
    """The compute term's makespan for these CTAs (ns): a CTA of u units holds its slot u lock-step time
    steps, the busiest SM's steps (`busiest_sm_steps`, 264 slots) at the time two CTAs sharing an SM
    take for one unit, the median over the 20 shortest first-wave CTAs' duration per unit."""
    from simflash.model.physical import busiest_sm_steps

    units, start, end = result["units"], result["start_ns"], result["end_ns"]
    shortest = sorted(range(len(units)), key=units.__getitem__)[:20]
    per_unit = sorted((end[k] - start[k]) / units[k] for k in shortest)[10]  # two CTAs on the SM: 2 units' time
    return busiest_sm_steps([u - 1 for u in units], 2 * result["sm_count"], result["sm_count"]) * per_unit / 2


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results = [run(order) for order in ("ascending", "descending")]
    (out / "placement.json").write_text(json.dumps({"command": "python benchmarks/gpu/sm_placement/placement.py "
                                                               "$OUT", "runs": results}))
    for result in results:
        print(summary(result))


if __name__ == "__main__":
    if sys.argv[1] == "--show":
        for result in json.loads(Path(sys.argv[2]).read_text())["runs"]:
            print(summary(result))
    else:
        main(Path(sys.argv[1]))
