#!/bin/bash
# Session 34, call Y19 (issues 13, 14, 19; replaces Y18 and Y15's A/B half, since starting a card costs ~90 s a try):
# on an H200 first issue 19's memory line and issue 14's codec file (carry .kvdump); then the L2 hint's sector counts
# (ncu, L2_HINT=0 / 128 at Qwen3 B=16 32K), the twin A/B of L2_HINT (128 / 256) and the v4 A/B of L2_HINT=128 with the
# untimed v4 defines. Tests and grids run in the next call (lab/device_y19b.sh) with the winners flipped there.
# Usage: $0 <commit> [seconds, default 480]. Prediction: notebook, "Call Y18 prediction" and "Call Y19 prediction".
LIMIT=${2:-480}
source lab/device_env.sh
h200_memory_codec
M=l1tex__m_xbar2l1tex_read_sectors.sum,lts__t_sectors_op_read_lookup_hit.sum,dram__sectors_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
for v in L2_HINT=0 L2_HINT=128; do
  [ $(left) -lt 330 ] && break
  timeout 40 ncu --clock-control none --nvtx --nvtx-include "prof/" --metrics $M \
    python3 lab/experiments/twin_ncu_one.py qwen3-8b:16:32768 twin $v > $OUT/ncu_y19_$v.txt 2>&1
  echo "== $v"; grep -E "dram__|l1tex__|lts__|gpu__" $OUT/ncu_y19_$v.txt | awk '{$1=$1};1'
done
echo "ncu done after $SECONDS s"
[ $(left) -gt 250 ] && timeout 80 python3 lab/experiments/twin_define_ab.py --out $OUT/twin_l2hint_$GPU.json \
  --cases qwen3-8b:16:32768 qwen3-8b:4:65536 qwen3-8b:1:65536 smollm2-135m:1:16384 \
  --variants "" L2_HINT=128 L2_HINT=256 2>&1 | grep -E "B=|wrote|rror"
echo "twin ab done after $SECONDS s"
[ $(left) -gt 150 ] && timeout $(( $(left) - 10 )) python3 lab/experiments/v4_define_ab.py --out $OUT/v4_ab_$GPU.json \
  --cases qwen3-8b:1:65536 qwen3-8b:4:65536 qwen3-8b:1:16384 gemma3:1:16384 smollm2-135m:1:16384 \
  --variants "" L2_HINT=128 MERGE_BATCH=1 SPEC_TABLE=1 "EARLY_LOADS=1,SPEC_TABLE=1" 2>&1 | grep -E "B=|wrote|rror"
echo "v4 ab done after $SECONDS s"
for f in $OUT/twin_l2hint_$GPU.json $OUT/v4_ab_$GPU.json; do
  [ -f $f ] && echo "$(basename $f): best=$(python3 lab/experiments/ab_verdict.py $f --best | tr '\n' ' ')" \
    "not-slower(L2_HINT=128)=$(python3 lab/experiments/ab_verdict.py $f --only L2_HINT=128 --margin -0.01)"
done
echo "all done after $SECONDS s"
