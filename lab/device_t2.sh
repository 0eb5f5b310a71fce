#!/bin/bash
# Session 19, call T2 (one H200, <= 540 s): launch sweep of the TABLE_WINDOW kernel (deeper rings, fewer warps)
# on 9 key cases -> $OUT/attention_v4_sweep_callT2.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout ${2:-500} python3 eval/bench_attention_v4.py --sweep-only --out $OUT/attention_v4_sweep_callT2.json 2>&1 \
  | grep -v Warn | grep -E "sweep|wrote|Error|error" | sed -e 's/sweep //' -e "s/'num_warps'/W/; s/'num_stages'/S/; s/'ctas_per_sm'/C/; s/'waves'/x/" | tail -150
echo "done after $(( $(date +%s) - T0 )) s"
