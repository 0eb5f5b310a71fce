#!/bin/bash
# Session 31, call Y17 (issue 13: why the BF16 twin trails FA2 / cuDNN at B >= 4): Nsight Compute on one call of
# each implementation at Qwen3-8B B=16 32K and B=4 64K (lab/experiments/twin_ncu_one.py): duration, DRAM throughput and
# bytes, L2 hit rate, occupancy, grid, and the warp stall breakdown. Usage: $0 <commit> [seconds, default 200].
# Prediction: notebook, "Call Y17 prediction".
LIMIT=${2:-200}
source lab/device_env.sh
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
for c in qwen3-8b:16:32768:twin qwen3-8b:16:32768:fa2 qwen3-8b:16:32768:cudnn qwen3-8b:4:65536:twin qwen3-8b:4:65536:fa2; do
  [ $(left) -lt 40 ] && { echo "skip $c (time)"; continue; }
  case_=${c%:*}; impl=${c##*:}; tag=$(echo $c | tr ':' _)
  timeout 60 ncu --clock-control none --nvtx --nvtx-include "prof/" --section WarpStateStats --metrics $M \
    python3 lab/experiments/twin_ncu_one.py $case_ $impl > $OUT/ncu_$tag.txt 2>&1
  echo "== $c"; grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__|lts__t_sector_hit|launch__|warps_active|issue_active|Stall|stall" \
    $OUT/ncu_$tag.txt | grep -v "^==PROF" | awk '{$1=$1};1' | head -30
done
echo "all done after $SECONDS s"
