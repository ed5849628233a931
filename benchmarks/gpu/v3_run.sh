#!/bin/bash
# Version 3's evidence in one call on the GPU machine (run from the repo root):
#   bash benchmarks/gpu/v3_run.sh
# Installs simflash, then: the tiny-input diagnosis of v3 and its quick validation (a failure stops the
# run), the bench of every version against SDPA flash / cuDNN / efficient, the full validation of v3, compute-sanitizer over every version, Nsight Compute
# over v3 with and without ping-pong, and the GPU tests. Results go to $OUT (or ./gpu-out):
# bench_versions_v3.json, validate_v3.json, kernel_profile_v3.json, sanitizer_v3.txt, v3_log.txt.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/v3_log.txt"
export PYTHONUNBUFFERED=1
sf() { local limit=$1; shift; timeout "$limit" python3 -c "from simflash.cli import main; main()" "$@"; }
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$log"

step diagnose v3
timeout 120 python3 benchmarks/gpu/diagnose.py v3 2>&1 | tee -a "$log"
step validate quick v3
sf 180 gpu validate --quick --kernel v3 2>&1 | tee -a "$log" || { step stopped; exit 1; }

step bench
sf 240 gpu bench --kernel v3,v3-nopp,v2,v1 --n 4096,16384 --d 64,128 --causal both --tiles 128x64,128x128 \
  --naive-max-n 0 --save "$out/bench_versions_v3.json" 2>&1 | tee -a "$log"

step validate full v3
sf 300 gpu validate --kernel v3 --save "$out/validate_v3.json" >>"$log" 2>&1
echo "validate exit $?" | tee -a "$log"

step sanitize
sf 300 gpu sanitize --tool memcheck,racecheck,synccheck --save "$out/sanitizer_v3.txt" 2>&1 | tee -a "$log"

step kernel-profile
sf 200 gpu kernel-profile --kernel v3,v3-nopp --n 4096,16384 --d 64,128 --causal both --tiles 128x128 \
  --raw-csv "$out/kernel_profile_v3_ncu.csv" --save "$out/kernel_profile_v3.json" 2>&1 | tee -a "$log"

step pytest gpu
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fa2_kernel or timed_build" 2>&1 | tail -15 | tee -a "$log"
step done
