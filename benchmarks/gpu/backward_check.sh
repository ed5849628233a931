#!/bin/bash
# The backward kernels alone, re-checked in one call (run from the repo root):
#   OUT=benchmarks/gpu bash benchmarks/gpu/backward_check.sh
# Full validation, the bench against SDPA flash, the GPU backward tests, memcheck and racecheck.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/device_log_backward.txt"
export PYTHONUNBUFFERED=1 COLUMNS=250
step() { echo "== $(date +%T) $*" | tee -a "$log"; }
step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
step validate backward
timeout 120 python3 -c "from simflash.cli import main; main()" gpu validate --backward \
  --save "$out/backward_validate.json" 2>&1 | grep -v "^ok " | tail -25 | tee -a "$log"
echo "validate exit ${PIPESTATUS[0]}" | tee -a "$log"
step bench backward
timeout 90 python3 -c "from simflash.cli import main; main()" gpu bench --backward --n 1024,2048,4096,8192,16384 \
  --d 64,128 --tiles 64x128,128x128 --save "$out/backward_bench.json" 2>&1 | tail -30 | tee -a "$log"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$log"
step pytest gpu backward
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k backward 2>&1 | tail -15 \
  | tee "$out/pytest_gpu_backward.txt" | tee -a "$log"
for tool in memcheck racecheck; do
  step "$tool backward"
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 -m simflash.backends.sanitize_target backward \
    2>&1 | tail -6 | tee -a "$out/sanitizer_backward.txt" | tee -a "$log"
  echo "$tool exit ${PIPESTATUS[0]}" | tee -a "$log"
done
step done
