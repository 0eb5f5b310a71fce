#!/bin/bash
# Next session, first call (one H200, <= 560 s): the v4 grid with both pool layouts in one process (shuffled: the
# README's `gaac`; in order: what a GAACCache prefill writes), then e2e B=4 at 128K. $1: the commit measured, as a
# literal (the device copy's git directory is the session's starting commit, not HEAD).
# Prediction (lab notebook, session 19): in order 4-6% faster than shuffled at 128K B=1 and at B >= 4 64K+, flat at
# 64K B=1 and below; bit-identical to the twin in both layouts.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 200 python3 eval/bench_attention_v4.py --budget-s 180 --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "B=|wrote|rror" | tail -48
echo "grid after $(( $(date +%s) - T0 )) s"
timeout $(( 560 - ($(date +%s) - T0) )) python3 eval/bench_e2e.py --contexts 131072 --batches 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 300 --graphs --out $OUT/e2e_h200_v4_128k_b4.json 2>&1 | grep -v Warn | tail -4
echo "done after $(( $(date +%s) - T0 )) s"
