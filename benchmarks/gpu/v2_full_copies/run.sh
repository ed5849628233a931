#!/bin/bash
# v2 before and after the full-tile copies, in one process (README.md: the "before" is registered as
# version v2-old for this run). From the repo root; results to $OUT.
set -u -o pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"; log="$out/v2copy_log.txt"
export PYTHONUNBUFFERED=1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
export -f sf
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$log" 2>&1 || { echo install failed; tail "$log"; exit 1; }
python3 - <<'PY' 2>&1 | tee -a "$log"
from simflash.backends.flash2 import kernel_version
for version in ("v2", "v2-old"):
    for d in (64, 128):
        print(version, d, kernel_version(version)("float16", 128, 64, d).resources(), flush=True)
PY
timeout 200 bash -c 'sf "$@"' sf gpu validate --suite fa2 --quick --kernel v2 --save "$out/v2copy_validate_quick.json" 2>&1 | tail -3 | tee -a "$log"
for seed in 1 2 3; do
  timeout 200 bash -c 'sf "$@"' sf gpu bench --kernel v2,v2-old --n 4096,16384 --d 64,128 --causal both \
    --tiles 128x64,128x128 --naive-max-n 0 --seed "$seed" --save "$out/v2copy_bench_$seed.json" 2>&1 | tail -22 | tee -a "$log"
done
echo "== done" | tee -a "$log"
