#!/bin/bash
# Session 19, call T3 (one H200): per-SASS stall samples of the v4 kernel (TABLE_WINDOW) at the planner's launch,
# Qwen3 B=1 64K and SmolLM2 B=1 32K, and Qwen3 B=1 64K at W8 S3 (slower than S2 in T2: why) -> $OUT/summary_*.txt
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for v in "qwen3-8b:1:65536" "smollm2-135m:1:32768" "qwen3-8b:1:65536 STAGES=3"; do
  tag=$(echo $v | tr ' :=' ___)
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    -k regex:gaac_v4_decode_split --launch-skip 2 --launch-count 1 -o /tmp/rep_$tag -f python3 lab/experiments/v4_ncu_one.py $v > /tmp/ncu_$tag.log 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page source --csv --print-source sass > /tmp/src_$tag.csv 2>&1
  python3 lab/ncu_src_summary.py /tmp/src_$tag.csv 60 > $OUT/summary_v4_${tag}_callT3.txt 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page details --csv > $OUT/details_v4_${tag}_callT3.csv 2>&1
  echo "== $v"; head -3 $OUT/summary_v4_${tag}_callT3.txt | cut -c1-900; tail -5 /tmp/ncu_$tag.log
done
