#!/bin/bash
# Planned at the end of session 4 (device tool, repo root): bash eval/run_h200_s5.sh 1|2|3
# Everything below was built after session 4's device time was spent (predictions in eval/NOTES.md):
#   1. GPU tests (decode_tables_triton: K, V and tails in one launch; the pair-word store; "auto"
#      without cuDNN), codec (fast decoder ~1,800 GB/s at d=128 predicted), attention with the
#      decompress column (decode-then-cuDNN at 64K B=1 ~237 us predicted); the per-row-offset decoder
#      experiment (~2,200-2,300 GB/s predicted against the product's ~1,800), which decides whether
#      the row offsets become part of the format / pools.
#   2. end to end at 64K with fused="auto" (wall per step ~40 ms at B=1 and ~42 ms at B=4 predicted,
#      against 43.7 / 67.2 fused) and fused=True in the same process.
#   3. the whole attention grid (Gemma3 / SmolLM2 shapes, B=16), both timers and the decompress columns.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
if [ "${1:-1}" = 1 ]; then
timeout 150 python3 -m pytest -q -x -m gpu tests/ 2>&1 | tail -3 | tee $OUT/pytest_gpu.txt
timeout 100 python3 eval/bench_codec.py --quick --heads 32 --out $OUT/codec_h200_words.json 2>&1 | tail -3 | tee $OUT/codec.log
timeout 120 python3 eval/experiments/decode_rowoff.py --gpu --out $OUT/decode_rowoff_h200.json 2>&1 | tail -14 | tee $OUT/rowoff.log
timeout 190 python3 eval/bench_attention.py --out $OUT/attention_h200_decompress2.json --budget-s 140 --max-cases 6 \
  --timer graph --decompress --shapes qwen3-8b 2>&1 | grep -v "^  sweep" | tail -14 | tee $OUT/attention.log
fi
if [ "${1:-1}" = 2 ]; then  # after reverting the tile store (session 5): codec, row offsets, e2e "auto"
timeout 100 python3 eval/bench_codec.py --quick --heads 32 --out $OUT/codec_h200_s5.json 2>&1 | tail -3 | tee $OUT/codec.log
timeout 120 python3 eval/experiments/decode_rowoff.py --gpu --out $OUT/decode_rowoff_h200_tile.json 2>&1 | tail -14 | tee $OUT/rowoff.log
timeout 300 python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --prefill-reps 1 --steps 10 --prof-steps 2 \
  --budget-s 270 --fused auto --out $OUT/e2e_h200_64k_auto.json 2>&1 | grep -v Warn | tail -4 | tee -a $OUT/e2e.log
fi
if [ "${1:-1}" = 3 ]; then  # the whole grid on a 2-GPU host (kind nvidia-h200-x2): one process per GPU
CUDA_VISIBLE_DEVICES=0 timeout 560 python3 eval/bench_attention.py --out $OUT/attention_h200_qwen3.json --budget-s 480 \
  --timer graph --decompress --shapes qwen3-8b > $OUT/att0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 560 python3 eval/bench_attention.py --out $OUT/attention_h200_small.json --budget-s 480 \
  --timer graph --decompress --shapes smollm2-135m,gemma3 > $OUT/att1.log 2>&1 &
wait
grep -v "^  sweep" $OUT/att0.log | tail -22; grep -v "^  sweep" $OUT/att1.log | tail -22
fi
if [ "${1:-1}" = 4 ]; then  # host time of the decode step: fused="auto" (decode-then-SDPA) vs fused=True vs DynamicCache
timeout 280 python3 eval/profile_step.py --context 16384 --fused auto --out $OUT/profile_step_h200_auto16k.json \
  --steps 20 --timer-steps 10 --prof-steps 4 --torch-prof-steps 3 --kernel-iters 100 --crop-steps 4 2>&1 | grep -v Warn | tail -45
timeout 200 python3 eval/profile_step.py --context 16384 --fused true --skip-baseline --out $OUT/profile_step_h200_fused16k.json \
  --steps 20 --timer-steps 10 --prof-steps 4 --torch-prof-steps 3 --kernel-iters 100 --crop-steps 4 2>&1 | grep -v Warn | tail -25
fi
if [ "${1:-1}" = 5 ]; then  # interleaved host-time A/B (DynamicCache, fused, auto, auto without the sdpa_kernel ctx)
timeout 250 python3 eval/host_ab.py --context 16384 --rounds 3 --out $OUT/host_ab_h200_16k.json 2>&1 | grep -v Warn | tail -16
timeout 250 python3 eval/host_ab.py --context 65536 --rounds 2 --out $OUT/host_ab_h200_64k.json 2>&1 | grep -v Warn | tail -12
fi
if [ "${1:-1}" = 6 ]; then  # the light cuDNN-off context: A/B again at 16K / 64K, B = 1 and 4; GPU test of "auto"
timeout 120 python3 -m pytest -q -x -m gpu tests/test_cache_gpu.py -k "auto" 2>&1 | tail -2
timeout 150 python3 eval/host_ab.py --context 16384 --rounds 3 --out $OUT/host_ab_h200_16k_v2.json 2>&1 | grep -v Warn | tail -4
timeout 150 python3 eval/host_ab.py --context 65536 --rounds 2 --out $OUT/host_ab_h200_64k_v2.json 2>&1 | grep -v Warn | tail -4
timeout 240 python3 eval/host_ab.py --context 65536 --batch 4 --rounds 2 --out $OUT/host_ab_h200_64k_b4.json 2>&1 | grep -v Warn | tail -4
fi
if [ "${1:-1}" = 7 ]; then  # B=4 64K A/B without the cuDNN DynamicCache (5 caches of 64K x 4 did not fit)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 280 python3 eval/host_ab.py --context 65536 --batch 4 --rounds 2 \
  --modes dynamic_sdpa_flash,gaac_fused,gaac_auto --out $OUT/host_ab_h200_64k_b4.json 2>&1 | grep -v Warn | tail -9
fi
if [ "${1:-1}" = 8 ]; then  # row offsets per block (row_offsets: one scan of T row totals) in all three kernels
timeout 110 python3 -m pytest -q -x -m gpu tests/ 2>&1 | tail -2 | tee $OUT/pytest_gpu.txt
timeout 70 python3 eval/bench_codec.py --quick --heads 32 --out $OUT/codec_h200_rowscan.json 2>&1 | tail -3
timeout 130 python3 eval/bench_attention.py --out $OUT/attention_h200_rowscan.json --budget-s 80 --max-cases 4 \
  --timer graph --decompress --shapes qwen3-8b --batches 1 2>&1 | grep -v "^  sweep" | tail -8
fi
