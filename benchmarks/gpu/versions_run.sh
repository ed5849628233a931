#!/bin/bash
# The kernel versions' evidence, in one call on the GPU machine (run from the repo root):
#   bash benchmarks/gpu/versions_run.sh
# Installs simflash, then: quick validation of v2 (a failure stops the run), the bench of every version
# against SDPA flash / cuDNN / efficient, Nsight Compute over every version, the full validation of
# v2, compute-sanitizer over both versions, and the GPU tests. Results go to $OUT (or ./gpu-out):
# bench_versions.json, kernel_profile.json, kernel_profile_ncu.csv, validate_v2.json,
# sanitizer_versions.txt, versions_log.txt.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/versions_log.txt"
export PYTHONUNBUFFERED=1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$log"

step validate quick v2
if ! sf gpu validate --quick --kernel v2 2>&1 | tee -a "$log"; then
  step diagnose
  python3 benchmarks/gpu/diagnose.py v2 2>&1 | tee -a "$log"
  exit 1
fi

step bench
sf gpu bench --kernel v1,v2 --n 4096,16384 --d 64,128 --causal both --tiles 128x64,128x128,128x32 \
  --naive-max-n 0 --save "$out/bench_versions.json" 2>&1 | tee -a "$log"

step kernel-profile
sf gpu kernel-profile --kernel v1,v2 --n 4096,16384 --d 64,128 --causal both --tiles 128x64 \
  --raw-csv "$out/kernel_profile_ncu.csv" --save "$out/kernel_profile.json" 2>&1 | tee -a "$log"

step validate full v2
sf gpu validate --kernel v2 --save "$out/validate_v2.json" >>"$log" 2>&1
echo "validate exit $?" | tee -a "$log"

step sanitize
sf gpu sanitize --tool memcheck,racecheck --save "$out/sanitizer_versions.txt" 2>&1 | tee -a "$log"

step pytest gpu
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee -a "$log"
step done
