#!/bin/bash
# Session 34 (for the next H200): the H200 files that predate the entry loads (9c074e2): the v4 grid
# (eval/results/attention_h200.json), the twin grid (attention_bf16_h200.json), then the GPU tests of both kernels on
# the H200 (issue 13's must-show). Defines a call Y21 chose to flip may be passed as NAME=V (flipped for this call,
# GAAC_DIRTY=1, committed afterwards with the same source). Usage: $0 <commit> <seconds> [NAME=V ...]
LIMIT=$2
source lab/device_env.sh
shift 2
K="kernels/cuda/decode_attention_v4.cu kernels/cuda/decode_attention.cu kernels/cuda/include/gaac/attend.cuh kernels/cuda/include/gaac/ptx.cuh"
for nv in "$@"; do
  n=${nv%=*}; val=${nv#*=}
  sed -i -E "s/^#define $n [0-9]+( |$)/#define $n $val\1/" $K; grep -h "^#define $n " $K | tee -a $OUT/flipped.txt
  export GAAC_DIRTY=1
done
[ "$GPU" != h200 ] && echo "not an H200: the grids here would not replace the H200 files; tests only"
[ "$GPU" = h200 ] && [ $(left) -gt 100 ] && timeout 80 python3 eval/bench_attention_v4.py --budget-s 60 \
  --out $OUT/attention_h200.json > $OUT/grid.log 2>&1; tail -2 $OUT/grid.log; echo "grid done after $SECONDS s"
[ "$GPU" = h200 ] && [ $(left) -gt 70 ] && timeout 60 python3 eval/bench_attention_bf16.py --budget-s 45 \
  --out $OUT/attention_bf16_h200.json > $OUT/bf16.log 2>&1; tail -2 $OUT/bf16.log; echo "twin grid done after $SECONDS s"
T=$(( $(left) - 10 ))
[ $T -gt 30 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py tests/test_cuda_attention.py \
  -p no:cacheprovider > $OUT/pytest_gpu_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
echo "all done after $SECONDS s"
