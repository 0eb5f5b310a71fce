#!/bin/bash
# Session 12, call M4 (last 290 s of device time): the graph-mode GPU tests after the fix for the mask a
# capture gets on 5.17 (call M3: 3 failed there), then one short e2e case with graph replays.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 75 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs_gpu.py --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|^E  |passed|failed" $OUT/pytest_gpu.txt | head -12
timeout 80 python3 eval/bench_e2e.py --contexts 16384 --batches 1 --steps 8 --prof-steps 3 --prefill-reps 1 \
  --budget-s 60 --graphs --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -4
