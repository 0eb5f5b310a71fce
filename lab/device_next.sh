#!/bin/bash
# Next GPU session (written in session 12), call 1: every GPU test at this commit (session 12 merged the FP8
# CUDA codec and graph mode; call M3/M4 ran those files, not the whole set), then the e2e step with graph
# replays at 64K / 32K, B = 1 / 4 (wall, kernel-sum GPU time and the replay's device span per step).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -12
timeout 260 python3 eval/bench_e2e.py --contexts 65536 32768 --batches 1 4 --steps 8 --prof-steps 3 --prefill-reps 1 \
  --budget-s 200 --graphs --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -6
