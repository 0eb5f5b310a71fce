#!/bin/bash
# Session 14, call C: equal-memory serving at 8 GiB with the prompts (8-32K) and 256 new tokens.
# The BF16 engine runs first (its row is written when it ends); the GAAC engine after it if time is left.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout ${2:-560} python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests ${3:-10} \
  --prompt-min 8192 --prompt-max 32768 --new-tokens 256 --max-requests 16 --max-batch-tokens 2048 \
  --fused-decode --skip-twin ${4:-} --out $OUT/serving_h200_8g.json 2>&1 | grep -v -i warn | tail -8
