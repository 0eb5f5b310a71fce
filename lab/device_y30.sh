#!/bin/bash
# Session 37, the last ~300 s of budget: the e2e step with --compile-ops fused on an H200 (issue 15's must-show card; the
# static BF16 cache at B=4 64K does not fit an H100's 80 GB). Usage: $0 <commit> <seconds>.
LIMIT=${2:-200}
source lab/device_env.sh >/dev/null 2>&1
timeout $(( $(left) - 5 )) python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s $(( $(left) - 30 )) --graphs --compile-ops fused \
  --kernel-table --out $OUT/e2e_fused_$GPU.json 2>&1 | grep -v Warn | tail -3
echo "all done after $SECONDS s"
