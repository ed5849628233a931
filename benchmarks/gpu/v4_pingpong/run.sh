#!/bin/bash
# Kernel v4 (ping-pong on mma.sync) on the H200, with pingpong.patch applied: quick validation,
# resources, then v2 vs v4 vs SDPA.
#   bash benchmarks/gpu/v4_pingpong/run.sh [seed...]    (from the repo root; results to $OUT)
set -u -o pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"; log="$out/v4_log.txt"
export PYTHONUNBUFFERED=1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
export -f sf
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$log" 2>&1 || { echo install failed; tail "$log"; exit 1; }
python3 - <<'PY' 2>&1 | tee -a "$log"
from simflash.backends.flash2 import kernel_version
for version, bq, bk, d in (("v4", 256, 64, 128), ("v4", 256, 32, 128), ("v4", 256, 64, 64), ("v2", 128, 64, 128)):
    r = kernel_version(version)("float16", bq, bk, d).resources()
    print(version, f"{bq}x{bk} d={d}", r, flush=True)
PY
timeout 200 bash -c 'sf "$@"' sf gpu validate --suite fa2 --quick --kernel v4 --save "$out/v4_validate_quick.json" 2>&1 | tail -8 | tee -a "$log"
for seed in "${@:-1}"; do
  timeout 240 bash -c 'sf "$@"' sf gpu bench --kernel v2,v4 --n 4096,16384 --d 64,128 --causal both \
    --tiles 128x64,256x64,256x32 --naive-max-n 0 --seed "$seed" --save "$out/v4_bench_$seed.json" 2>&1 | tail -40 | tee -a "$log"
done
echo "== done" | tee -a "$log"
