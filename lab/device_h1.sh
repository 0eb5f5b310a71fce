#!/bin/bash
# Call H1 (session 9): every GPU test on the merged tree, the quick grid, the chunked-prefill bench,
# ncu instruction counts of the current default launch.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tail -12 | tee $OUT/pytest_gpu.txt
timeout 90 python3 eval/bench_attention_v3.py --quick --out $OUT/attention_v3_quick.json 2>&1 | grep -v Warn | tail -9
timeout 150 python3 eval/bench_chunked_prefill.py --out $OUT/chunked_prefill_h200.json 2>&1 | grep -v Warn | tail -18
M=smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_lsu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg
for probe in 0 1; do
  timeout 90 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --metrics $M \
    -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python3 lab/ncu_probe.py default $probe > $OUT/ncu_default_probe$probe.txt 2>&1
  echo "== default probe $probe"; grep -E "inst_executed|pipe_|issue_active|Duration|cycles_elapsed|Stall|Warp Cycles" $OUT/ncu_default_probe$probe.txt | awk '{$1=$1};1' | head -16
done
