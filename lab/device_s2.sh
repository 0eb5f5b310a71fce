#!/bin/bash
# Session 18, call S2: graph-mode GPU tests with v3 and v4 caches, then the full v4 attention grid -> $OUT/attention_h200.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs_gpu.py 2>&1 | tail -4
echo "tests after $(( $(date +%s) - T0 )) s"
timeout ${2:-380} python3 eval/bench_attention_v4.py --budget-s ${3:-330} --out $OUT/attention_h200.json 2>&1 | grep -v Warn | tail -64
echo "grid after $(( $(date +%s) - T0 )) s"
