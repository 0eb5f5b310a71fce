#!/bin/bash
# Session 19, call T5 (one H200, <= 560 s): pool layout A/B (block size 64/256, shuffled/ordered), then the full
# v4 attention grid (3 shapes x B 1/4/16 x 4K-128K) -> $OUT/attention_h200.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 100 python3 lab/experiments/v4_layout_ab.py --out $OUT/v4_layout_ab_callT5.json 2>&1 | grep -v Warn | tail -6
echo "layout after $(( $(date +%s) - T0 )) s"
timeout ${2:-420} python3 eval/bench_attention_v4.py --budget-s ${3:-370} --out $OUT/attention_h200.json 2>&1 | grep -v Warn | grep -E "B=|wrote|rror" | tail -50
echo "grid after $(( $(date +%s) - T0 )) s"
