#!/bin/bash
# Session 26, call Y5 (<= 560 s). H200 first: issue 19's memory report, issue 14's codec bench
# (eval/results/codec_v3_h200.json); both cards: the compact-slot kernel's GPU tests (COMPACT_SLOTS, session 26) and a
# launch sweep of the rows below cuDNN (Gemma3 d=256 B=1: W8 x 2 stages fits only with compact slots); H200: the
# whole v4 grid in both layouts. (The prefetch sweep ran in the first try, on an H100, and lost: dropped.) Usage: $0 <commit> <TMAX s>.
# Predictions: lab/cuda-decode-notebook.md, "Call Y5 prediction".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
TMAX=${2:-540}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
R=$(pwd)
[ "$GPU" = h200 ] && {
timeout 110 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
(cd /tmp && timeout 60 python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
echo "codec done after $SECONDS s"
}
timeout 150 python3 -m pytest -q -m gpu tests/test_v4_gpu.py -k "compact or adversarial" -p no:cacheprovider 2>&1 \
  | tail -15 > $OUT/pytest_gpu_y5.txt; tail -3 $OUT/pytest_gpu_y5.txt
echo "tests done after $SECONDS s"
timeout 120 python3 eval/bench_attention_v4.py --sweep-only --sweep-cases gemma3:1:16384 gemma3:1:32768 gemma3:1:65536 \
  --sweep-launches 4:2:1:0 8:2:1:0 4:2:2:0 4:3:1:0 8:2:1:1 --out $OUT/attention_v4_sweep_compact_$GPU.json 2>&1 \
  | grep -E "sweep|rror" | sed 's/ctas_per_sm/c/; s/num_//g' | cut -c1-140
echo "sweep done after $SECONDS s"
[ "$GPU" = h200 ] && [ $SECONDS -lt $(( TMAX - 100 )) ] && {
timeout $(( TMAX - 30 - SECONDS )) python3 eval/bench_attention_v4.py --budget-s $(( TMAX - 60 - SECONDS )) \
  --layouts shuffled in_order --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "B=|wrote|rror|cut" \
  | cut -c1-150 | tail -48
echo "grid done after $SECONDS s"
}
echo "done after $SECONDS s"
