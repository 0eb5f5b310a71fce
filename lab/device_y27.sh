#!/bin/bash
# Next session (written in session 36, which lost its device time to refused starts after call Y25), for an H200:
# call Y26's three questions, then the end-to-end step with the model fused further (issue 15).
# (1) does Qwen3 B=1 time scale with the CTAs launched? forced splits 12-16 (96-128 CTAs on 132 SMs) and 4 warps x
#     2 CTAs per SM (264 CTAs: every SM busy); (2) the codec's 2-segment windows at d = 64 / 128 / 256 (issue 14);
# (3) e2e at 64K B=1 / B=4 with `--compile-ops fused` (stacked q/k/v and gate/up GEMMs, q/k norms in the rotary
#     embedding, add + norm: ~6 fewer kernels per layer) and per-kernel tables, beside `--compile-ops` (ops only).
# Usage: $0 <commit> <seconds> (carry .kvdump; device_env.sh records $1 as the commit). Predictions: lab/cuda-decode-notebook.md, "Call Y26 prediction" and "Call Y27".
LIMIT=${2:-560}
source lab/device_env.sh >/dev/null 2>&1
# session 37: the one-launch tail append of graph-mode steps (kernels/cuda/tail_append.cu) on the GPU, and the graph tests
timeout 90 python3 -m pytest -q -m gpu tests/test_tail_append.py tests/test_cuda_graphs_gpu.py -p no:cacheprovider 2>&1 | tail -2
SWEEP_CASES="qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536" SWEEP_SPLITS="3 4 12 14 15 16" timeout 50 python3 lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_qwen3_$GPU.json 2>&1 | grep qwen3
timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_w4_$GPU.json --cases qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536 --variants "" launch=4:2:2 launch=4:3:2 2>&1 | grep -E "B=|wrote|rror"
# (1b) TLB_WARM=1 (v4 lab define, session 36): L2 prefetch of each tile's first K / V line when its window is looked up
timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_tlbwarm_$GPU.json --cases qwen3-8b:1:131072 qwen3-8b:1:65536 qwen3-8b:4:65536 --variants "" TLB_WARM=1 2>&1 | grep -E "B=|wrote|rror"
[ -f .kvdump/smollm2_kv_v3.pt ] && timeout 30 python3 lab/experiments/codec_v3_sweep.py --head-dims 64 128 256 --out $OUT/codec_v3_sweep_w2_$GPU.json --variants 4:8:2:128 2:4:2:256 2:4:1:256 2>&1 | grep -E "^d=|wrote"
for level in fused ops; do
  [ $(left) -gt 150 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 \
    --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 40 )) \
    --graphs --compile-ops $level --kernel-table --out $OUT/e2e_${level}_$GPU.json 2>&1 | grep -v Warn | tail -3
done
echo "all done after $SECONDS s"
