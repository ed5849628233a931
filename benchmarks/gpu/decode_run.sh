#!/bin/bash
# The GPU evidence for grouped-query heads, sliding windows and Flash-Decoding, in one call on the GPU
# machine (run from the repo root):
#   bash benchmarks/gpu/decode_run.sh [all|decode]
# Installs simflash, then: validation of the Flash-Decoding kernels, the decode bench with Nsight Compute
# on the split and combine kernels, where a batch-1 step's time goes (decode_diagnose.py), and (all,
# the default) validation of the FA-2 kernel's grouped-query and window rows (plus the quick FA-2 rows)
# and the FA-2 bench's headline shape as a check on the shared tile loop. decode: the Flash-Decoding
# steps alone, for a change that leaves the FA-2 kernel alone. Each step has a time limit.
# Results go to $OUT (or ./gpu-out): validate_decode.json, decode_diagnose.json, decode_bench.json,
# decode_ncu.csv, validate_gqa.json, fa2_recheck_validate.json, fa2_recheck_bench.json, decode_log.txt.
set -u -o pipefail
mode=${1:-all}
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/decode_log.txt"
export PYTHONUNBUFFERED=1
step() { echo "== $(date +%T) $*" | tee -a "$log"; }

step install
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$log"

step validate decode
timeout 120 python3 -c "from simflash.cli import main; main()" gpu validate --suite decode \
  --save "$out/validate_decode.json" >>"$log" 2>&1
echo "validate decode exit $?" | tee -a "$log"
grep -E "^(FAIL|Traceback|[A-Za-z]*Error)" "$log" | head -20

step decode-bench
timeout 200 python3 -c "from simflash.cli import main; main()" gpu decode-bench --raw-csv "$out/decode_ncu.csv" \
  --save "$out/decode_bench.json" 2>&1 | grep -v -i warn | tail -40 | tee -a "$log"

step diagnose
timeout 60 python3 benchmarks/gpu/decode_diagnose.py "$out/decode_diagnose.json" 2>&1 | tee -a "$log"

[ "$mode" = decode ] && { step done; exit 0; }

step validate gqa-window, fa2 quick
timeout 100 python3 -c "from simflash.cli import main; main()" gpu validate --suite gqa-window \
  --save "$out/validate_gqa.json" >>"$log" 2>&1
echo "validate gqa-window exit $?" | tee -a "$log"
timeout 40 python3 -c "from simflash.cli import main; main()" gpu validate --suite fa2 --quick \
  --save "$out/fa2_recheck_validate.json" >>"$log" 2>&1
echo "validate quick exit $?" | tee -a "$log"

step bench check
timeout 40 python3 -c "from simflash.cli import main; main()" gpu bench --n 4096 --d 128 --causal both --naive-max-n 0 \
  --math-max-n 0 --save "$out/fa2_recheck_bench.json" 2>&1 | tail -8 | tee -a "$log"
step done
