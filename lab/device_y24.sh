#!/bin/bash
# Session 35, call Y24: call Y21's sector question once more (PLAIN_COPY=1's counters and A/B); after the v4 planner's MERGE_BATCH=2 at head_dim >= 128 (issue 15: the short rows; call Y21's
# A/B): the v4 kernel's GPU tests, the end-to-end step with compiled ops, the v4 grid (H100: eval/results/attention_h100.json; H200: attention_h200.json),
# in that order while time is left.
# Usage: $0 <commit> <seconds>. Prediction: notebook ("Call Y24 prediction").
LIMIT=$2
source lab/device_env.sh
h200_memory_codec
# PLAIN_COPY=1 (twin lab define): whole tiles copied without cp.async's src-size operand. Its per-SASS sectors, then A/B
timeout 60 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SourceCounters -o /tmp/src_pc -f \
  python3 lab/experiments/twin_ncu_one.py qwen3-8b:4:65536 twin PLAIN_COPY=1 > /tmp/ncu_src.log 2>&1
ncu -i /tmp/src_pc.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 lab/ncu_sectors_per_sass.py /tmp/src.csv > $OUT/sectors_sass_twin_PLAIN_COPY_1.txt 2>&1
tail -1 $OUT/sectors_sass_twin_PLAIN_COPY_1.txt | cut -c1-700; grep LDGSTS $OUT/sectors_sass_twin_PLAIN_COPY_1.txt | head -3 | cut -c1-330
timeout 60 python3 lab/experiments/twin_define_ab.py --out $OUT/twin_plaincopy_$GPU.json \
  --cases qwen3-8b:4:65536 qwen3-8b:16:32768 qwen3-8b:1:65536 --variants "" PLAIN_COPY=1 2>&1 | grep -E "B=|wrote|rror"
echo "plain copy done after $SECONDS s"
# the v4 kernel's GPU tests only: the planner change is the v4's (the twin's default cubins are unchanged)
timeout 150 python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider > $OUT/pytest_gpu_v4_$GPU.txt 2>&1
tail -1 $OUT/pytest_gpu_v4_$GPU.txt; echo "tests done after $SECONDS s"
[ $(left) -gt 170 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 \
  --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 150 )) \
  --graphs --compile-ops --out $OUT/e2e_compiled_$GPU.json 2>&1 | grep -v Warn | tail -4
echo "e2e done after $SECONDS s"
[ $(left) -gt 100 ] && timeout $(( $(left) - 5 )) python3 eval/bench_attention_v4.py --budget-s $(( $(left) - 25 )) \
  --out $OUT/attention_$GPU.json > $OUT/grid.log 2>&1; tail -2 $OUT/grid.log; echo "grid done after $SECONDS s"
echo "all done after $SECONDS s"
