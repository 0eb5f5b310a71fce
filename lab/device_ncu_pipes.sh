#!/bin/bash
# Call G9: pipe utilisation and instruction mix of the fused kernel (ncu ComputeWorkloadAnalysis, InstructionStats).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for v in "2 3 3 2 0" "2 2 3 1 0" "2 2 3 1 6"; do
  tag=$(echo $v | tr ' ' _)
  timeout 120 ncu --clock-control none --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight \
    --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed_pipe_cbu.sum,smsp__inst_executed_pipe_adu.sum,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_elapsed.avg \
    -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python3 lab/ncu_probe.py $v > $OUT/ncu_pipes_$tag.txt 2>&1
  echo "== $v"; grep -E "inst_executed|pipe_|issue_active|Duration|wavefronts|cycles_elapsed|Executed Ipc|Issue Slots" $OUT/ncu_pipes_$tag.txt | awk '{$1=$1};1' | head -24
done
