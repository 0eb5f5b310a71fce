#!/bin/bash
# Prepared in session 12 (CPU only) for ONE device call (<= 400 s, one H200): FIX_LAG, software-pipelined
# producers (lab/cuda-decode-notebook.md "Prepared in session 12"). Branch kernel-exp.
#   1. A/B (<= 170 s): lab/sweep_fix_lag.py compiles every cubin first (12 processes), then per case checks
#      every variant's bits against the BF16 twin (printed before any timing: a FIX_LAG deadlock shows as the
#      last "checking" line without its result) and times default vs variants in one process, 2 interleaved
#      rounds: Qwen3-8B B=1 / B=4 64K, SmolLM2 and Gemma3 B=1 64K -> $OUT/sweep_fix_lag.json (rewritten
#      after each case, so a cut run keeps what it finished)
#   2. the fix_lag GPU tests (<= 170 s): bit identity on every CASES shape (2 and 3 slots, 1 / 3 splits,
#      shifted windows), the planner's launches, adversarial blocks, left padding -> $OUT/pytest_fixlag.txt
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"

timeout 170 python3 lab/sweep_fix_lag.py --out $OUT/sweep_fix_lag.json \
  --cases qwen3-8b:1:65536,qwen3-8b:4:65536,smollm2-135m:1:65536,gemma3:1:65536 2>&1 | grep -v Warn | tail -40
echo "sweep rc ${PIPESTATUS[0]}"

timeout 170 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_cuda_fused.py -k "fix_lag" --tb=short \
  > $OUT/pytest_fixlag.txt 2>&1
echo "pytest rc $?"; grep -E "^(FAILED|ERROR)|^E  |passed|failed" $OUT/pytest_fixlag.txt | head -12
