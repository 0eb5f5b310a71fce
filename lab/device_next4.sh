#!/bin/bash
# Next session: e2e B = 16 at 32K, then B = 4 at 128K, with graphs (DynamicCache left out; chunked prefills
# under FA2 + memory-efficient with the mask capped at 2^30 elements; an OOM keeps the measured BF16 rows).
# Args: commit timeout context batch [--skip-stock-graph] (B=4 128K needs it: three prefills do not fit 600 s).
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout ${2:-560} python3 eval/bench_e2e.py --contexts ${3:-32768} --batches ${4:-16} --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic ${5:-} --budget-s 300 --graphs --out $OUT/e2e_h200_next.json 2>&1 | grep -v Warn | tail -4
