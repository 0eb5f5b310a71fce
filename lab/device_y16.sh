#!/bin/bash
# Session 30, call Y16 (the last ~150 s of device time): the MERGE_BATCH A/B alone, then, if it wins
# (lab/experiments/ab_verdict.py), the v4 GPU tests with it flipped for as long as the call has left.
# Usage: $0 <commit> [seconds, default 150]. Prediction: notebook, the MERGE_BATCH bullet under "Call Y15 prediction".
LIMIT=${2:-150}
source lab/device_env.sh
timeout 80 python3 lab/experiments/v4_define_ab.py --out $OUT/merge_batch_$GPU.json --cases gemma3:1:4096 gemma3:1:16384 \
  smollm2-135m:1:16384 qwen3-8b:1:65536 --variants "" MERGE_BATCH=1 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
for v in $(python3 lab/experiments/ab_verdict.py $OUT/merge_batch_$GPU.json --only MERGE_BATCH=1 2>/dev/null); do
  sed -i "s/^#define MERGE_BATCH 0 /#define MERGE_BATCH 1 /" kernels/cuda/include/gaac/attend.cuh
  grep -h "^#define MERGE_BATCH " kernels/cuda/include/gaac/attend.cuh | tee -a $OUT/flipped.txt
  T=$((LIMIT - SECONDS - 5)); [ $T -gt 20 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py \
    -p no:cacheprovider > $OUT/pytest_gpu_v4_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_v4_$GPU.txt
done
echo "all done after $SECONDS s"
