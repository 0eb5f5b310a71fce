#!/bin/bash
# Session 17, call R4 (one H200, <= 560 s): F4 (format4.py) and F4i (format4i.py, sign/mantissa words) in two
# processes: decode checks, bit identity with the twin, speed vs cuDNN / FA2 / twin / fused v3, synthetic and real
# SmolLM2 K/V (.kvdump/regtile_real_smollm2.pt, carried) -> $OUT/regtile4_callR4.json, $OUT/regtile4i_callR4.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
CASES=${3:-qwen3-8b:1:65536,qwen3-8b:4:65536,qwen3-8b:1:131072,qwen3-8b:16:32768,smollm2-135m:1:65536,smollm2-135m:1:32768,smollm2-real:1:32768,smollm2-real:16:32768}
for f in 4 4i; do
  timeout ${2:-260} python3 lab/experiments/regtile/bench.py --fmt $f --out $OUT/regtile${f}_call${4:-R4}.json --cases $CASES 2>&1 \
    | grep -v Warn | grep -E "decode|\] |failed|Error|error" | tail -20
  echo "bench fmt $f rc ${PIPESTATUS[0]}"
done
