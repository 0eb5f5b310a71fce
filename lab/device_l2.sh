#!/bin/bash
# Call L2 (session 11): the consumer-copies GPU tests (timeout = deadlock check), the copy_issue sweep,
# then the H200 memory report with the v3 default (memory_h200.json predates v3 on Hopper).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_fused.py -k "consumer_copies" --tb=short > $OUT/pytest_cc.txt 2>&1
echo "pytest rc $?"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" $OUT/pytest_cc.txt | tail -8
timeout 230 python3 lab/sweep_copy_issue.py --out $OUT/sweep_copy_issue.json 2>&1 | grep -v Warn | tail -12
timeout 140 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | tail -4
