#!/bin/bash
# Next GPU session, after call H1: serving on the H200 (transformers 5.17 in the image), equal KV budgets,
# BF16 engine vs GAAC pages (decode-then-attend: sdpa reads decoded pages; no fused-kernel reads yet).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_serving.py 2>&1 | tail -3
timeout 420 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests 24 --prompt-min 8192 \
  --prompt-max 16384 --new-tokens 128 --max-requests 16 --max-batch-tokens 2048 --out $OUT/serving_h200.json 2>&1 \
  | grep -v Warn | tail -4
