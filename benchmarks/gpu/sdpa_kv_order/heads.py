"""Does SDPA's causal d = 128 kernel miss more of its K and V re-reads per head when there are more heads?

At N = 65,536 the calibration sweep measured 190 MiB of DRAM reads per head with 2 heads and 1,019 with 12
(cold), where the lock-step model sees the same reuse distances in both (its re-read misses per head
differ by 1.5x). This run profiles, cold (ncu --cache-control all), PyTorch's FA-2 kernel at d = 128 with
the mask, at N = 65,536 and 32,768, for head counts from 1 up, and simflash's kernel (which walks KV
from the first tile, all resident CTAs of a head in step) as the control.

    python benchmarks/gpu/sdpa_kv_order/heads.py OUT_DIR   # on the GPU machine: OUT_DIR/heads.json, heads_ncu.csv
    python benchmarks/gpu/sdpa_kv_order/heads.py --show benchmarks/gpu/sdpa_kv_order/heads.json

Printed per configuration: DRAM MiB read, per head, beyond Q + K + V, and as a share of the logical K and V
re-reads; the model's figures beside them (`simflash physical`, cold).
"""

import sys

from floor import kv_rereads, probe_main

from simflash.config import MiB
from simflash.model.calibration import KERNEL_OF
from simflash.model.physical import predict


def _config(algorithm: str, n: int, heads: int) -> dict:
    return {"algorithm": algorithm, "n": n, "heads": heads, "d": 128, "causal": True, "block_q": 128, "block_kv": 64}


CONFIGS = [
    *(_config("sdpa_flash", 65536, heads) for heads in (1, 2, 3, 4, 6, 12)),
    *(_config("sdpa_flash", 32768, heads) for heads in (1, 2, 4, 8, 16, 24)),
    *(_config("fa2", 65536, heads) for heads in (1, 2, 12)),
    *(_config("fa2", 32768, heads) for heads in (1, 24)),
]
METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "time_ns": "gpu__time_duration.sum",
}


def show(result: dict) -> None:
    print("algorithm   N       heads  beyond Q+K+V MiB per head (measured / model)  share of K/V re-reads (measured / model)")
    for entry in result["configs"]:
        c, kernels = entry["config"], entry["kernels"]
        compulsory = 3 * c["n"] * c["d"] * 2 * c["heads"]
        measured = sum(k["dram_read_bytes"] for k in kernels) - compulsory
        model = predict("fa2", c["n"], c["d"], heads=c["heads"], causal=True, kernel=KERNEL_OF[c["algorithm"]],
                        cache="cold").kernels[0].dram_read_bytes - compulsory
        rereads = kv_rereads(c)
        print(f"{c['algorithm']:11s} {c['n']:<7d} {c['heads']:<6d} {measured / MiB / c['heads']:10.1f} / {model / MiB / c['heads']:<10.1f}"
              f"{'':25s}{100 * measured / rereads:6.2f}% / {100 * model / rereads:.2f}%")


if __name__ == "__main__":
    probe_main(sys.argv[1:], "heads", CONFIGS, METRICS, show)
