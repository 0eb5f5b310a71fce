#!/bin/bash
# Session 25, call Y4: issue 19's memory report on the H200 only (the H100 file exists: memory_h100.json); an H100
# exits at once. Then the whole grid, both layouts (the product file at the landed merge). Predictions: notebook, Y4.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && { echo "H100: nothing to do"; exit 0; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 150 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
# the whole v4 grid in both layouts (55 s on the H100 in Y2): the product file at the landed merge
timeout 240 python3 eval/bench_attention_v4.py --budget-s 200 --layouts shuffled in_order --out $OUT/attention_h200.json 2>&1 \
  | grep -v Warn | grep -E "B=|wrote|rror|cut" | cut -c1-150 | tail -48
echo "done after $SECONDS s"
