#!/bin/bash
# Session 33, call Y18 (issue 13): Y17's Nsight Compute found the twin asking L2 for 1.5x the sectors FA2 does at
# Qwen3 B=16 32K (l1tex__m_xbar2l1tex_read_sectors 100.7M vs 67.1M, same LDGSTS count and DRAM bytes, L2 hit rate
# 34% vs 0.7%), and FA2's copies carry the L2::128B hint. This call: the same sector metrics with the lab define
# L2_HINT=128 / 256, then a timing A/B with a bit check. Usage: $0 <commit> [seconds]. Prediction: notebook, "Call Y18".
LIMIT=${2:-200}
source lab/device_env.sh
M=l1tex__m_xbar2l1tex_read_sectors.sum,lts__t_sectors_op_read_lookup_hit.sum,dram__sectors_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
for v in L2_HINT=0 L2_HINT=128 L2_HINT=256; do
  [ $(left) -lt 60 ] && break
  timeout 40 ncu --clock-control none --nvtx --nvtx-include "prof/" --metrics $M \
    python3 lab/experiments/twin_ncu_one.py qwen3-8b:16:32768 twin $v > $OUT/ncu_y18_$v.txt 2>&1
  echo "== $v"; grep -E "dram__|l1tex__|lts__|gpu__" $OUT/ncu_y18_$v.txt | awk '{$1=$1};1'
done
[ $(left) -gt 40 ] && timeout $(( $(left) - 10 )) python3 lab/experiments/twin_define_ab.py --out $OUT/twin_l2hint_$GPU.json \
  --cases qwen3-8b:16:32768 qwen3-8b:4:65536 qwen3-8b:1:65536 --variants "" L2_HINT=128 L2_HINT=256 2>&1 | grep -E "B=|wrote|rror"
echo "all done after $SECONDS s"
