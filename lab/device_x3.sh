#!/bin/bash
# Session 24, call X3 (<= 580 s), only after X2 passed its GPU tests: the whole v4 grid at the merged commit (the
# product file eval/results/attention_<card>.json; both layouts where time allows), then the Gemma3 launch sweep
# with W4 x 3 stages x 1 CTA (session 23's addition). Prediction: as X2's rows for the rows it timed; every row
# bit-identical; the rest within 2% of attention_h200.json (H200) or of call V1's H100 rows.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 470 python3 eval/bench_attention_v4.py --budget-s 420 --layouts shuffled --out $OUT/attention_${GPU}.json 2>&1 \
  | grep -v Warn | grep -E "B=|wrote|rror|cut" | cut -c1-160 | tail -50
echo "grid after $(( $(date +%s) - T0 )) s"
LEFT=$(( 580 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && timeout $LEFT python3 eval/bench_attention_v4.py --sweep-only --sweep-cases gemma3:1:16384 gemma3:1:65536 \
  --out $OUT/attention_v4_sweep_gemma3_${GPU}.json 2>&1 | grep -E "sweep gemma3|rror" | sed 's/.num_warps/ W/'
echo "done after $(( $(date +%s) - T0 )) s"
