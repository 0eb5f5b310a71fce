#!/bin/bash
# Session 19, call T4 (one H200, <= 560 s): the fixed cost of a v4 call (time vs context at a fixed grid), then the
# end-to-end decode step with format v4 (graphs) at 64K, B = 1 and 4 -> $OUT/
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 100 python3 lab/experiments/v4_fixed_cost.py --out $OUT/v4_fixed_cost_callT4.json 2>&1 | grep -v Warn | tail -12
echo "probe after $(( $(date +%s) - T0 )) s"
timeout ${2:-420} python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 330 --graphs --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -14
echo "e2e after $(( $(date +%s) - T0 )) s"
