#!/bin/bash
# The backward's GPU evidence in one call on the GPU machine (run from the repo root):
#   bash benchmarks/gpu/device_run.sh backward
# Installs simflash, then: validation of the backward kernels (float64, naive same dtype, SDPA flash,
# exact bytes), their GPU tests, the bench against SDPA flash's backward (N 1024..16384, d 64 and 128,
# H 32, fp16, both masks), and Nsight Compute beside SDPA's FA-2 backward kernels at N = 4096, d = 128.
# Each step has a time limit, so what finished comes back. Results go to $OUT (or ./gpu-out).
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/device_log_backward.txt"
export PYTHONUNBUFFERED=1 COLUMNS=250  # wide tables in the log
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  python3 -c "import cupy, numpy, torch; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
  ncu --version | tail -1
} 2>&1 | tee -a "$log"

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
  --both-masks --raw-csv "$out/backward_profile_ncu.csv" --save "$out/backward_profile.json" 2>&1 | tail -30 | tee -a "$log"
echo "profile exit ${PIPESTATUS[0]}" | tee -a "$log"
step pytest gpu backward
timeout 25 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k backward 2>&1 | tail -15 \
  | tee "$out/pytest_gpu_backward.txt" | tee -a "$log"
step done
