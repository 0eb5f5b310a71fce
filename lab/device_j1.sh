#!/bin/bash
# Call J1 (session 10): fused + cache-v3 GPU tests after the one-slot K ring, the K-ring / 4-CTA sweep on
# the quick grid, and the serving twin (BF16 engine at GAAC's block count: same scheduling, same tokens).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 210 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_fused.py tests/test_cache_v3_gpu.py tests/test_v3_gpu.py tests/test_cache_gpu.py \
  --tb=short > $OUT/pytest_gpu.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -12
timeout 170 python3 lab/sweep_kslots.py --out $OUT/sweep_kslots.json 2>&1 | grep -v Warn | tail -11
timeout 170 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 2 --requests 12 --prompt-min 2048 \
  --prompt-max 4096 --new-tokens 64 --max-requests 16 --max-batch-tokens 2048 --out $OUT/serving_h200_twin.json 2>&1 \
  | grep -v Warn | tail -3
