#!/bin/bash
# Call K1 (session 10): the one-slot K ring + 4 CTAs per SM as the default at d <= 128, checked by every
# fused / v3-cache GPU test (incl. the fixed sync-free store test), then the whole attention grid.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_fused.py tests/test_cache_v3_gpu.py \
  --tb=short > $OUT/pytest_gpu.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -12
timeout 150 python3 eval/bench_attention_v3.py --out $OUT/attention_h200.json 2>&1 | grep -v Warn | tail -50
