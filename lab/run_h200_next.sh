#!/bin/bash
# The next H200 call (planned in session 3, eval/NOTES.md): everything written since the last GPU run,
# in two calls of <= 8 minutes each. Usage (device tool, repo root): bash eval/run_h200_next.sh 1|2
#   1. GPU tests: the byte-code pair decoder, the deferred prefill store and the pinned slab have only
#      run on the CPU (interpreter / CPU tensors) so far;
#   2. codec at 4x size with fast-decoder launch variants (predictions in NOTES: ~1,500 GB/s at the
#      default launch, ~1,700 with 4 warps / 16-token sub-tiles);
#   3. prefill overhead at 32K B=1 with the pinned slab (prediction: +4.5% -> ~1.5%);
#   4. the attention grid (prediction: 64K B=1 344 -> ~290-310 us; check n_spills first);
#   5. the transposed-dot kernel experiment (eval/experiments/attention_tt.py; no prediction beyond
#      "bit-identical to its BF16 twin": its registers (185 at 1 warp) leave ~11 warps per SM).
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
if [ "${1:-1}" = 1 ]; then
timeout 170 python3 -m pytest -q -x -m gpu tests/ 2>&1 | tail -4 | tee $OUT/pytest_gpu.txt
timeout 120 python3 eval/bench_codec.py --quick --heads 32 --decode-configs "4,16;4,32;2,16" \
  --out $OUT/codec_h200_pairs_v2.json 2>&1 | tail -4 | tee $OUT/codec.log
timeout 150 python3 eval/bench_e2e.py --prefill-only --prefill-reps 5 --contexts 32768 --batches 1 \
  --budget-s 120 --out $OUT/e2e_h200_prefill_slab.json 2>&1 | tail -2 | tee $OUT/e2e_prefill.log
fi
if [ "${1:-1}" = 2 ]; then
timeout 300 python3 eval/bench_attention.py --out $OUT/attention_h200.json --budget-s 200 --max-cases 12 \
  --asm-dir $OUT/asm 2>&1 | tail -16 | tee $OUT/attention.log
timeout 150 python3 eval/experiments/attention_tt.py --gpu 2>&1 | tail -14 | tee $OUT/tt.log
fi
