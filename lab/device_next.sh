#!/bin/bash
# Next GPU session (written in session 11). Call 1: every GPU test (session 11 added tests/test_serving_gpu.py:
# serving's PagedKV through the fused kernel, never run yet), then serving at 8 GiB with decode steps through
# the fused kernel (gaac_serving(fused_decode=True), issue 17's throughput; prediction in the notebook).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -12
timeout 330 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests 24 --prompt-min 8192 \
  --prompt-max 16384 --new-tokens 128 --max-requests 16 --max-batch-tokens 2048 --fused-decode \
  --out $OUT/serving_h200.json 2>&1 | grep -v Warn | tail -3
