#!/bin/bash
# Call K2 (session 10): the v3-cache GPU tests after the sync-free store's prefill rule, and the whole
# grid after the 4-CTA stage rule (2 stages at 4 CTAs).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cache_v3_gpu.py --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -8
timeout 100 python3 eval/bench_attention_v3.py --out $OUT/attention_h200.json 2>&1 | grep -v Warn | tail -46
