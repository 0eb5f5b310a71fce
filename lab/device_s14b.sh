#!/bin/bash
# Session 14, call B: e2e B = 16 at 32K with graphs (the in-place static cache is the baseline; DynamicCache left out).
# Chunked prefill now under FA2 + memory-efficient (call A: FA2 alone refused the masked second chunk).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 380 python3 eval/bench_e2e.py --contexts 32768 --batches 16 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --budget-s 300 --graphs --out $OUT/e2e_h200_b16.json 2>&1 | grep -v Warn | tail -4
