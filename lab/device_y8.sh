#!/bin/bash
# Session 27, call Y8 (<= ~230 s; 409 s of device time left after failed starts): call Y7 trimmed. H200: issue 19's
# memory report first. Any card: ncu of Gemma3 B=1 64K, default W4 x 2 stages and compact W8 x 2 stages (per-SASS
# stall samples + SpeedOfLight). Usage: $0 <commit>. Prediction: lab/cuda-decode-notebook.md, "Call Y7 prediction".
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
[ "$GPU" = h200 ] && {
timeout 100 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
}
for v in "gemma3:1:65536" "gemma3:1:65536 launch=8:2:1"; do
  tag=$(echo $v | tr ' :=' ___)
  timeout 50 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    -k regex:gaac_v4_decode_split --launch-skip 2 --launch-count 1 -o /tmp/rep_$tag -f python3 lab/experiments/v4_ncu_one.py $v > /tmp/ncu_$tag.log 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page source --csv --print-source sass > /tmp/src_$tag.csv 2>&1
  python3 lab/ncu_src_summary.py /tmp/src_$tag.csv 40 > $OUT/summary_v4_${tag}_${GPU}_callY8.txt 2>&1
  ncu -i /tmp/rep_$tag.ncu-rep --page details --csv > $OUT/details_v4_${tag}_${GPU}_callY8.csv 2>&1
  echo "== $v"; sed -n 2,3p $OUT/summary_v4_${tag}_${GPU}_callY8.txt | cut -c1-600; tail -2 /tmp/ncu_$tag.log
  grep -E '"(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued Instruction)"' $OUT/details_v4_${tag}_${GPU}_callY8.csv | cut -d, -f12- | head -8
  echo "after $SECONDS s"
done
echo "done after $SECONDS s"
