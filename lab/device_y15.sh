#!/bin/bash
# Session 30, call Y15 (ARRIVE_RELEASE on): per-CTA stamps (which splits are slow; point 7 splits the final merge), the
# A/Bs of MERGE_BATCH, SPEC_TABLE, EARLY_LOADS (v4) and SPEC_ENTRIES (twin); each best winner (lab/experiments/ab_verdict.py) is flipped in this working copy for the
# rest of the call (flipped.txt, GAAC_DIRTY=1), then the GPU tests of both kernels (arrive/merge code is shared with the
# BF16 twin) and both grids. On an H200 issue 19's memory line first, and issue 14's codec file (carry .kvdump).
# Short calls drop steps in this order: stamps (> 330 s left), the v4 A/B (> 350), the twin A/B (> 280). Usage: $0 <commit> [seconds, default 560]. Prediction: notebook, "Call Y15 prediction" and the bullets after it.
LIMIT=${2:-560}
source lab/device_env.sh
[ "$GPU" = h200 ] && {
  timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
    | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
  echo "memory done after $SECONDS s"
}
[ "$GPU" = h200 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 40 \
  python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
echo "codec done after $SECONDS s"
[ $(left) -gt 350 ] && timeout 150 python3 lab/experiments/v4_define_ab.py --out $OUT/merge_batch_$GPU.json --cases gemma3:1:4096 gemma3:1:16384 \
  qwen3-8b:1:16384 qwen3-8b:1:65536 smollm2-135m:1:16384 --variants "" MERGE_BATCH=1 SPEC_TABLE=1 "MERGE_BATCH=1,SPEC_TABLE=1" \
  "EARLY_LOADS=1,SPEC_TABLE=1" "EARLY_LOADS=1,MERGE_BATCH=1,SPEC_TABLE=1" 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
[ $(left) -gt 280 ] && timeout 60 python3 lab/experiments/twin_define_ab.py --out $OUT/twin_ab_$GPU.json --cases qwen3-8b:1:65536 qwen3-8b:1:16384 \
  smollm2-135m:1:16384 --variants "" SPEC_ENTRIES=1 2>&1 | grep -E "B=|wrote|rror"
echo "twin ab done after $SECONDS s"
# each A/B's one winning variant (ab_verdict.py --best): its defines flipped in the kernel sources
for f in $OUT/merge_batch_$GPU.json $OUT/twin_ab_$GPU.json; do
  [ -f $f ] && for v in $(python3 lab/experiments/ab_verdict.py $f --best 2>/dev/null); do
    for nv in ${v//,/ }; do
      n=${nv%=*}; K="kernels/cuda/decode_attention_v4.cu kernels/cuda/decode_attention.cu kernels/cuda/include/gaac/attend.cuh"
      sed -i "s/^#define $n 0 /#define $n 1 /" $K; grep -h "^#define $n " $K | tee -a $OUT/flipped.txt
    done
    export GAAC_DIRTY=1
  done
done
[ $(left) -gt 330 ] && timeout 60 python3 lab/experiments/v4_stamps.py --per-cta --launches 3 --cases gemma3:1:4096 gemma3:1:16384 \
  smollm2-135m:1:16384 --out $OUT/stamps_per_cta_$GPU.json 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "stamps done after $SECONDS s"
T=$(( $(left) - 150 )); [ $T -gt 130 ] && T=130
[ $T -gt 30 ] && timeout $T python3 -m pytest -q -m gpu tests/test_v4_gpu.py tests/test_cuda_attention.py -p no:cacheprovider \
  > $OUT/pytest_gpu_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
[ $(left) -gt 100 ] && timeout 80 python3 eval/bench_attention_v4.py --layouts shuffled in_order --budget-s 60 \
  --out $OUT/attention_$GPU.json > $OUT/grid_$GPU.log 2>&1; tail -2 $OUT/grid_$GPU.log; echo "grid done after $SECONDS s"
[ $(left) -gt 60 ] && timeout 55 python3 eval/bench_attention_bf16.py --budget-s 45 --out $OUT/attention_bf16_$GPU.json \
  > $OUT/bf16_$GPU.log 2>&1; tail -2 $OUT/bf16_$GPU.log; echo "twin grid done after $SECONDS s"
echo "all done after $SECONDS s"
