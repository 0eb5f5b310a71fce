#!/bin/bash
# Session 24, call X4 (last of the session's device time, <= $2 s): the merge at d377e6f (one thread per item,
# 16 loads in flight, two levels where planned). H200: issue 19's memory report first. Then the v4 GPU tests
# (bit identity incl. forced chunks, fp64), then rows with the branch's attend.cuh and with main's (reverse patch).
# Prediction (notebook, X2 outcome): SmolLM2 = main; Gemma3 B=1 16K ~20-21 us on the H100 (main 24.4), 64K ~37
# (main 41.2); B=4 16K and Qwen3 = main.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0
TMAX=${2:-200}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
if [ "$GPU" = h200 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python3 eval/memory_report.py --gpu --contexts 32768 65536 \
    --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -4
  echo "memory done after $(( $(date +%s) - T0 )) s"
fi
ROWS="smollm2-135m:1:16384 gemma3:1:16384 gemma3:1:65536 gemma3:4:16384 qwen3-8b:1:65536"
timeout $(( TMAX - 70 - ($(date +%s) - T0) )) python3 -m pytest -q -m gpu -x tests/test_v4_gpu.py -k "bit_identical or adversarial" 2>&1 | tail -3
echo "tests done after $(( $(date +%s) - T0 )) s"
for V in tree main; do
  [ $V = main ] && patch -R -p1 < lab/session24/attend_merge.patch >/dev/null
  D=1; [ $V = tree ] && D=2
  L=$(( (TMAX - ($(date +%s) - T0)) / D - 5 ))
  [ $L -gt 10 ] && timeout $L python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled --budget-s $(( L - 10 )) \
    $([ $V = main ] && echo --merge-chunk 0) --out $OUT/attention_rows_${GPU}_x4_${V}.json 2>&1 | grep -E "B=|rror" | cut -c1-120
done
echo "done after $(( $(date +%s) - T0 )) s"
