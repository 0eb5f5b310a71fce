#!/bin/bash
# Session 19, call T8 (one H200, <= 400 s): e2e with format v4 at 32K B=16 (T7 ran out of memory there: the
# warm-up cache was alive beside the timed one). $1: the commit measured (a literal).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 330 python3 eval/bench_e2e.py --contexts 32768 --batches 16 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 300 --graphs --out $OUT/e2e_h200_v4_32k_b16.json 2>&1 | grep -v Warn | tail -4
echo "done after $(( $(date +%s) - T0 )) s"
