#!/bin/bash
# Session 24, call X2 (H200 or H100, <= 580 s), on branch merge-tree: the split merge spread over `parts` threads
# per item (session 23's patch) plus a two-level merge (attend.cuh finish: chunks of 16 splits merged by their own
# last CTAs, then the chunks) where one CTA would read > 128 KiB of partials (Gemma3 B=1: 512 KiB).
# 1. H200 only: issue 19's memory report. 2. GPU tests of every kernel that calls finish (bit identity, fp64).
# 3. Rows (shuffled pools, one process each): default (tree where planned, parts), --merge-chunk 0 (one level,
#    parts), then main's attend.cuh (one level, one thread per item) with --merge-chunk 0.
# Predictions in lab/cuda-decode-notebook.md, session 24.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0
TMAX=${2:-570}  # seconds this call may take in all (the session's device time left)
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
if [ "$GPU" = h200 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(( TMAX / 4 > 170 ? 170 : TMAX / 4 )) python3 eval/memory_report.py --gpu --contexts 32768 65536 \
    --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -4
  echo "memory done after $(( $(date +%s) - T0 )) s"
fi
timeout $(( TMAX / 2 > 210 ? 210 : TMAX / 2 )) python3 -m pytest -q -m gpu -x tests/test_v4_gpu.py tests/test_cuda_attention.py tests/test_cuda_fused.py \
  tests/test_cuda_graphs_gpu.py 2>&1 | tail -4
echo "tests done after $(( $(date +%s) - T0 )) s"
ROWS="smollm2-135m:1:16384 smollm2-135m:1:32768 gemma3:1:16384 gemma3:1:65536 gemma3:4:16384 qwen3-8b:1:65536 qwen3-8b:4:65536"
LEFT=$(( TMAX - ($(date +%s) - T0) ))
NV=$(( $(echo ${VARIANTS:-tree flat} | wc -w) + 1 )); B=$(( LEFT / NV - 20 )); [ $B -gt 80 ] && B=80
for V in ${VARIANTS:-tree flat}; do
  MC=""; [ $V = flat ] && MC="--merge-chunk 0"
  timeout $(( B + 20 )) python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled --budget-s $B $MC \
    --out $OUT/attention_rows_${GPU}_merge_${V}.json 2>&1 | grep -E "B=|rror|wrote" | cut -c1-150
  echo "$V done after $(( $(date +%s) - T0 )) s"
done
cp kernels/cuda/include/gaac/attend.cuh /tmp/attend_branch.cuh
patch -R -p1 < lab/session24/attend_merge.patch || echo "reverse patch failed"
timeout $(( B + 20 )) python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled --budget-s $B --merge-chunk 0 \
  --out $OUT/attention_rows_${GPU}_merge_main.json 2>&1 | grep -E "B=|rror|wrote" | cut -c1-150
cp /tmp/attend_branch.cuh kernels/cuda/include/gaac/attend.cuh
echo "done after $(( $(date +%s) - T0 )) s"
