#!/bin/bash
# Next GPU session, call 3: e2e at 128K (B = 1, 4) and B = 16 at 32K, with graph replays.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 300 python3 eval/bench_e2e.py --contexts 131072 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --budget-s 240 --graphs --out $OUT/e2e_h200_128k.json 2>&1 | grep -v Warn | tail -4
timeout 190 python3 eval/bench_e2e.py --contexts 32768 --batches 16 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --budget-s 150 --graphs --out $OUT/e2e_h200_b16.json 2>&1 | grep -v Warn | tail -4
