#!/bin/bash
# Session 34 (for the next H200): the H200 files that predate the entry loads (9c074e2): the v4 grid
# (eval/results/attention_h200.json), the twin grid (attention_bf16_h200.json), then the GPU tests of both kernels on
# the H200 (issue 13's must-show). Defines a call Y21 chose to flip may be passed as NAME=V (flipped for this call,
# GAAC_DIRTY=1, committed afterwards with the same source). Usage: $0 <commit> <seconds> [NAME=V ...]
LIMIT=$2
source lab/device_env.sh
shift 2
flip_defines "$@"
[ "$GPU" != h200 ] && echo "not an H200: the grids here would not replace the H200 files; tests only"
[ "$GPU" = h200 ] && [ $(left) -gt 100 ] && timeout 80 python3 eval/bench_attention_v4.py --budget-s 60 \
  --out $OUT/attention_h200.json > $OUT/grid.log 2>&1; tail -2 $OUT/grid.log; echo "grid done after $SECONDS s"
[ "$GPU" = h200 ] && [ $(left) -gt 70 ] && timeout 60 python3 eval/bench_attention_bf16.py --budget-s 45 \
  --out $OUT/attention_bf16_h200.json > $OUT/bf16.log 2>&1; tail -2 $OUT/bf16.log; echo "twin grid done after $SECONDS s"
gpu_tests $(( $(left) - 10 ))
echo "all done after $SECONDS s"
