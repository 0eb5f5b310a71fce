#!/bin/bash
# Second call of the next GPU session: the 36-layer e2e decode step with its own budget (128K and B=16 were cut
# in session 11: time budget, and one-forward prefill out of memory; bench_e2e now prefills in chunks and
# records a BF16 cache that does not fit as oom_*).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 560 python3 eval/bench_e2e.py --contexts 32768 65536 131072 --batches 1 4 16 --steps 8 --prof-steps 3 \
  --prefill-reps 1 --budget-s 520 --out $OUT/e2e_h200.json 2>&1 | grep -v Warn | tail -12
