#!/bin/bash
# Session 17, call R4 (one H200, <= 560 s): F4 (format4.py) and F4i (format4i.py, sign/mantissa words) in two
# processes: decode checks, bit identity with the twin, speed vs cuDNN / FA2 / twin / fused v3, synthetic and real
# SmolLM2 K/V (.kvdump/regtile_real_smollm2.pt, carried) -> $OUT/regtile4_callR4.json, $OUT/regtile4i_callR4.json
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
CASES=${3:-qwen3-8b:1:65536,qwen3-8b:4:65536,qwen3-8b:1:131072,qwen3-8b:16:32768,smollm2-135m:1:65536,smollm2-135m:1:32768,smollm2-real:1:32768,smollm2-real:16:32768}
for f in 4 4i; do
  timeout ${2:-260} python3 lab/experiments/regtile/bench.py --fmt $f --out $OUT/regtile${f}_call${4:-R4}.json --cases $CASES 2>&1 \
    | grep -v Warn | grep -E "decode|\] |failed|Error|error" | tail -20
  echo "bench fmt $f rc ${PIPESTATUS[0]}"
done
# stall reasons of F4 at Qwen3 B=1 64K, W4 S2 3 CTAs and W8 S2 2 CTAs (where does a 3.8 us warp-tile go?)
for cfg in "4 4 2 3" "4 8 2 2"; do
  timeout 70 ncu --clock-control none --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum' \
    -k regex:regtile_decode_split --launch-skip 2 --launch-count 1 python3 lab/experiments/regtile/ncu_one.py $cfg > $OUT/ncu_rt_${cfg// /_}.txt 2>&1
  echo "== ncu $cfg"; grep -E "stalled|inst_executed|warps_active|issue_active|dram|duration" $OUT/ncu_rt_${cfg// /_}.txt | awk '{print $1, $(NF)}' | sort -k2 -g -r | head -14
done
