#!/bin/bash
# Session 28, call Y11 (<= ~250 s; H200 ~330 s): H200 only: issue 19's memory line and issue 14's codec file
# (needs carry .kvdump) first. Any card: build_consts with every
# byte load issued first (default) against the old one-latency-per-round loop (CONSTS_SERIAL=1), and Gemma3's
# deeper rings (W4 x 3 full slots, W4 x 4 compact, W8 x 2 compact); bit check against the twin per row; then the
# v4 GPU tests. Usage: $0 <commit>. Prediction: lab/cuda-decode-notebook.md, "Call Y11 prediction".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
[ "$GPU" = h200 ] && {
timeout 100 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
[ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 60 python3 $R/eval/bench_codec_v3.py \
  --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_$GPU.json 2>&1 | grep -E "^d=|wrote|rror")
echo "codec done after $SECONDS s"
}
timeout 150 python3 lab/experiments/v4_define_ab.py --out $OUT/consts_d256_$GPU.json --cases gemma3:1:16384 \
  gemma3:1:65536 gemma3:4:65536 --variants "" CONSTS_SERIAL=1 CONST_REGS=0 MERGE_PREFETCH=1 launch=4:3:1 launch=4:4:1 launch=8:2:1 2>&1 | grep -E "B=|wrote|rror"
timeout 80 python3 lab/experiments/v4_define_ab.py --out $OUT/consts_d128_d64_$GPU.json --cases qwen3-8b:1:16384 \
  qwen3-8b:1:65536 smollm2-135m:1:16384 smollm2-135m:1:32768 --variants "" CONSTS_SERIAL=1 MERGE_PREFETCH=1 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
timeout 90 python3 lab/experiments/v4_stamps.py --out $OUT/stamps_$GPU.json --cases gemma3:1:16384 gemma3:1:65536 \
  qwen3-8b:1:65536 smollm2-135m:1:16384 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "stamps done after $SECONDS s"
for v in "gemma3:1:16384" "gemma3:1:65536"; do  # where the stalls sit now, over all instructions
  tag=$(echo $v | tr ' :=' ___)
  timeout 50 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    -k regex:gaac_v4_decode_split --launch-skip 2 --launch-count 1 -o /tmp/rep_$tag -f python3 lab/experiments/v4_ncu_one.py $v > /tmp/ncu_$tag.log 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page source --csv --print-source sass > /tmp/src_$tag.csv 2>&1
  python3 lab/ncu_src_summary.py /tmp/src_$tag.csv 60 > $OUT/summary_v4_${tag}_${GPU}_callY11.txt 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page details --csv > $OUT/details_v4_${tag}_${GPU}_callY11.csv 2>&1
  gzip -c /tmp/src_$tag.csv > $OUT/src_v4_${tag}_${GPU}_callY11.csv.gz
  echo "== $v"; sed -n 2,4p $OUT/summary_v4_${tag}_${GPU}_callY11.txt | cut -c1-700
  grep -E '"(Duration|DRAM Throughput|Warp Cycles Per Issued Instruction)"' $OUT/details_v4_${tag}_${GPU}_callY11.csv | cut -d, -f12- | head -4
done
echo "ncu done after $SECONDS s"
timeout 200 python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider > $OUT/pytest_gpu_v4_$GPU.txt 2>&1
tail -3 $OUT/pytest_gpu_v4_$GPU.txt
echo "all done after $SECONDS s"
