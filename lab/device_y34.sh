#!/bin/bash
# Session 39, while the H200 kind cools down after failed starts: what an H100 can answer (~300 s). Usage: $0 <commit> <s>.
# (1) e2e 64K B=1 --compile-ops fused again, now with kernel_gaps (where the graph's idle time sits; Y32 had no gaps);
# (2) the same with fused-pdl (inductor's programmatic dependent launch) and GAAC_PDL=1 (GAAC's tail append and
# attention launched the same way, tests/test_pdl.py first); (3) the codec windows with 4-segment windows
# at 256 threads (4:4:1:256), which keeps issue 14's instruction budget. Prediction: lab/cuda-decode-notebook.md,
# "Call Y34 prediction".
LIMIT=${2:-330}
source lab/device_env.sh >/dev/null 2>&1
# the graph-gap probe (session 39): us per kernel boundary in a replayed graph, small / big-smem / alternating, +-PDL
timeout 60 python3 lab/experiments/graph_gaps/probe.py --out $OUT/graph_gaps_probe_$GPU.json 2>&1 | grep -E "us/launch|rror"
timeout 90 python3 -m pytest -q -m gpu tests/test_pdl.py tests/test_tail_append.py -p no:cacheprovider > $OUT/pytest_pdl_$GPU.txt 2>&1
tail -2 $OUT/pytest_pdl_$GPU.txt; echo "pdl tests done after $SECONDS s"
[ -f .kvdump/smollm2_kv_v3.pt ] && timeout 40 python3 lab/experiments/codec_v3_sweep.py --head-dims 64,128,256 \
  --out $OUT/codec_v3_sweep_w4_$GPU.json --variants 4:8:2:128 2:4:2:256 4:4:1:256 4:8:1:128 2>&1 | grep -E "^d=|wrote"
echo "codec done after $SECONDS s"
for OPS in fused fused-pdl; do
  [ $OPS = fused-pdl ] && export GAAC_PDL=1
  [ $(left) -gt 110 ] && timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 --steps 6 \
    --prof-steps 2 --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 90 --graphs \
    --compile-ops $OPS --kernel-table --out $OUT/e2e_${OPS}_b1_$GPU.json 2>&1 | grep -v Warn | tail -2
  echo "$OPS done after $SECONDS s"
done
# issue 18 (session 39): the FP8-tile decoder against the FP8 code stream an FP8 attention kernel reads
[ -f .kvdump/smollm2_kv_v3.pt ] && timeout 40 python3 lab/experiments/fp8_decode_rate.py --out $OUT/fp8_decode_rate_$GPU.json 2>&1 | grep -E "codes/s|rror"
