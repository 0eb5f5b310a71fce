#!/bin/bash
# Second call of the next GPU session: H200 memory (v3 default) and serving at 8 / 16 GiB with the twin.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 150 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | tail -4
timeout 420 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests 24 --prompt-min 8192 \
  --prompt-max 16384 --new-tokens 128 --max-requests 16 --max-batch-tokens 2048 --out $OUT/serving_h200.json 2>&1 \
  | grep -v Warn | tail -3
