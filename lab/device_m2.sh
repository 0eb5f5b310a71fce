#!/bin/bash
# Session 12, call M2: serving at 8 GiB with decode steps through the fused kernel (issue 17's throughput).
# Call M1 ran all GPU tests (183 passed, test_serving_gpu included) but its serving run (bf16 + gaac + twin,
# 24 requests) ran past its 330 s; here 16 requests, no twin (with the fused kernel the twin is no
# bit-identity check: transformers' attention adds in another order), results written after each engine.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 480 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests 16 --prompt-min 8192 \
  --prompt-max 16384 --new-tokens 128 --max-requests 16 --max-batch-tokens 2048 --fused-decode --skip-twin \
  --out $OUT/serving_h200.json 2>&1 | grep -v -i warn | tail -6
