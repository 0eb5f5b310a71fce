#!/bin/bash
# Session 25, call Y4 (<= 420 s). Both cards: issue 14's decoder with the L2 prefetch knob (DECODE_PREFETCH = items
# ahead; lab/experiments/codec_v3_sweep.py, real SmolLM2 K/V carried in .kvdump). H200 also: issue 19's memory
# report, the codec bench (eval/results/codec_v3_h200.json, issue 14's file) and the whole v4 grid in both layouts.
# Predictions: notebook, "Call Y4 prediction".
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
(cd /tmp && timeout ${SWEEP_S:-120} python3 $R/lab/experiments/codec_v3_sweep.py --kv "$R/.kvdump/smollm2_kv_v3.pt" \
  --variants 4:8:2:128:0 4:8:2:128:1 4:8:2:128:2 4:8:2:128:3 2:4:2:256:0 2:4:2:256:2 \
  --out $OUT/codec_v3_prefetch_${GPU}.json 2>&1 | grep -E "^d=|rror" | sed 's/; regs.*//')
echo "sweep done after $SECONDS s"
[ "$GPU" = h100 ] && exit 0
[ $SECONDS -gt $(( ${2:-410} - 70 )) ] && { echo "no time left for the codec bench and grid"; exit 0; }
(cd /tmp && timeout 60 python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
timeout $(( ${2:-410} - SECONDS )) python3 eval/bench_attention_v4.py --budget-s $(( ${2:-410} - 40 - SECONDS )) --layouts shuffled in_order \
  --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "B=|wrote|rror|cut" | cut -c1-150 | tail -48
echo "done after $SECONDS s"
