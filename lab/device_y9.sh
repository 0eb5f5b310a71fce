#!/bin/bash
# Session 27, call Y9 (<= ~170 s): ONE_TILE_BODY (one compressed tile body instead of two) and K_ROLLED (K's k-steps
# as a rolled loop, d=256 only; call Y8 found the d=256 kernel instruction-fetch bound) vs the default, planner's launches, bit-identity against the twin per row.
# Usage: $0 <commit>. Prediction: lab/cuda-decode-notebook.md, "Call Y9 prediction".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 100 python3 lab/experiments/v4_define_ab.py --out $OUT/tile_body_d256_$GPU.json --cases gemma3:1:16384 \
  gemma3:1:65536 gemma3:4:65536 --variants "" ONE_TILE_BODY=1 K_ROLLED=1,CONST_REGS=0 \
  K_ROLLED=1,CONST_REGS=0,ONE_TILE_BODY=1 2>&1 | grep -E "B=|wrote|rror"
timeout 60 python3 lab/experiments/v4_define_ab.py --out $OUT/tile_body_d128_$GPU.json --cases qwen3-8b:1:65536 \
  smollm2-135m:1:32768 --variants "" ONE_TILE_BODY=1 2>&1 | grep -E "B=|wrote|rror"
echo "done after $SECONDS s"
