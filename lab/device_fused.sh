#!/bin/bash
# Device calls of the fused GAAC v3 kernel work (device tool, repo root): bash lab/device_fused.sh STEP COMMIT
#   1: GPU tests (fused + the refactored BF16 kernel) + quick bench with a launch sweep
#   2: the whole grid (eval/results/attention_h200.json)
set -o pipefail
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${2:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee $OUT/gpu.txt
if [ "${1:-1}" = 1 ]; then
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_fused.py tests/test_cuda_attention.py 2>&1 | tail -25 | tee $OUT/pytest_fused.txt
timeout 300 python3 eval/bench_attention_v3.py --quick --sweep --budget-s 240 --out $OUT/attention_v3_quick.json 2>&1 | tail -45 | tee $OUT/bench.log
fi
if [ "${1:-1}" = 2 ]; then
timeout 560 python3 eval/bench_attention_v3.py --budget-s 500 --out $OUT/attention_h200.json 2>&1 | tail -50 | tee $OUT/bench.log
fi
if [ "${1:-1}" = 3 ]; then
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_fused.py 2>&1 | tail -3 | tee $OUT/pytest_fused.txt
timeout 200 python3 eval/bench_attention_v3.py --quick --budget-s 150 --out $OUT/attention_v3_quick.json 2>&1 | tail -12 | tee $OUT/bench.log
fi
