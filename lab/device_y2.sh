#!/bin/bash
# Session 25, call Y2 (<= 560 s; likely the session's last): H200 -> issue 19's memory report, then the whole v4
# grid with both pool layouts (shuffled = `gaac`, in order = what a GAACCache prefill writes) at the landed merge:
# the product file eval/results/attention_h200.json. H100 -> the same grid (lab evidence) without the memory report.
# Prediction (notebook, session 25): memory ~0.93x DynamicCache at 32K/64K; grid within +-3% of attention_h200.json
# (b532f47) in shuffled rows (the merge change measured nothing on the H100); in order 2-6% faster at 128K B=1 and B>=4
# (H200 T5: 4-6%); Qwen3 128K B=1 in order ~1.17-1.21x cuDNN; every row bit-identical in both layouts.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
TMAX=${2:-550}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
if [ "$GPU" = h200 ]; then
  timeout 110 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
    | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -4
  echo "memory done after $(( $(date +%s) - T0 )) s"
fi
L=$(( TMAX - ($(date +%s) - T0) ))
timeout $L python3 eval/bench_attention_v4.py --budget-s $(( L - 45 )) --layouts shuffled in_order --out $OUT/attention_${GPU}.json 2>&1 \
  | grep -v Warn | grep -E "B=|wrote|rror|cut" | cut -c1-150 | tail -62
echo "done after $(( $(date +%s) - T0 )) s"
