#!/bin/bash
# Session 18, call S1 (one H200, <= 560 s): format v4 in the product. GPU tests of v4 (and the v3 cache's, to see
# the shared dispatch), then the v4 attention quick grid with a launch sweep -> $OUT/
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout ${2:-230} python3 -m pytest -q -x -p no:cacheprovider tests/test_v4_gpu.py tests/test_cache_v3_gpu.py -k "not never_sync or v4" \
  2>&1 | tail -25
echo "tests rc ${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s"
timeout ${3:-300} python3 eval/bench_attention_v4.py --quick --sweep --budget-s 200 --out $OUT/attention_v4_quick_callS1.json 2>&1 \
  | grep -v Warn | tail -60
echo "bench rc ${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s"
