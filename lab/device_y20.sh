#!/bin/bash
# Session 34, call Y20 (issues 19, 14, 15): on an H200 issue 19's memory line and issue 14's codec file (carry .kvdump),
# then Nsight Compute's per-SASS sectors of the twin and FA2 (issue 13), the v4 grid with EARLY_LOADS / SPEC_TABLE on (their default since 9c074e2) and, with time left, the GPU tests of
# the v4 kernel. On an H100 the ncu step only (the memory line and codec file are H200 must-shows).
# Usage: $0 <commit> [seconds, default 400]. Prediction: notebook, "Call Y20 prediction".
LIMIT=${2:-480}
source lab/device_env.sh
h200_memory_codec
# the split merge's remainder (MERGE_BATCH=2, attend.cuh) against 1 and the default; the best flipped for the grid
[ $(left) -gt 150 ] && timeout 90 python3 lab/experiments/v4_define_ab.py --out $OUT/merge_ab_$GPU.json \
  --cases gemma3:1:4096 gemma3:1:16384 qwen3-8b:1:16384 qwen3-8b:1:65536 qwen3-8b:4:65536 smollm2-135m:1:4096 \
  smollm2-135m:1:16384 --variants "" MERGE_BATCH=1 MERGE_BATCH=2 2>&1 | grep -E "B=|wrote|rror"
echo "merge ab done after $SECONDS s"
[ -f $OUT/merge_ab_$GPU.json ] && for nv in $(python3 lab/experiments/ab_verdict.py $OUT/merge_ab_$GPU.json --best); do
  flip_defines "$nv"
done
[ "$GPU" = h200 ] && [ $(left) -gt 90 ] && timeout 80 python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s 60 \
  --out $OUT/attention_$GPU.json > $OUT/grid_$GPU.log 2>&1; tail -2 $OUT/grid_$GPU.log; echo "grid done after $SECONDS s"
# issue 13: which SASS copy asks L2 for the twin's extra sectors (Y17/Y19: 1.5x FA2's at the same DRAM bytes)
for impl in twin fa2; do
  [ $(left) -lt 100 ] && break
  timeout 60 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SourceCounters -o /tmp/src_$impl -f \
    python3 lab/experiments/twin_ncu_one.py qwen3-8b:4:65536 $impl > /tmp/ncu_src_$impl.log 2>&1
  ncu -i /tmp/src_$impl.ncu-rep --page source --csv --print-source sass > /tmp/src_$impl.csv 2>&1
  python3 lab/ncu_sectors_per_sass.py /tmp/src_$impl.csv > $OUT/sectors_sass_$impl.txt 2>&1
  echo "== $impl"; tail -1 $OUT/sectors_sass_$impl.txt | cut -c1-700; tail -3 /tmp/ncu_src_$impl.log | cut -c1-300
done
echo "ncu done after $SECONDS s"
T=$(( $(left) - 10 ))
# the twin shares attend.cuh's merge: its tests run too where the call flipped MERGE_BATCH
TESTS="tests/test_v4_gpu.py"; [ -f $OUT/flipped.txt ] && TESTS="$TESTS tests/test_cuda_attention.py"
{ [ "$GPU" = h200 ] || [ -f $OUT/flipped.txt ]; } && [ $T -gt 30 ] && timeout $T python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider \
  > $OUT/pytest_gpu_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
echo "all done after $SECONDS s"
