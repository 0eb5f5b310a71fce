#!/bin/bash
# Session 18, call S3: CONST_REGS A/B on the key attention cases, then e2e (format v4, graphs) at 64K B = 1, 4
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 120 python3 lab/experiments/v4_ab.py --define CONST_REGS --values 0 1 --out $OUT/v4_ab_const_regs_callS3.json 2>&1 | grep -v Warn | tail -9
echo "ab after $(( $(date +%s) - T0 )) s"
timeout ${2:-420} python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --format-version 4 --budget-s 330 --graphs --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -12
echo "e2e after $(( $(date +%s) - T0 )) s"
