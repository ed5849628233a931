#!/bin/bash
# A lever tried on kernel v2 and not kept: the rescale of a_i skipped when no row of a warp has a new max.
# Apply rescale_skip.patch, then in one call on the GPU machine (run from the repo root):
#   bash benchmarks/gpu/v2_rescale_skip/run.sh
# Outcome (bench_v2_skip_*.json): d = 128 at 0.96-1.02x SDPA flash (no gain over the committed v2, within
# run-to-run spread; ptxas no longer spills there), d = 64 0.96-1.01x (down from 1.04-1.05x): the warp
# vote costs more than it saves. Validation, sanitizers and the GPU tests passed on that build (v2_skip_log.txt).
# Quick validation (a failure stops the run), the bench against SDPA three times in separate processes
# (run-to-run spread), the Nsight Compute profile of v1 and v2, the full validation, compute-sanitizer
# and the GPU tests of the versions. Results in $OUT (or ./gpu-out): bench_v2_skip_{1,2,3}.json,
# kernel_profile.json, kernel_profile_ncu.csv, validate_v2.json, sanitizer_versions.txt, v2_skip_log.txt.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/v2_skip_log.txt"
export PYTHONUNBUFFERED=1 COLUMNS=200
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$log"
step validate quick v2
sf gpu validate --quick --kernel v2 2>&1 | tail -3 | tee -a "$log" || exit 1
for run in 1 2 3; do
  step bench $run
  sf gpu bench --kernel v1,v2 --n 4096,16384 --d 64,128 --causal both --tiles 128x64,128x32 --naive-max-n 0 \
    --save "$out/bench_v2_skip_$run.json" 2>&1 | tail -20 | tee -a "$log"
done
step kernel-profile
sf gpu kernel-profile --kernel v1,v2 --n 4096,16384 --d 64,128 --causal both --tiles 128x64 \
  --raw-csv "$out/kernel_profile_ncu.csv" --save "$out/kernel_profile.json" 2>&1 | tail -12 | tee -a "$log"
step validate full v2
sf gpu validate --kernel v2 --save "$out/validate_v2.json" >>"$log" 2>&1
echo "validate exit $?" | tee -a "$log"
step sanitize
sf gpu sanitize --tool memcheck,racecheck --timeout 40 --save "$out/sanitizer_versions.txt" 2>&1 | tail -4 | tee -a "$log"
step pytest gpu versions
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_versions.py 2>&1 | tail -4 | tee -a "$log"
step done
