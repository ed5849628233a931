"""The machine file's fitted figures, recomputed from the committed calibration sweep's fit rows as the tests
check them: SDPA's spill writes (`fit_spill_writes`, cold and warm), its re-read floors (`fit_reread_floor`, cold
and warm), the naive path's time figures (`fit_naive_time`, cold) and each FA-2 kernel's achieved tensor-core share
(`fit_tensor_efficiency`), beside what simflash/machines/H200.toml holds.

    python benchmarks/gpu/fit_figures.py > benchmarks/gpu/fit_figures.txt
"""

import json
from pathlib import Path

from simflash.config import gpu_spec
from simflash.model.calibration import fit_naive_time, fit_reread_floor, fit_spill_writes, fit_tensor_efficiency

ROOT = Path(__file__).resolve().parent


def main() -> None:
    cold, warm, times = (json.loads((ROOT / f"calibration_{name}.json").read_text()) for name in ("cold", "warm", "time"))
    written = gpu_spec("H200").calibration
    fitted = {**fit_spill_writes([cold, warm]), **fit_reread_floor([cold, warm]), **fit_naive_time(cold),
              **{f"tensor_efficiency_{kernel}": fit_tensor_efficiency(cold, times, kernel)
                 for kernel in ("simflash", "sdpa_flash")}}
    print("figure | fitted | in the machine file")
    for key, value in fitted.items():
        print(f"{key} | {value:.4g} | {written[key]:.4g}")


if __name__ == "__main__":
    main()
