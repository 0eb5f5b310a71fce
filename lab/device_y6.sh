#!/bin/bash
# Session 27, call Y6 (<= ~420 s): call Y5 trimmed to a device budget cut by failed starts. Priority order: issue 19's
# H200 memory report; the compact-slot kernel's GPU tests; a short Gemma3 B=1 launch sweep (16K, 64K; default
# W4x2x1 vs compact W8x2x1 and W4x2x2); issue 14's codec bench. The grid is not rerun: default launches build the
# same cubins as the b532f47 file (compact slots only where full slots do not fit). Usage: $0 <commit>.
# Predictions: lab/cuda-decode-notebook.md, "Call Y5 prediction".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
R=$(pwd)
[ "$GPU" = h200 ] && {
timeout 110 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
}
timeout 120 python3 -m pytest -q -m gpu tests/test_v4_gpu.py -k "compact or adversarial" -p no:cacheprovider 2>&1 \
  | tail -15 > $OUT/pytest_gpu_y6.txt; tail -3 $OUT/pytest_gpu_y6.txt
echo "tests done after $SECONDS s"
timeout 90 python3 eval/bench_attention_v4.py --sweep-only --sweep-cases gemma3:1:16384 gemma3:1:65536 \
  --sweep-launches 4:2:1:0 8:2:1:0 4:2:2:0 --out $OUT/attention_v4_sweep_compact_$GPU.json 2>&1 \
  | grep -E "sweep|rror" | sed 's/ctas_per_sm/c/; s/num_//g' | cut -c1-140
echo "sweep done after $SECONDS s"
(cd /tmp && timeout 50 python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_$GPU.json 2>&1 | grep -E "^d=|wrote|rror")
echo "done after $SECONDS s"
