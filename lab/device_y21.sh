#!/bin/bash
# Session 34, call Y21 (issue 13): Y20's per-SASS counters showed each of the twin's 16-byte copies (LDGSTS, 512 B per
# warp instruction) asking L2 for 24 sectors where 16 hold its bytes (FA2's: 16), with shared-memory wavefronts in
# excess. Is it the +16 B row padding of the staged tiles? ROW_PAD=0 (attend.cuh lab define): its per-SASS sectors and
# a timed A/B. Then the merge A/B of MERGE_BATCH=2 again over more short calls (Y20: -9% / -10% / -5% on Gemma3 B=1 4K
# / 16K and Qwen3 B=1 16K, +1.4% on SmolLM2 B=1 4K). Usage: $0 <commit> [seconds, default 200]. Prediction: notebook.
LIMIT=${2:-200}  # 330 on an H200
source lab/device_env.sh
# an H200 (none this session so far): issue 19's memory line and issue 14's codec file first (carry .kvdump)
h200_memory_codec
for v in ROW_PAD=0 SWIZZLE=1; do
  [ $(left) -lt 120 ] && break
  timeout 60 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SourceCounters -o /tmp/src_$v -f \
    python3 lab/experiments/twin_ncu_one.py qwen3-8b:4:65536 twin $v > /tmp/ncu_src.log 2>&1
  ncu -i /tmp/src_$v.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
  python3 lab/ncu_sectors_per_sass.py /tmp/src.csv > $OUT/sectors_sass_twin_${v//=/_}.txt 2>&1
  echo "== $v"; tail -1 $OUT/sectors_sass_twin_${v//=/_}.txt | cut -c1-700; tail -2 /tmp/ncu_src.log | cut -c1-300
done
echo "ncu done after $SECONDS s"
[ $(left) -gt 100 ] && timeout 80 python3 lab/experiments/twin_define_ab.py --out $OUT/twin_rowpad_$GPU.json \
  --cases qwen3-8b:4:65536 qwen3-8b:16:32768 qwen3-8b:1:65536 --variants "" ROW_PAD=0 SWIZZLE=1 MERGE_BATCH=2 "SWIZZLE=1,MERGE_BATCH=2" 2>&1 | grep -E "B=|wrote|rror"
echo "twin ab done after $SECONDS s"
[ $(left) -gt 40 ] && timeout $(( $(left) - 5 )) python3 lab/experiments/v4_define_ab.py --out $OUT/merge2_ab_$GPU.json \
  --cases gemma3:1:4096 gemma3:1:16384 gemma3:4:4096 qwen3-8b:1:4096 qwen3-8b:1:16384 smollm2-135m:1:4096 \
  smollm2-135m:4:4096 smollm2-135m:1:16384 smollm2-135m:1:32768 --variants "" MERGE_BATCH=2 2>&1 | grep -E "B=|wrote|rror"
echo "all done after $SECONDS s"
