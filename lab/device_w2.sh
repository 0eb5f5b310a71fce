#!/bin/bash
# Session 22, call W2 (one H200 or H100, <= 560 s): issue 19's last point. CUDA pools now live in reservations by
# default (gaac_hf/cache/reserve.py; GAAC_RESERVE_CUDA=0 turns them off): the whole GPU test suite under the new
# default, then the memory report with it (H200: eval/results/memory_h200.json's command; H100: lab evidence).
# Before that, issue 14: the v3 decoder candidates (lab/experiments/codec_v3_sweep.py, data carried in .kvdump) and
# eval/bench_codec_v3.py at the new default (bulk-stored 4-segment windows, 128 threads).
# $1: the commit measured, as a literal.
# Prediction: every GPU test passes as in call V2 / T7 (the reservations only change where pool rows live);
# codec (H100 numbers from W1; H200 scales with its copy rate): the new default 90-94% of the bound, bulk store
# >= the plain staged copy-out by 0-2%, old default ~62%; decode-and-reduce >= the W1 best at d=256;
# memory: peak over weights ~0.93x DynamicCache at 32K and 64K (call V1 on the H100: 0.937x / 0.932x).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
R=$(pwd); (cd /tmp && timeout 90 python3 $R/lab/experiments/codec_v3_sweep.py --kv "$R/.kvdump/smollm2_kv_v3.pt" \
  --out $OUT/codec_v3_sweep2_${GPU}.json 2>&1 | grep -E "^d=|rror" | sed 's/; regs.*//')
timeout 80 python3 eval/bench_codec_v3.py --kv .kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_${GPU}.json 2>&1 | grep -E "^d=|wrote|rror"
echo "codec after $(( $(date +%s) - T0 )) s"
timeout $(( 470 - ($(date +%s) - T0) )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/pytest_gpu_w2_${GPU}.txt 2>&1
echo "pytest rc $? after $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|FAIL|Error" $OUT/pytest_gpu_w2_${GPU}.txt | tail -15
timeout $(( 585 - ($(date +%s) - T0) )) python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 \
  --out $OUT/memory_${GPU}.json 2>&1 | grep -E "gaac_vs|wrote" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -3
echo "done after $(( $(date +%s) - T0 )) s"
