#!/bin/bash
# Next session (written in session 35), for an H200: (1) issue 14: the v3 decoder reached 84% of its read+write bound
# on the H200 (89% on an H100; codec_v3_h200.json): at 1.4x the copy rate with the same per-item latency it needs more
# bytes in flight, so sweep the resident CTAs (the register cap) and the window per warp item at d = 128;
# (2) issue 15: call Y23's end-to-end step with the model's ops compiled (never run: Y24 had no time left).
# Usage: $0 <commit> <seconds> (carry .kvdump). Prediction: notebook ("Call Y25 prediction").
LIMIT=$2
source lab/device_env.sh
[ -f .kvdump/smollm2_kv_v3.pt ] && timeout 120 python3 lab/experiments/codec_v3_sweep.py --head-dims 128 \
  --out $OUT/codec_v3_sweep_$GPU.json --variants 4:8:2:128 4:10:2:128 4:12:2:128 4:16:2:128 2:8:2:128 2:12:2:128 \
  2:4:1:256 2>&1 | grep -vi warn | tail -12
echo "sweep done after $SECONDS s"
[ $(left) -gt 170 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 \
  --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 150 )) \
  --graphs --compile-ops --out $OUT/e2e_compiled_$GPU.json 2>&1 | grep -v Warn | tail -4
echo "all done after $SECONDS s"
