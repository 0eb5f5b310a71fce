#!/bin/bash
# Next GPU session (written in session 10): every GPU test after session 10's CUDA changes (attend.cuh's
# after_k hook, the one-slot K ring default, the pack kernel, the sync-free v3 store), then the 36-layer
# end-to-end decode step at the new default (e2e_h200.json predates both launch changes), then the H200
# memory report with the v3 default (memory_h200.json predates v3 on Hopper).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -12
timeout 330 python3 eval/bench_e2e.py --contexts 32768 65536 131072 --batches 1 4 16 --steps 8 --prof-steps 3 \
  --prefill-reps 1 --budget-s 300 --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -12
