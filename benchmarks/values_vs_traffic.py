"""A run with values (`sf.flash_attention`, concurrent schedule, through the L2) against the traffic-only
prediction (`simflash physical`) of the same FA-2 kernel, with the machine file's L2: L2 hits, DRAM bytes read
and written, dirty bytes at the end. They must be equal.

    python benchmarks/values_vs_traffic.py [N HEADS D] [cold|warm]     (default: 16384 4 128 warm)
"""

import sys

import numpy as np

import simflash as sf
from simflash.model.physical import predict


def main(n: int, heads: int, d: int, cache: str) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((heads, n, d)).astype(np.float16) for _ in range(3))
    run = sf.flash_attention(q, k, v, trace="none", schedule="concurrent", cache=cache)
    flow = run.physical.by_kernel["flash2_forward"]
    p = predict("fa2", n, d, heads=heads, cache=cache).kernel("flash2_forward")
    print(f"FA-2, N = {n}, {heads} heads, d = {d}, {cache}: L2 hits, DRAM read, DRAM written, dirty at end (bytes)")
    print(f"  with values:  {flow.hit_bytes:,} {flow.dram_read_bytes:,} {flow.dram_write_bytes:,} {flow.dirty_at_end_bytes:,}")
    print(f"  traffic only: {p.l2_hit_bytes:,} {p.dram_read_bytes:,} {p.dram_write_bytes - p.spill_write_bytes:,} "
          f"{p.dirty_at_end_bytes:,}")


if __name__ == "__main__":
    shape = [int(a) for a in sys.argv[1:4]] if len(sys.argv) >= 4 else [16384, 4, 128]
    main(*shape, sys.argv[4] if len(sys.argv) > 4 else "warm")
