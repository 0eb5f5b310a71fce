#!/bin/bash
# Session 38, device time short after repeated failed starts (~800 s left): Y31's first two parts only, on an H200
# (needs_h200; carry .kvdump), ~420 s. Usage: $0 <commit> <seconds>. Prediction: "Call Y31 prediction" (notebook).
LIMIT=${2:-420}
source lab/device_env.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q -m gpu tests/test_tail_append.py tests/test_cuda_graphs_gpu.py tests/test_cache_v3_gpu.py \
  tests/test_v4_gpu.py -k "tail or graph or cache or generate or sync" -p no:cacheprovider > $OUT/pytest_gpu_$GPU.txt 2>&1
tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
timeout $(( $(left) - 40 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 70 )) --graphs --compile-ops fused \
  --kernel-table --out $OUT/e2e_fused_$GPU.json 2>&1 | grep -v Warn | tail -3
echo "e2e done after $SECONDS s"
[ $(left) -gt 30 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && timeout $(( $(left) - 5 )) python3 lab/experiments/codec_v3_sweep.py --head-dims 64,128,256 --out $OUT/codec_v3_sweep_w2_$GPU.json --variants 4:8:2:128 2:4:2:256 2>&1 | grep -E "^d=|wrote"
echo "all done after $SECONDS s"
