#!/bin/bash
# Session 19, call T1 (one H200, <= 540 s): v4 GPU tests (head_dim 256 and the table window are new) and the graph
# tests, then the TABLE_WINDOW A/B on the key cases, then ncu stall reasons of both at Qwen3 B=1 64K -> $OUT/
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout ${2:-200} python3 -m pytest -q -p no:cacheprovider tests/test_v4_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/pytest_gpu_callT1.txt 2>&1
echo "tests rc $? after $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gpu_callT1.txt | tail -12
timeout ${3:-150} python3 lab/experiments/v4_ab.py --define TABLE_WINDOW --values 0 1 --out $OUT/v4_ab_table_window_callT1.json 2>&1 | grep -v Warn | tail -10
echo "ab after $(( $(date +%s) - T0 )) s"
for tw in 0 1; do
  timeout 60 ncu --clock-control none --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum' \
    -k regex:gaac_v4_decode_split --launch-skip 2 --launch-count 1 python3 lab/experiments/v4_ncu_one.py qwen3-8b:1:65536 TABLE_WINDOW=$tw > $OUT/ncu_v4_tw${tw}_callT1.txt 2>&1
  echo "== ncu TABLE_WINDOW=$tw"; grep -E "stalled|inst_executed|warps_active|issue_active|dram|duration" $OUT/ncu_v4_tw${tw}_callT1.txt | awk '{print $1, $(NF)}' | sort -k2 -g -r | head -12
done
echo "done after $(( $(date +%s) - T0 )) s"
