#!/bin/bash
# Session 14, call A: the decoded_slots GPU test (never run), then e2e at 128K (B = 1, 4) and B = 16 at 32K with graphs.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 90 python3 -m pytest -q -m gpu tests/test_cuda_fused.py -k decoded_slots -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/pytest_decoded_slots.txt
bash lab/device_next3.sh "$1"
