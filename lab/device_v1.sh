#!/bin/bash
# Session 20, call V1 (one H200, <= 590 s): 18 rows of the v4 grid (Qwen3 from 16K, the rows below cuDNN or the
# BF16 skeleton below FA2 in attention_h200.json) with both pool layouts in one process (shuffled: the
# README's `gaac`; in order: what a GAACCache prefill writes), then the launch sweep of the rows still below cuDNN
# from 16K (Gemma3 d=256 B=1 16K, SmolLM2 B=1 16K / 32K). The in-order rows also time the BF16 skeleton at its own
# launch (`cuda_bf16_in_order`, issue 13: FA2 and cuDNN read contiguous K/V, the skeleton paged). $1: the commit measured, as a literal (the device copy's
# git directory is the session's starting commit, not HEAD).
# Prediction (lab notebook, session 20): in order 4-6% faster than shuffled at 128K B=1 and at B >= 4 64K+, flat at
# 64K B=1 and below; bit-identical to the twin in both layouts. Sweep: Gemma3 16K W2 x 3 CTAs 10-15% faster than
# the planner's W4 x 1; SmolLM2 16K / 32K within 3% of the planner's pick (few streams: latency-bound either way).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
G=""; for b in 1 4 16; do for c in 16384 32768 65536 131072; do G="$G qwen3-8b:$b:$c"; done; done
G="$G smollm2-135m:1:16384 smollm2-135m:1:32768 gemma3:1:16384 gemma3:16:32768 gemma3:16:65536 gemma3:16:131072"
timeout 400 python3 eval/bench_attention_v4.py --budget-s 340 --grid-cases $G --out $OUT/attention_${GPU}_layouts.json 2>&1 | grep -v Warn | grep -E "B=|wrote|rror|cut" | tail -50
echo "grid after $(( $(date +%s) - T0 )) s"
# issue 19: the H200 memory report with CUDA pools grown by copies (0) and in reservations (1), same commit, same
# process layout (call V2 ran only the reserved one, on an H100: its 0.93x differed from memory_h200.json's 0.907x
# because that file is format v3's; this is the A/B). Prediction: reserved peak <= copied peak, by up to a pool's
# last growth (a few % of the KV bytes).
for R in 0 1; do GAAC_RESERVE_CUDA=$R timeout 90 python3 eval/memory_report.py --gpu --gpu-layers 12 \
  --out $OUT/memory_${GPU}_reserve$R.json 2>&1 | grep -E "gaac_vs|wrote" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -2; done
echo "memory after $(( $(date +%s) - T0 )) s"
timeout $(( 585 - ($(date +%s) - T0) )) python3 eval/bench_attention_v4.py --sweep-only --sweep-cases gemma3:1:16384 smollm2-135m:1:16384 \
  smollm2-135m:1:32768 gemma3:1:32768 --out $OUT/attention_v4_sweep_low_${GPU}.json 2>&1 | grep -v Warn | grep -E "sweep|rror" | tail -80
echo "done after $(( $(date +%s) - T0 )) s"
