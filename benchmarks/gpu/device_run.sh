#!/bin/bash
# Everything the GPU evidence needs, in one call on the GPU machine (run from the repo root):
#   bash benchmarks/gpu/device_run.sh [full|smoke|backward]
# Installs simflash, then: gpu info, quick validation (a failure stops the run after a diagnosis),
# the GPU tests, full validation, compute-sanitizer, the Nsight Compute sweep, the bench against SDPA, sdpa-check.
# Results go to $OUT (or ./gpu-out): validate.json, sanitizer.txt, profile.json, profile_ncu.csv,
# bench.json, sdpa_check.json, device_log.txt. smoke: every step once, on a few configurations.
# backward: the backward kernels alone, each step within a time limit so one short call brings back what
# finished: backward_validate.json, backward_bench.json, backward_profile.json, backward_profile_ncu.csv,
# pytest_gpu_backward.txt, device_log_backward.txt.
set -u -o pipefail
mode=${1:-full}
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/device_log.txt"
[ "$mode" = backward ] && log="$out/device_log_backward.txt"
export PYTHONUNBUFFERED=1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  python3 -c "import cupy, numpy, torch; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
  ncu --version | tail -1
  compute-sanitizer --version | tail -1
} 2>&1 | tee -a "$log"

if [ "$mode" = backward ]; then
  export COLUMNS=250  # wide tables in the log
  step validate backward
  timeout 120 python3 -c "from simflash.cli import main; main()" gpu validate --backward \
    --save "$out/backward_validate.json" 2>&1 | grep -v "^ok " | tail -40 | tee -a "$log"
  echo "validate exit ${PIPESTATUS[0]}" | tee -a "$log"
  step bench backward
  timeout 60 python3 -c "from simflash.cli import main; main()" gpu bench --backward --n 1024,2048,4096,8192,16384 \
    --d 64,128 --tiles 64x128,128x128 --save "$out/backward_bench.json" 2>&1 | tail -30 | tee -a "$log"
  echo "bench exit ${PIPESTATUS[0]}" | tee -a "$log"
  step profile backward
  timeout 75 python3 -c "from simflash.cli import main; main()" gpu profile --backward --n 4096 --d 128 --heads 32 \
    --both-masks --raw-csv "$out/backward_profile_ncu.csv" --save "$out/backward_profile.json" 2>&1 | tail -30 \
    | tee -a "$log"
  echo "profile exit ${PIPESTATUS[0]}" | tee -a "$log"
  step pytest gpu backward
  timeout 25 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k backward 2>&1 | tail -15 \
    | tee "$out/pytest_gpu_backward.txt" | tee -a "$log"
  step done
  exit 0
fi

step info
sf gpu info 2>&1 | tee -a "$log"
step validate quick
if ! sf gpu validate --suite fa2 --quick 2>&1 | tee -a "$log"; then
  step diagnose
  python3 benchmarks/gpu/diagnose.py 2>&1 | tee -a "$log"
  exit 1
fi

if [ "$mode" = full ]; then
  step pytest gpu
  python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_backend.py 2>&1 | tail -15 | tee -a "$log"
  step validate full
  sf gpu validate --suite fa2 --save "$out/validate.json" >>"$log" 2>&1
  echo "validate exit $?" | tee -a "$log"
fi
step sanitize
sf gpu sanitize --tool memcheck,racecheck --save "$out/sanitizer.txt" 2>&1 | tee -a "$log"
step profile
if [ "$mode" = full ]; then what=(--sweep); else what=(--n 4096 --heads 1,32); fi
sf gpu profile "${what[@]}" --raw-csv "$out/profile_ncu.csv" --save "$out/profile.json" >>"$log" 2>&1
echo "profile exit $?" | tee -a "$log"
dram=(); [ -f "$out/profile.json" ] && dram=(--dram-from "$out/profile.json")
step bench
if [ "$mode" = full ]; then what=(--tiles 128x64,64x64,128x128); else what=(--n 4096 --d 128 --tiles 128x64,64x64,128x128); fi
sf gpu bench "${what[@]}" "${dram[@]}" --save "$out/bench.json" 2>&1 | tee -a "$log"
step sdpa-check
sf gpu sdpa-check --n 4096 --d 128 --both-masks --save "$out/sdpa_check.json" 2>&1 | tee -a "$log"
step done
