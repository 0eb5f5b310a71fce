#!/bin/bash
# Session 22, call W5 (H200 only, <= 200 s): the product files of issues 14 and 19 on the H200 at one commit:
# eval/bench_codec_v3.py (the staged decoder) and eval/memory_report.py (CUDA reservations by default, format v4).
# Prediction: decoder 88-93% of the bound (H100: 89%); memory ~0.93x DynamicCache at 32K / 64K (H100: 0.937x / 0.932x).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 80 python3 eval/bench_codec_v3.py --kv .kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror"
timeout 150 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -3
echo "done after $(( $(date +%s) - T0 )) s"
