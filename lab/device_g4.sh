#!/bin/bash
# Call G4: the v3 cache on CUDA after the fused-kernel wiring: crop debug, cache GPU tests.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 120 python3 lab/debug_v3_crop.py 2>&1 | grep -v Warning | tail -30 | tee $OUT/debug_crop.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cache_v3_gpu.py tests/test_cache_gpu.py 2>&1 | tail -25 | tee $OUT/pytest_cache.txt
