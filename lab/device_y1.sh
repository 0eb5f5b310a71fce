#!/bin/bash
# Session 25, call Y1 (<= 585 s): the landed two-level merge (main loop in both levels) has never run on a GPU.
# 1) H200 only: issue 19's memory report (GPU, 32K/64K, 12 layers) -> $OUT/memory_h200.json
# 2) the whole GPU suite (-m gpu tests/), log -> $OUT/pytest_gpu_y1.txt
# 3) with what is left: rows of the landed merge vs the session-24 starting merge (reverse patch, one level)
# Prediction (notebook, session 25): memory ~0.93x DynamicCache on the H200 (as H100); every GPU test passes but
# test_fp8_gpu's two real-SmolLM2 errors (wheel absent on the image); Gemma3 B=1 16K ~20-21 us H100 / ~20-22 H200
# (old merge ~24.4 / 24.6), SmolLM2 unchanged, every row bit-identical.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0
TMAX=${2:-585}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
if [ "$GPU" = h200 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 python3 eval/memory_report.py --gpu --contexts 32768 65536 \
    --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -4
  echo "memory done after $(( $(date +%s) - T0 )) s"
fi
L=$(( TMAX - 150 - ($(date +%s) - T0) ))
timeout $L python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=8 > $OUT/pytest_gpu_y1.txt 2>&1
echo "pytest rc $? after $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/pytest_gpu_y1.txt | tail -8
ROWS="smollm2-135m:1:16384 gemma3:1:16384 gemma3:1:65536"
for V in tree main; do
  [ $V = main ] && patch -R -p1 < lab/session24/attend_merge.patch >/dev/null
  D=1; [ $V = tree ] && D=2
  L=$(( (TMAX - ($(date +%s) - T0)) / D - 5 ))
  [ $L -gt 25 ] && timeout $L python3 eval/bench_attention_v4.py --grid-cases $ROWS --layouts shuffled --budget-s $(( L - 12 )) \
    $([ $V = main ] && echo --merge-chunk 0) --out $OUT/attention_rows_${GPU}_y1_${V}.json 2>&1 | grep -E "B=|rror" | cut -c1-120
done
[ -f lab/session24/attend_merge.patch ] && patch -p1 < lab/session24/attend_merge.patch >/dev/null
echo "done after $(( $(date +%s) - T0 )) s"
