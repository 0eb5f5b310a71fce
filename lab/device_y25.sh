#!/bin/bash
# Next session (written in session 35), for an H200: (1) issue 14: the v3 decoder reached 84% of its read+write bound
# on the H200 (89% on an H100; codec_v3_h200.json): at 1.4x the copy rate with the same per-item latency it needs more
# bytes in flight, so sweep the resident CTAs (the register cap) and the window per warp item at d = 128;
# (2) issue 13: the twin's copies in FA2's 4-rows-by-128-B pattern; (4) issue 15: call Y23's end-to-end step with the model's ops compiled (never run: Y24 had no time left).
# Usage: $0 <commit> <seconds> (carry .kvdump). Prediction: notebook ("Call Y25 prediction").
LIMIT=$2
source lab/device_env.sh
[ -f .kvdump/smollm2_kv_v3.pt ] && timeout 120 python3 lab/experiments/codec_v3_sweep.py --head-dims 128 \
  --out $OUT/codec_v3_sweep_$GPU.json --variants 4:8:2:128 4:10:2:128 4:12:2:128 4:16:2:128 2:8:2:128 2:12:2:128 \
  2:4:1:256 2>&1 | grep -vi warn | tail -12
echo "sweep done after $SECONDS s"
# (3) issue 13: COPY_QUADS=1 (twin lab define: 4 rows x 128 B per copy instruction, FA2's pattern), alone and with
# SWIZZLE=1 (then every 128-byte group lands on one aligned shared-memory line, as in FA2): sectors, then the A/B
for v in COPY_QUADS=1 COPY_QUADS=1,SWIZZLE=1; do
  timeout 60 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SourceCounters -o /tmp/src_q -f \
    python3 lab/experiments/twin_ncu_one.py qwen3-8b:4:65536 twin $v > /tmp/ncu_src.log 2>&1
  ncu -i /tmp/src_q.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
  python3 lab/ncu_sectors_per_sass.py /tmp/src.csv > $OUT/sectors_sass_twin_${v//[=,]/_}.txt 2>&1
  echo "== $v"; tail -1 $OUT/sectors_sass_twin_${v//[=,]/_}.txt | cut -c1-700
done
timeout 70 python3 lab/experiments/twin_define_ab.py --out $OUT/twin_quads_$GPU.json \
  --cases qwen3-8b:4:65536 qwen3-8b:16:32768 qwen3-8b:1:65536 --variants "" COPY_QUADS=1 "COPY_QUADS=1,SWIZZLE=1" \
  2>&1 | grep -E "B=|wrote|rror"
echo "quads done after $SECONDS s"
# (3b) issue 15's one attention target left, Qwen3 128K B=1 shuffled (1.175x, in order 1.216x): a third stage per warp
# (more compressed bytes in flight per SM on the H200's longer memory pipe); bit-checked against the twin
timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_stages_$GPU.json \
  --cases qwen3-8b:1:131072 qwen3-8b:1:65536 qwen3-8b:4:65536 --variants "" launch=8:3:1 2>&1 | grep -E "B=|wrote|rror"
[ $(left) -gt 170 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 \
  --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 150 )) \
  --graphs --compile-ops --out $OUT/e2e_compiled_$GPU.json 2>&1 | grep -v Warn | tail -4
echo "all done after $SECONDS s"
