#!/bin/bash
# Re-check of kernel v1 after its d <= 64 build went back to two CTAs an SM: validation, GPU tests, sanitizers, bench.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"; log="$out/v1_recheck_log.txt"
export PYTHONUNBUFFERED=1 COLUMNS=250
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
export -f sf
echo "== $(date +%T) validate" | tee -a "$log"
timeout 120 bash -c 'sf "$@"' sf gpu validate --suite fa2 --save "$out/validate_v1_recheck.json" 2>&1 | grep -v "^ok " | tail -15 | tee -a "$log"
echo "== $(date +%T) pytest" | tee -a "$log"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_backend.py 2>&1 | tail -5 | tee -a "$log"
echo "== $(date +%T) sanitize" | tee -a "$log"
timeout 200 bash -c 'sf "$@"' sf gpu sanitize --tool memcheck,racecheck --timeout 40 --save "$out/sanitizer_v1_recheck.txt" 2>&1 | tail -8 | tee -a "$log"
echo "== $(date +%T) bench" | tee -a "$log"
timeout 100 bash -c 'sf "$@"' sf gpu bench --kernel v1,v2 --n 4096,16384 --d 64,128 --heads 32 --causal both --tiles 128x64 --naive-max-n 0 --save "$out/bench_v1_recheck.json" 2>&1 | tail -14 | tee -a "$log"
echo "== $(date +%T) done" | tee -a "$log"
