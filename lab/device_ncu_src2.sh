#!/bin/bash
# Call G3: per-SASS stall samples, summarised on the device (the CSVs are too many files to bring back).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for v in "$@"; do
  tag=$(echo $v | tr ' ' _)
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    -k regex:gaac_v3 --launch-skip 2 --launch-count 1 -o /tmp/rep_$tag -f python3 lab/ncu_probe.py $v > /tmp/ncu_$tag.log 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page source --csv --print-source sass > /tmp/src_$tag.csv 2>&1
  python3 lab/ncu_src_summary.py /tmp/src_$tag.csv 90 > $OUT/summary_$tag.txt 2>&1
  echo "== $v"; head -4 $OUT/summary_$tag.txt | cut -c1-600
done
