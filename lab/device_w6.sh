#!/bin/bash
# Session 23, call W6 (not run: no device machine came in 13 tries; the merge change lives in
# lab/session23/merge_parts.patch, applied below, until a GPU has checked it)
# Session 23, call W6 (H100, <= 540 s): the split merge spread over `parts` threads per item (attend.cuh finish).
# 1. GPU tests of every kernel that calls finish (twin, v3 fused, v4 fused, graphs): bit identity fused == twin.
# 2. Grid rows (both pool layouts) with the new merge, then the same rows with the merge before (main's attend.cuh
#    swapped back in; the kernel cache keys on every header, so it recompiles).
# Prediction: tests pass; SmolLM2 B=1 16K / 32K 3-5% faster (13.2 -> ~12.6 us, 18.4 -> ~17.7; cuDNN 13.0 / 17.7);
# 3. Gemma3 launch sweep with W4 x 3 stages x 1 CTA added (fits d=256's 8 KB slots: 204 KB; the twin's own launch).
# Gemma3 B=1 16K unchanged (256 items > 128 threads: parts = 1); Qwen3 rows within noise (+-1%).
# Sweep: W4 S3 x1 ~10% faster than W4 S2 at Gemma3 16K (24.3 -> ~22 us; twin 22.6 -> 19.4 from the same change), less at 64K.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cp kernels/cuda/include/gaac/attend.cuh /tmp/attend_before_merge.cuh
patch -p1 < lab/session23/merge_parts.patch || echo "patch failed"
cp kernels/cuda/include/gaac/attend.cuh /tmp/attend_after_merge.cuh
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 150 python3 -m pytest -q -m gpu -x tests/test_cuda_attention.py tests/test_cuda_fused.py tests/test_v4_gpu.py \
  tests/test_cuda_graphs_gpu.py 2>&1 | tail -4
echo "tests done after $(( $(date +%s) - T0 )) s"
ROWS="smollm2-135m:1:16384 smollm2-135m:1:32768 smollm2-135m:1:65536 smollm2-135m:16:32768 gemma3:1:16384 gemma3:1:65536 qwen3-8b:1:16384 qwen3-8b:1:65536 qwen3-8b:4:65536"
timeout 120 python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled in_order --budget-s 95 --out $OUT/attention_rows_${GPU}_merge_parts.json 2>&1 | tail -12
echo "new done after $(( $(date +%s) - T0 )) s"
cp /tmp/attend_before_merge.cuh kernels/cuda/include/gaac/attend.cuh
timeout 120 python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled in_order --budget-s 95 --out $OUT/attention_rows_${GPU}_merge_before.json 2>&1 | tail -12
echo "before done after $(( $(date +%s) - T0 )) s"
cp /tmp/attend_after_merge.cuh kernels/cuda/include/gaac/attend.cuh
timeout 60 python3 eval/bench_attention_v4.py --sweep-only --sweep-cases gemma3:1:16384 gemma3:1:32768 gemma3:1:65536 gemma3:4:16384 gemma3:16:32768 \
  --out $OUT/attention_v4_sweep_gemma3_${GPU}.json 2>&1 | grep -E "sweep gemma3|rror" | sed 's/.num_warps/ W/'
# 4. On an H200 only (issue 19's must-show names it; the device has lent H100s so far): the memory report, if time is left.
if [ "$GPU" = h200 ] && [ $(( $(date +%s) - T0 )) -lt 330 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 eval/memory_report.py --gpu --contexts 32768 65536 \
    --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | grep -E "gaac_vs|wrote" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -3
fi
echo "done after $(( $(date +%s) - T0 )) s"
