#!/bin/bash
# Next session (written in session 36), issue 17, after Y27 if device time is left (~560 s on an H200): the 8 GiB serving
# run again, now recording max_decoding (most requests decoding at one instant) beside max_concurrent (requests holding
# blocks, which also counts a request admitted mid-prefill and preempted later: BF16's 4 at 8 GiB with 58K tokens of
# blocks against prompts of 13-30K). Usage: $0 <commit>. Prediction: lab/cuda-decode-notebook.md, "Call Y28 prediction".
source lab/device_env.sh >/dev/null 2>&1  # $1: the commit measured
timeout 580 python3 eval/bench_serving.py --model qwen3-8b-random --budgets-gb 8 --requests 16 --prompt-min 8192 \
  --prompt-max 32768 --new-tokens 256 --max-requests 16 --max-batch-tokens 2048 --fused-decode --skip-twin \
  --out $OUT/serving_h200_8g_$GPU.json 2>&1 | grep -vi warn | tail -6
