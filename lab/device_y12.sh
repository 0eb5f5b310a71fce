#!/bin/bash
# Session 28, call Y12 = call Y11 trimmed to the device time left (~600 s with the start): steps in priority order,
# each skipped once $SECONDS passes its start limit. H200 only: issue 19's memory line, issue 14's codec file
# (carry .kvdump). Any card: build_consts A/B + MERGE_PREFETCH with a bit check per row; GPU tests of the v4
# kernel; stamps (gaac vs twin); Gemma3's rings and CONST_REGS=0. Usage: $0 <commit>. Predictions: notebook, "Call Y11" (its script never started and left).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
AB="python3 lab/experiments/v4_define_ab.py"
[ "$GPU" = h200 ] && {
timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
  | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
echo "memory done after $SECONDS s"
}
timeout 70 $AB --out $OUT/consts_$GPU.json --cases gemma3:1:16384 gemma3:1:65536 qwen3-8b:1:65536 \
  smollm2-135m:1:16384 --variants "" CONSTS_SERIAL=1 MERGE_PREFETCH=1 2>&1 | grep -E "B=|wrote|rror"
echo "ab done after $SECONDS s"
[ $SECONDS -lt 150 ] && { timeout 100 python3 -m pytest -q -m gpu tests/test_v4_gpu.py -p no:cacheprovider -x \
  > $OUT/pytest_gpu_v4_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_v4_$GPU.txt; echo "tests done after $SECONDS s"; }
[ $SECONDS -lt 230 ] && { timeout 40 python3 lab/experiments/v4_stamps.py --out $OUT/stamps_$GPU.json --launches 3 \
  --cases gemma3:1:16384 qwen3-8b:1:65536 2>&1 | grep -vE "^\s*$|Warning|warn"; echo "stamps done after $SECONDS s"; }
[ $SECONDS -lt 260 ] && { timeout 40 $AB --out $OUT/rings_d256_$GPU.json --cases gemma3:1:16384 gemma3:1:65536 \
  --variants "" CONST_REGS=0 launch=4:3:1 launch=4:4:1 2>&1 | grep -E "B=|wrote|rror"; echo "rings done after $SECONDS s"; }
[ "$GPU" = h200 ] && [ $SECONDS -lt 280 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 50 \
  python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_$GPU.json 2>&1 | grep -E "^d=|wrote|rror")
echo "all done after $SECONDS s"
