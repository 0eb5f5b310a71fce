#!/bin/bash
# Session 30, call Y15 (ARRIVE_RELEASE on, 3217743): which splits are slow in Gemma3's short calls (per-CTA stamps with
# each split's BF16-stored blocks); on an H200 first issue 19's memory line, then the attention grid (issue 15's file),
# the v4 GPU tests and issue 14's codec file (carry .kvdump). Usage: $0 <commit> [seconds, default 560].
# Prediction: notebook, "Call Y15 prediction".
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
timeout 100 python3 lab/experiments/v4_stamps.py --per-cta --launches 3 --cases gemma3:1:4096 gemma3:1:16384 \
  smollm2-135m:1:16384 qwen3-8b:1:65536 --out $OUT/stamps_per_cta_$GPU.json 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "stamps done after $SECONDS s"
timeout 120 python3 lab/experiments/v4_define_ab.py --out $OUT/merge_batch_$GPU.json --cases gemma3:1:4096 gemma3:1:16384 \
  gemma3:1:65536 gemma3:4:16384 qwen3-8b:1:65536 smollm2-135m:1:16384 --variants "" MERGE_BATCH=1 SPEC_TABLE=1 \
  "MERGE_BATCH=1,SPEC_TABLE=1" 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
if [ "$GPU" = h200 ]; then
  G=$(( $(left) - 200 )); [ $G -gt 170 ] && G=170
  [ $G -gt 60 ] && timeout $((G + 50)) python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s $G \
    --out $OUT/attention_h200.json > $OUT/grid_h200.log 2>&1; tail -4 $OUT/grid_h200.log
  echo "grid done after $SECONDS s"
  [ $(left) -gt 50 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 50 \
    python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
  T=$(( $(left) - 10 )); [ $T -gt 140 ] && T=140
  [ $T -gt 20 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider > $OUT/pytest_gpu_v4_h200.txt 2>&1
  tail -2 $OUT/pytest_gpu_v4_h200.txt
fi
echo "all done after $SECONDS s"
