#!/bin/bash
# Call G2: per-SASS-instruction stall samples of the fused kernel (ncu SourceCounters), two variants.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
ncu --version | tail -1
for v in "2 2 3 1 6" "2 3 3 2 0" "2 2 3 1 0"; do
  tag=$(echo $v | tr ' ' _)
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis_Tables --section LaunchStats --section Occupancy \
    -k regex:gaac_v3 --launch-skip 2 --launch-count 1 -o $OUT/rep_$tag -f python3 lab/ncu_probe.py $v > $OUT/ncu_$tag.log 2>&1
  ncu -i $OUT/rep_$tag.ncu-rep --page source --csv --print-source sass > $OUT/src_$tag.csv 2>$OUT/src_$tag.err
  ncu -i $OUT/rep_$tag.ncu-rep --page details > $OUT/details_$tag.txt 2>&1
  echo "== $v: $(wc -l < $OUT/src_$tag.csv) source rows"; head -c 300 $OUT/src_$tag.err
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Bank" $OUT/details_$tag.txt | head -12
done
rm -f $OUT/*.ncu-rep.tmp
