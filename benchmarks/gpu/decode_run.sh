#!/bin/bash
# The GPU evidence for grouped-query heads, sliding windows and Flash-Decoding, in one call on the GPU
# machine (run from the repo root):
#   bash benchmarks/gpu/decode_run.sh
# Installs simflash, then: validation of the FA-2 kernel's grouped-query and window rows and of the
# Flash-Decoding kernels (plus the quick FA-2 rows), the decode bench (quick first, so a cut-off run
# still leaves numbers) with Nsight Compute on the split and combine kernels, and the FA-2 bench's
# headline shape as a check on the shared tile loop. Each step has a time limit.
# Results go to $OUT (or ./gpu-out): validate_gqa_decode.json, validate_quick.json, decode_bench_quick.json,
# decode_bench.json, decode_ncu.csv, bench_check.json, decode_log.txt.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/decode_log.txt"
export PYTHONUNBUFFERED=1
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$log"

step validate gqa-window, decode, fa2 quick
timeout 150 python3 -c "from simflash.cli import main; main()" gpu validate --suite gqa-window,decode \
  --save "$out/validate_gqa_decode.json" >>"$log" 2>&1
echo "validate exit $?" | tee -a "$log"
grep -E "^(FAIL|Traceback|[A-Za-z]*Error)" "$log" | head -20
timeout 40 python3 -c "from simflash.cli import main; main()" gpu validate --suite fa2 --quick \
  --save "$out/validate_quick.json" >>"$log" 2>&1
echo "validate quick exit $?" | tee -a "$log"

step decode-bench quick
timeout 60 python3 -c "from simflash.cli import main; main()" gpu decode-bench --quick --save "$out/decode_bench_quick.json" 2>&1 | tail -12 | tee -a "$log"
step decode-bench
timeout 200 python3 -c "from simflash.cli import main; main()" gpu decode-bench --raw-csv "$out/decode_ncu.csv" \
  --save "$out/decode_bench.json" 2>&1 | tail -45 | tee -a "$log"
step bench check
timeout 40 python3 -c "from simflash.cli import main; main()" gpu bench --n 4096 --d 128 --causal both --naive-max-n 0 \
  --math-max-n 0 --save "$out/bench_check.json" 2>&1 | tail -8 | tee -a "$log"
step done
