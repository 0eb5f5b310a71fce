#!/bin/bash
# Session 34, call Y20 (issues 19, 14, 15): on an H200 issue 19's memory line and issue 14's codec file (carry .kvdump),
# then the v4 grid with EARLY_LOADS / SPEC_TABLE on (their default since 9c074e2) and, with time left, the GPU tests of
# the v4 kernel. On an H100 only the grid and tests (the memory line and codec file are H200 must-shows).
# Usage: $0 <commit> [seconds, default 400]. Prediction: notebook, "Call Y20 prediction".
LIMIT=${2:-400}
source lab/device_env.sh
[ "$GPU" = h200 ] && {
  timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
    | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
  echo "memory done after $SECONDS s"
  [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 40 \
    python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
  echo "codec done after $SECONDS s"
}
[ $(left) -gt 90 ] && timeout 80 python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s 60 \
  --out $OUT/attention_$GPU.json > $OUT/grid_$GPU.log 2>&1; tail -2 $OUT/grid_$GPU.log; echo "grid done after $SECONDS s"
T=$(( $(left) - 10 ))
[ $T -gt 30 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider \
  > $OUT/pytest_gpu_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
echo "all done after $SECONDS s"
