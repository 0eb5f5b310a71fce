#!/bin/bash
# Session 28, call Y13 (<= ~120 s): H200 only: issue 19's memory line first. Any card: the buffered stamps (the
# final merging CTA prints every split's phases) of gaac and its twin. Usage: $0 <commit>. Prediction: notebook.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
[ "$GPU" = h200 ] && {
timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
}
timeout 60 python3 lab/experiments/v4_stamps.py --out $OUT/stamps_buffered_$GPU.json --launches 3 \
  --cases gemma3:1:16384 gemma3:1:65536 qwen3-8b:1:65536 smollm2-135m:1:16384 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "all done after $SECONDS s"
