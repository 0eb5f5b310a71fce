#!/bin/bash
# Session 35, call Y23 (issue 15): the end-to-end decode step with the model's own element-wise ops compiled
# (bench_e2e --compile-ops, eval/compiled_ops.py) for every cache kind alike: does graph wall time come within 10% of
# GPU time (was 1.13-1.28), and does the GPU-time ratio against the in-place static cuDNN cache rise (the model's
# small kernels are a fixed cost both sides pay)? Qwen3-8B shape, format v4, 64K, B=1 then B=4.
# Usage: $0 <commit> <seconds>. Prediction: notebook ("Call Y23 prediction").
LIMIT=$2
source lab/device_env.sh
timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 \
  --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 120 )) --graphs \
  --compile-ops --out $OUT/e2e_compiled_$GPU.json 2>&1 | grep -v Warn | tail -5
echo "all done after $SECONDS s"
