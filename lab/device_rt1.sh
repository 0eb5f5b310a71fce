#!/bin/bash
# Session 16, call R1 (one H200, <= 420 s): register tiles (lab/experiments/regtile): decode check of every
# BF16 pattern through the kernel's own LaneTile code, bit identity with the BF16 twin at the same launch,
# speed vs cuDNN / FA2 / twin / fused v3 in one process -> $OUT/regtile_call${4:-R1}.json (written after each case).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout ${2:-400} python3 lab/experiments/regtile/bench.py --out $OUT/regtile_call${4:-R1}.json \
  --cases ${3:-qwen3-8b:1:65536,qwen3-8b:4:65536,qwen3-8b:1:131072,qwen3-8b:16:32768,smollm2-135m:1:65536} 2>&1 \
  | grep -v Warn | tail -60
echo "bench rc ${PIPESTATUS[0]}"
