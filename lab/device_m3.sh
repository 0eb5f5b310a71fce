#!/bin/bash
# Session 12, call M3 (branch combo = main + the fp8-cuda2 commits): GPU tests of CUDA-graph decode steps
# (new), of the FP8 CUDA codec (new) and of every v3 kernel the FP8 change touches (core.cuh); then the
# 36-layer e2e step at 64K (and 32K if time is left) with CUDA-graph replays (--graphs).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 210 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs_gpu.py tests/test_fp8_gpu.py \
  tests/test_v3_gpu.py tests/test_cuda_fused.py tests/test_cache_v3_gpu.py --tb=short > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -14
timeout 330 python3 eval/bench_e2e.py --contexts 65536 32768 --batches 1 4 --steps 8 --prof-steps 3 --prefill-reps 1 \
  --budget-s 250 --graphs --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -9
