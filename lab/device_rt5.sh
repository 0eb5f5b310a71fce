#!/bin/bash
# Session 17, call R5 (one H200, <= 200 s): F4i with 2 and 3 waves of splits (few kv heads, 128K) -> $OUT/regtile4i_callR5.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout ${2:-150} python3 lab/experiments/regtile/bench.py --fmt 4i --skip-decode --waves 2 --out $OUT/regtile4i_callR5.json \
  --cases qwen3-8b:1:131072,qwen3-8b:1:65536,smollm2-135m:1:65536,smollm2-real:1:32768,qwen3-8b:4:65536 2>&1 | grep -v Warn | grep -E "sp|\] |failed|rror" | tail -60
echo "bench rc ${PIPESTATUS[0]}"
