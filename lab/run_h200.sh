#!/bin/bash
# One device call: install, GPU tests, codec bench, attention bench. Usage: bash eval/run_h200.sh BUDGET_S MAX_CASES
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
python3 -c "import gaac_hf.kernels.attention" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $OUT/gpu.txt
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 200 python3 -m pytest -q -x -m gpu tests/test_kernels_codec.py tests/test_kernels_attention.py 2>&1 | tail -15 | tee $OUT/pytest_gpu.txt
fi
if [ "${SKIP_CODEC:-0}" != 1 ]; then
  timeout 150 python3 eval/bench_codec.py --out $OUT/codec_h200.json 2>&1 | tee $OUT/codec.log
fi
timeout 400 python3 eval/bench_attention.py --out $OUT/attention_h200.json --budget-s ${1:-150} --max-cases ${2:-1000} --asm-dir $OUT/asm 2>&1 | tee $OUT/attention.log
