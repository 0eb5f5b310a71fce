#!/bin/bash
# Session 17, call R3 (one H200, <= 480 s): register tiles in the fixed 4-bit lane layout (format4.py) and, in a
# second process, the 3-bit layout again: decode checks, bit identity with the BF16 twin, speed vs cuDNN / FA2 /
# twin / fused v3 -> $OUT/regtile4_call<tag>.json and $OUT/regtile_call<tag>.json.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
CASES=${3:-qwen3-8b:1:65536,qwen3-8b:4:65536,qwen3-8b:1:131072,qwen3-8b:16:32768,smollm2-135m:1:65536}
timeout ${2:-300} python3 lab/experiments/regtile/bench.py --fmt 4 --out $OUT/regtile4_call${4:-R3}.json --cases $CASES 2>&1 \
  | grep -v Warn | tail -45
echo "bench fmt4 rc ${PIPESTATUS[0]}"
