#!/bin/bash
# Session 19, call T7 (one H200, <= 570 s): GPU tests after the default-format change (v4 on Hopper), the final v4
# grid, e2e with format v4 at 32K / 128K (B=1) and 32K (B=4, 16). $1: the commit measured (a literal: the device
# copy's git directory is the session's starting commit).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_v4_gpu.py tests/test_cache_v3_gpu.py tests/test_cuda_graphs_gpu.py \
  tests/test_v3_gpu.py > $OUT/pytest_gpu_callT7.txt 2>&1
echo "tests rc $? after $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_gpu_callT7.txt | tail -8
timeout 90 python3 eval/bench_attention_v4.py --budget-s 80 --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "B= 1|wrote|rror" | tail -16
echo "grid after $(( $(date +%s) - T0 )) s"
timeout 150 python3 eval/bench_e2e.py --contexts 32768 131072 --batches 1 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 140 --graphs --out $OUT/e2e_h200_v4_b1.json 2>&1 | grep -v Warn | tail -4
echo "e2e B=1 after $(( $(date +%s) - T0 )) s"
timeout $(( 560 - ($(date +%s) - T0) )) python3 eval/bench_e2e.py --contexts 32768 --batches 4 16 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 100 --graphs --out $OUT/e2e_h200_v4_32k.json 2>&1 | grep -v Warn | tail -4
echo "done after $(( $(date +%s) - T0 )) s"
