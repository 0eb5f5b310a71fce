#!/bin/bash
# Device call G1 (device tool, repo root): bash lab/device_probe.sh COMMIT
# GPU tests of the cache paths not rerun after session 7's merge, then lab/probe_fused.py.
set -o pipefail
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cache_v3_gpu.py tests/test_cache_gpu.py 2>&1 | tail -15 | tee $OUT/pytest_cache.txt
timeout 300 python3 lab/probe_fused.py --out $OUT/probe_fused.json 2>&1 | tail -30 | tee $OUT/probe.log
