#!/bin/bash
# Session 35, call Y24: after the v4 planner's MERGE_BATCH=2 at head_dim >= 128 (issue 15: the short rows; call Y21's
# A/B): the GPU tests of both kernels, the v4 grid (H100: eval/results/attention_h100.json; H200: attention_h200.json),
# then call Y23's end-to-end step with the model's ops compiled (issue 15's graph wall / GPU) with what is left.
# Usage: $0 <commit> <seconds>. Prediction: notebook ("Call Y24 prediction").
LIMIT=$2
source lab/device_env.sh
h200_memory_codec
gpu_tests 170
[ $(left) -gt 100 ] && timeout 90 python3 eval/bench_attention_v4.py --budget-s 70 \
  --out $OUT/attention_$GPU.json > $OUT/grid.log 2>&1; tail -2 $OUT/grid.log; echo "grid done after $SECONDS s"
[ $(left) -gt 150 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 \
  --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 150 )) \
  --graphs --compile-ops --out $OUT/e2e_compiled_$GPU.json 2>&1 | grep -v Warn | tail -4
echo "all done after $SECONDS s"
