#!/bin/bash
# Session 25, call Y4: issue 19's memory report on the H200 only (the H100 file exists: memory_h100.json); an H100
# exits at once. Prediction: ~0.93x DynamicCache's peak at 32K and 64K, as the H100's 0.937x / 0.932x.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && { echo "H100: nothing to do"; exit 0; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 150 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
