#!/bin/bash
# Session 19, call T6 (one H200): split count vs time for few-stream shapes (gemma3, SmolLM2, Qwen3 B=1 short)
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 300 python3 lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_sweep_callT6.json 2>&1 | grep -v Warn | tail -20
echo "sweep after $(( $(date +%s) - T0 )) s"
