#!/bin/bash
# Stall reasons of the fused kernel (per issued instruction), default launch, Qwen3-8B B=1 64K.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 240 ncu --clock-control none --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__warps_active.avg.per_cycle_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum' \
  -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python3 lab/ncu_fused.py 2 3 3 > $OUT/ncu_stalls.txt 2>&1
grep -E "stalled|inst_executed|warps_active|throughput|wavefronts|conflicts|duration" $OUT/ncu_stalls.txt | awk '{print $1, $(NF)}' | sort -k2 -n -r | head -40
