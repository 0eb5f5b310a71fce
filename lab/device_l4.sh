#!/bin/bash
# Call L4 (session 11): mbarrier suspend-time hint (MBAR_SUSPEND_NS, now 10 ms by default) vs the old plain
# try_wait loop (MBAR_SUSPEND_NS=0) at the planner's launches, bits compared; then every GPU test and the
# full attention grid with the new default.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for c in "qwen3-8b 1 2/2/4/2/1" "qwen3-8b 4 2/2/4/2/1" "smollm2-135m 1 2/2/4/1/1" "gemma3 1 2/6/1/2/1"; do
  set -- $c
  timeout 90 python3 lab/probe_fused.py --shape $1 --batch $2 --context 65536 --probes 0 --configs $3 \
    --extra ",MBAR_SUSPEND_NS=0,MBAR_SUSPEND_NS=100000" --out $OUT/mbar_$1_b$2.json 2>&1 | grep -v Warn | cut -c1-110
done
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -8
timeout 150 python3 eval/bench_attention_v3.py --out $OUT/attention_h200.json 2>&1 | grep -v Warn | tail -48
