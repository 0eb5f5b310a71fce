#!/bin/bash
# Session 38, while the H200 kind was in cool-down: the parts of Y31 an H100 can answer (~300 s). Usage: $0 <commit> <s>.
# (0) the cache-level GPU tests with the tail kernel in eager steps (never GPU-run before); (1) e2e 64K B=1 with
# --compile-ops fused (in-place residual adds since Y29) and fused-combo, kernel tables. B=4 does not fit an H100
# (static BF16 cache). Prediction: lab/cuda-decode-notebook.md, "Call Y32 prediction".
LIMIT=${2:-330}
source lab/device_env.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q -m gpu tests/test_tail_append.py tests/test_cuda_graphs_gpu.py tests/test_cache_v3_gpu.py \
  tests/test_v4_gpu.py -k "tail or graph or cache or generate or sync" -p no:cacheprovider > $OUT/pytest_gpu_$GPU.txt 2>&1
tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
[ $(left) -gt 120 ] && timeout $(( $(left) - 15 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 --steps 6 --prof-steps 2 \
  --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 100 --graphs --compile-ops fused \
  --kernel-table --out $OUT/e2e_fused_b1_$GPU.json 2>&1 | grep -v Warn | tail -2
echo "e2e done after $SECONDS s"
[ $(left) -gt 110 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 --steps 6 --prof-steps 2 \
  --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 90 --graphs --compile-ops fused-combo \
  --kernel-table --out $OUT/e2e_fused_combo_b1_$GPU.json 2>&1 | grep -v Warn | tail -2
echo "all done after $SECONDS s"
