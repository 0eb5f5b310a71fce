#!/bin/bash
# Session 22, call W3 (<= 150 s): call W2's codec sweep and eval/bench_codec_v3.py again with the timer fixed (a device
# sleep covers the host's launch, eval/bench_codec_v3.py `timed`). $1: the commit measured, as a literal.
# Prediction: every variant 2-8% faster than in W2 (the bench more, through decode_pool_cuda's Python); the default
# (W4, 128 threads, bulk store) ~91-94% of the bound; W2 x 256 ~95%; copy rate unchanged.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1"
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
R=$(pwd); (cd /tmp && timeout 90 python3 $R/lab/experiments/codec_v3_sweep.py --kv "$R/.kvdump/smollm2_kv_v3.pt" \
  --out $OUT/codec_v3_sweep3_${GPU}.json 2>&1 | grep -E "^d=|rror" | sed 's/; regs.*//')
timeout 80 python3 eval/bench_codec_v3.py --kv .kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_${GPU}.json 2>&1 | grep -E "^d=|wrote|rror"
echo "done after $(( $(date +%s) - T0 )) s"
