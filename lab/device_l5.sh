#!/bin/bash
# Call L5 (session 11): FULL_SPLIT (now the default) vs FULL_SPLIT=0 at the planner's launches, bits compared;
# the fused, v3-cache and BF16-kernel GPU tests (attend.cuh gained the before_v hook); the attention grid.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for c in "qwen3-8b 1 2/2/4/2/1" "qwen3-8b 4 2/2/4/2/1" "smollm2-135m 1 2/2/4/1/1" "gemma3 1 2/6/1/2/1"; do
  set -- $c
  timeout 60 python3 lab/probe_fused.py --shape $1 --batch $2 --context 65536 --probes 0 --configs $3 \
    --extra ",FULL_SPLIT=0" --out $OUT/fullsplit_$1_b$2.json 2>&1 | grep -v Warn | cut -c1-100
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_fused.py tests/test_cache_v3_gpu.py \
  tests/test_cuda_attention.py --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -8
timeout 60 python3 eval/bench_attention_v3.py --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "65536|131072" | head -12
