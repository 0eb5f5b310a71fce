#!/bin/bash
# Session 37 (device starts kept failing: the budget shrank): call Y27's parts, most valuable first.
# (0) the one-launch tail append's GPU tests; (1) e2e 64K B=1 / B=4 with --compile-ops fused + kernel tables (issue 15);
# (2) v4 split sweep, 4-warp launches, TLB_WARM A/B (issue 13 / 15 kernel questions); (3) codec windows (issue 14);
# (4) e2e with --compile-ops ops at this commit; (5) the graph-mode GPU tests. Usage: $0 <commit> <seconds>.
# Predictions: lab/cuda-decode-notebook.md, "Call Y27 prediction" and "One-launch tail append".
LIMIT=${2:-560}
source lab/device_env.sh >/dev/null 2>&1
timeout 40 python3 -m pytest -q -m gpu tests/test_tail_append.py -p no:cacheprovider 2>&1 | tail -1
e2e() {  # $1: compile-ops level, $2: seconds at most
  timeout $2 python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
    --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $2 - 35 )) --graphs --compile-ops $1 \
    --kernel-table --out $OUT/e2e_${1}_$GPU.json 2>&1 | grep -v Warn | tail -3
}
e2e fused $(( $(left) > 260 ? 230 : $(left) - 20 ))
echo "e2e fused done after $SECONDS s"
[ $(left) -gt 60 ] && SWEEP_CASES="qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536" SWEEP_SPLITS="3 4 12 14 15 16" timeout 50 python3 lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_qwen3_$GPU.json 2>&1 | grep qwen3
[ $(left) -gt 60 ] && timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_w4_$GPU.json --cases qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536 --variants "" launch=4:2:2 launch=4:3:2 2>&1 | grep -E "B=|wrote|rror"
[ $(left) -gt 60 ] && timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_tlbwarm_$GPU.json --cases qwen3-8b:1:131072 qwen3-8b:1:65536 qwen3-8b:4:65536 --variants "" TLB_WARM=1 2>&1 | grep -E "B=|wrote|rror"
[ $(left) -gt 40 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && timeout 30 python3 lab/experiments/codec_v3_sweep.py --head-dims 64 128 256 --out $OUT/codec_v3_sweep_w2_$GPU.json --variants 4:8:2:128 2:4:2:256 2:4:1:256 2>&1 | grep -E "^d=|wrote"
[ $(left) -gt 200 ] && e2e ops $(( $(left) - 10 ))
[ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 -m pytest -q -m gpu tests/test_cuda_graphs_gpu.py -p no:cacheprovider 2>&1 | tail -2
echo "all done after $SECONDS s"
