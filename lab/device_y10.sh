#!/bin/bash
# Session 28, call Y10 (<= ~230 s): on an H200, issue 19's memory report first (the one line it lacks); then call Y9
# unchanged (ONE_TILE_BODY / K_ROLLED A/B with a bit check per row). Usage: $0 <commit>.
# Prediction: lab/cuda-decode-notebook.md, "Call Y9 prediction" (carried over to Y10).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
[ "$GPU" = h200 ] && {
timeout 100 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
}
bash lab/device_y9.sh "$1"
echo "all done after $SECONDS s"
