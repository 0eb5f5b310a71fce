#!/bin/bash
# Session 24, call X1 (H200 or H100, <= 580 s): call W6 of session 23 (never ran: no machine came) reordered so
# issue 19's H200 memory report runs first when the card is an H200, then the merge patch
# (lab/session23/merge_parts.patch): GPU tests of every kernel that calls finish, grid rows with and without it.
# Predictions (notebook, session 23 "W6"): tests pass (fused == twin bit for bit); SmolLM2 B=1 16K / 32K 3-5% faster
# with the patch; Gemma3 rows unchanged; Qwen3 within +-1%. Memory on the H200: below DynamicCache at 32K / 64K
# (H100: 0.937x / 0.932x), same ratios within 1% (the report counts bytes, not time).
# The Gemma3 W4 x 3-stage sweep is left for call X2 (lab/device_x2.sh).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
if [ "$GPU" = h200 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 170 python3 eval/memory_report.py --gpu --contexts 32768 65536 \
    --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -4
  echo "memory done after $(( $(date +%s) - T0 )) s"
fi
cp kernels/cuda/include/gaac/attend.cuh /tmp/attend_before_merge.cuh
patch -p1 < lab/session23/merge_parts.patch || echo "patch failed"
cp kernels/cuda/include/gaac/attend.cuh /tmp/attend_after_merge.cuh
timeout 150 python3 -m pytest -q -m gpu -x tests/test_cuda_attention.py tests/test_cuda_fused.py tests/test_v4_gpu.py \
  tests/test_cuda_graphs_gpu.py 2>&1 | tail -4
echo "tests done after $(( $(date +%s) - T0 )) s"
ROWS="smollm2-135m:1:16384 smollm2-135m:1:32768 smollm2-135m:1:65536 smollm2-135m:16:32768 gemma3:1:16384 gemma3:1:65536 qwen3-8b:1:16384 qwen3-8b:1:65536 qwen3-8b:4:65536"
LEFT=$(( 560 - ($(date +%s) - T0) ))
B=$(( LEFT / 2 - 25 )); [ $B -gt 95 ] && B=95
timeout $(( B + 25 )) python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled in_order --budget-s $B --out $OUT/attention_rows_${GPU}_merge_parts.json 2>&1 | tail -12
echo "new done after $(( $(date +%s) - T0 )) s"
cp /tmp/attend_before_merge.cuh kernels/cuda/include/gaac/attend.cuh
timeout $(( B + 25 )) python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled in_order --budget-s $B --out $OUT/attention_rows_${GPU}_merge_before.json 2>&1 | tail -12
echo "done after $(( $(date +%s) - T0 )) s"
