#!/bin/bash
# Session 29, call Y14: steps in priority order, each skipped once $SECONDS passes its start limit. H200: issue 19's
# memory line; the attention grid after build_consts (both layouts; issue 15's file); the v4 GPU tests; issue 14's
# codec file (carry .kvdump); the buffered stamps. Any card first: the lab defines SPEC_TABLE, ISSUE_EARLY and
# ARRIVE_RELEASE each on vs the default (all 0), a bit check per row. H100: then the v4 GPU tests and the stamps.
# Usage: $0 <commit> [seconds this call may run, default 560: steps that would not fit are skipped].
# Prediction: notebook, "Call Y14 prediction".
LIMIT=${2:-560}
left() { echo $((LIMIT - SECONDS)); }
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
[ "$GPU" = h200 ] && {
  timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
    | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
  echo "memory done after $SECONDS s"
}
STAMPS="python3 lab/experiments/v4_stamps.py --launches 3 --cases gemma3:1:16384 gemma3:1:4096 qwen3-8b:1:65536 smollm2-135m:1:16384"
AB_MIN=380; { [ "$GPU" = h100 ] || [ $LIMIT -lt 500 ]; } && AB_MIN=100  # short calls: the A/B before tests and grid
[ $(left) -gt $AB_MIN ] && timeout 120 python3 lab/experiments/v4_define_ab.py --out $OUT/spec_table_$GPU.json --cases gemma3:1:16384 gemma3:1:4096 \
  qwen3-8b:1:131072 qwen3-8b:1:65536 smollm2-135m:1:16384 --variants "" SPEC_TABLE=1 ISSUE_EARLY=1 ARRIVE_RELEASE=1 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
# a lab define that won the A/B (lab/experiments/ab_verdict.py) becomes the default for everything after it in this
# call: flipped in this working copy, recorded in flipped.txt and GAAC_DIRTY=1; committed afterwards (same source)
[ -f $OUT/spec_table_$GPU.json ] && for v in $(python3 lab/experiments/ab_verdict.py $OUT/spec_table_$GPU.json --only SPEC_TABLE=1 ISSUE_EARLY=1 ARRIVE_RELEASE=1 2>/dev/null); do
  n=${v%=*}; sed -i "s/^#define $n 0 /#define $n 1 /" kernels/cuda/decode_attention_v4.cu kernels/cuda/include/gaac/attend.cuh
  grep -h "^#define $n " kernels/cuda/decode_attention_v4.cu kernels/cuda/include/gaac/attend.cuh | tee -a $OUT/flipped.txt
  export GAAC_DIRTY=1
done
if [ "$GPU" = h200 ]; then
  T=$(( $(left) - 130 )); [ $T -gt 140 ] && T=140
  [ $T -gt 20 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider > $OUT/pytest_gpu_v4_h200.txt 2>&1
  tail -2 $OUT/pytest_gpu_v4_h200.txt; echo "tests done after $SECONDS s"
  G=$(( $(left) - 60 )); [ $G -gt 170 ] && G=170
  [ $G -gt 60 ] && timeout $((G + 50)) python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s $G \
    --out $OUT/attention_h200.json > $OUT/grid_h200.log 2>&1; tail -4 $OUT/grid_h200.log
  echo "grid done after $SECONDS s"
  [ $(left) -gt 50 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 50 \
    python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
  [ $(left) -gt 45 ] && timeout 45 $STAMPS --out $OUT/stamps_buffered_h200.json 2>&1 | grep -vE "^\s*$|Warning|warn"
else
  T=$(( $(left) - 50 )); [ $T -gt 150 ] && T=150
  [ $T -gt 20 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider > $OUT/pytest_gpu_v4_h100.txt 2>&1
  tail -2 $OUT/pytest_gpu_v4_h100.txt; echo "tests done after $SECONDS s"
  timeout 60 $STAMPS --out $OUT/stamps_buffered_h100.json 2>&1 | grep -vE "^\s*$|Warning|warn"
fi
echo "all done after $SECONDS s"
