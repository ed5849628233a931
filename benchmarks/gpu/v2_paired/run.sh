#!/bin/bash
# v2 against SDPA with the device held ahead of each timed call: the paired ratios (two runs, to
# $OUT/v2_paired/) and the versions bench again ($OUT/bench_versions.json). From the repo root.
set -u -o pipefail
out=${OUT:-gpu-out}; mkdir -p "$out/v2_paired"; log="$out/v2_paired/paired_log.txt"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$log" 2>&1 || { echo install failed; tail "$log"; exit 1; }
for k in 1 2; do python3 benchmarks/gpu/v2_paired/paired.py "$out/v2_paired/paired_held_$k.json" 400 2>&1 | tee -a "$log"; done
python3 -c "from simflash.cli import main; main()" gpu bench --kernel v1,v2 --n 4096,16384 --d 64,128 --causal both \
  --tiles 128x64,128x128,128x32 --naive-max-n 0 --save "$out/bench_versions.json" 2>&1 | tail -22 | tee -a "$log"
