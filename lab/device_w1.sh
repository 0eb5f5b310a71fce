#!/bin/bash
# Session 22, call W1 (one H200 or H100, <= 300 s): issue 14's standalone v3 decoder and decode-and-reduce under
# their compile-time knobs (lab/experiments/codec_v3_sweep.py; the data is carried: .kvdump/smollm2_kv_v3.pt).
# $1: the commit measured, as a literal. Prediction: lab/cuda-decode-notebook.md "Session 22".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1"
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
R=$(pwd); cd /tmp && timeout 280 python3 $R/lab/experiments/codec_v3_sweep.py --kv "$R/.kvdump/smollm2_kv_v3.pt" \
  --out $OUT/codec_v3_sweep_${GPU}.json 2>&1 | grep -v Warn | tail -60
echo "done after $(( $(date +%s) - T0 )) s"
