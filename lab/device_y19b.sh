#!/bin/bash
# Session 34, call Y19b: the defines call Y19 chose (args NAME=V ..., may be none) flipped in this working copy for the
# call (flipped.txt, GAAC_DIRTY=1), then the GPU tests of both kernels and both grids.
# Usage: $0 <commit> <seconds> [NAME=V ...]
LIMIT=$2
source lab/device_env.sh
shift 2
flip_defines "$@"
T=$(( $(left) - 150 )); [ $T -gt 200 ] && T=200
gpu_tests $T
[ $(left) -gt 100 ] && timeout 80 python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s 60 \
  --out $OUT/attention_$GPU.json > $OUT/grid_$GPU.log 2>&1; tail -2 $OUT/grid_$GPU.log; echo "grid done after $SECONDS s"
[ $(left) -gt 60 ] && timeout 55 python3 eval/bench_attention_bf16.py --budget-s 45 --out $OUT/attention_bf16_$GPU.json \
  > $OUT/bf16_$GPU.log 2>&1; tail -2 $OUT/bf16_$GPU.log; echo "twin grid done after $SECONDS s"
echo "all done after $SECONDS s"
