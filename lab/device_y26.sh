# Session 36, call Y26 (H200): does Qwen3 B=1 time scale with the CTAs launched (forced splits; 4 warps x 2 CTAs per SM
# fills all 132 SMs), where a GAAC decode step's GPU time goes (e2e, compiled ops, per-kernel table), and the codec's
# 2-segment windows at every tuned head_dim. Prediction: lab/cuda-decode-notebook.md, "Call Y26 prediction".
source lab/device_env.sh >/dev/null 2>&1
SWEEP_CASES="qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536" SWEEP_SPLITS="3 4 12 14 15 16" timeout 50 python3 lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_qwen3_$GPU.json 2>&1 | grep qwen3
timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_w4_$GPU.json --cases qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536 --variants "" launch=4:2:2 launch=4:3:2 2>&1 | grep -E "B=|wrote|rror"
timeout 170 python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 160 --graphs --compile-ops --kernel-table --out $OUT/e2e_kernels_$GPU.json 2>&1 | grep -v Warn | tail -3
timeout 30 python3 lab/experiments/codec_v3_sweep.py --head-dims 64 128 256 --out $OUT/codec_v3_sweep_w2_$GPU.json --variants 4:8:2:128 2:4:2:256 2:4:1:256 2>&1 | grep -E "^d=|wrote"
echo "done after $SECONDS s"
