#!/bin/bash
# Device calls of the CUDA C++ work (device tool, repo root): bash lab/device_cuda.sh STEP COMMIT
#   1: GPU tests of the CUDA decode kernel + quick bench with a launch-config sweep
#   2: the whole BF16 grid (eval/results/attention_bf16_h200.json)
set -o pipefail
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${2:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import cuda.core, torch; print('cuda.core', cuda.core.__version__, 'torch', torch.__version__)"
if [ "${1:-1}" = 1 ]; then
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_attention.py tests/test_cuda_build.py 2>&1 | tail -25 | tee $OUT/pytest_cuda.txt
timeout 300 python3 eval/bench_attention_bf16.py --quick --sweep --out $OUT/attention_bf16_quick.json 2>&1 | tail -40 | tee $OUT/bench.log
timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
  -k 'regex:gaac_bf16|cudnn|flash' --launch-skip 3 --launch-count 3 python3 lab/ncu_decode.py > $OUT/ncu.txt 2>&1
grep -E "^  [a-zA-Z_]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Stall" $OUT/ncu.txt | cut -c1-150 | head -70
fi
if [ "${1:-1}" = 2 ]; then
timeout 560 python3 eval/bench_attention_bf16.py --sweep --budget-s 480 --out $OUT/attention_bf16_h200.json 2>&1 | grep -v "^  sweep" | tail -50 | tee $OUT/bench.log
fi
