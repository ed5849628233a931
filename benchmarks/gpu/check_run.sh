#!/bin/bash
# One call that re-checks every kernel of the current tree on the GPU (run from the repo root):
#   OUT=benchmarks/gpu bash benchmarks/gpu/check_run.sh
# Forward validation (every suite, kernel v1, and v2/v3 quick), backward validation, the GPU tests, then
# compute-sanitizer (memcheck, racecheck) over every kernel source. Results: validate_check.json,
# validate_check_v2.json, validate_check_v3.json, backward_validate_check.json, pytest_gpu_check.txt,
# sanitizer_all.json, check_log.txt.
set -u -o pipefail
SECONDS=0  # the call has 600 s; the sanitizer gets what is left
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/check_log.txt"
export PYTHONUNBUFFERED=1 COLUMNS=250
step() { echo "== $(date +%T) $*" | tee -a "$log"; }
run() { local limit=$1; shift; timeout "$limit" python3 -c "from simflash.cli import main; main()" "$@" 2>&1 \
          | grep -v "^ok " | tail -30 | tee -a "$log"; echo "exit ${PIPESTATUS[0]}" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
step validate forward v1, every suite
run 150 gpu validate --save "$out/validate_check.json"
step validate forward v2, v3 quick
run 60 gpu validate --quick --suite fa2 --kernel v2 --save "$out/validate_check_v2.json"
run 60 gpu validate --quick --suite fa2 --kernel v3 --save "$out/validate_check_v3.json"
step validate backward
run 90 gpu validate --backward --save "$out/backward_validate_check.json"
step pytest gpu
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -20 | tee "$out/pytest_gpu_check.txt" | tee -a "$log"
step sanitize
run $((570 - SECONDS)) gpu sanitize --tool memcheck,racecheck --timeout 150 --save "$out/sanitizer_all.json"
step done
