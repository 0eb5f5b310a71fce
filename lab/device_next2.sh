#!/bin/bash
# Next GPU session, call 2: issue 17's second budget (16 GiB) with longer prompts and 256-token outputs.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 560 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 16 --requests 20 --prompt-min 8192 \
  --prompt-max 32768 --new-tokens 256 --max-requests 16 --max-batch-tokens 2048 --skip-twin \
  --out $OUT/serving_h200_16g.json 2>&1 | grep -v -i warn | tail -6
