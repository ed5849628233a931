#!/bin/bash
# The whole-chip sweeps on the GPU machine (run from the repo root):
#   [SWEEP=calibration|validation|unseen|blind|confirm|fresh|recheck|verify|splitkv|later|lead] bash benchmarks/gpu/calibrate.sh [cold warm time]
# Writes $SWEEP_{cold,warm}.json with ncu's raw CSV beside each, and $SWEEP_time.json, to $OUT (or
# ./gpu-out). Each mode is bounded (280 s); run one or two modes per call to stay inside the machine's
# 10-minute limit.
set -u -o pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
sweep=${SWEEP:-calibration}
log="$out/${sweep}_log.txt"
export PYTHONUNBUFFERED=1
sf() { python3 -c "from simflash.cli import main; main()" "$@"; }
export -f sf
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || { echo "install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv | tee -a "$log"
modes=("$@"); [ $# -eq 0 ] && modes=(cold warm time)
for mode in "${modes[@]}"; do
  echo "== $(date +%T) $mode" | tee -a "$log"
  if [ "$mode" = time ]; then
    timeout 280 bash -c 'sf "$@"' sf gpu calibrate --sweep "$sweep" --cache time --save "$out/${sweep}_time.json" \
      2>&1 | tail -5 | tee -a "$log"
  else
    timeout 280 bash -c 'sf "$@"' sf gpu calibrate --sweep "$sweep" --cache "$mode" --raw-csv "$out/${sweep}_${mode}_ncu.csv" \
      --save "$out/${sweep}_${mode}.json" 2>&1 | tail -5 | tee -a "$log"
  fi
done
echo "== $(date +%T) done" | tee -a "$log"
