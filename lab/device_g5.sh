#!/bin/bash
# Call G5: every GPU test, then the SM_SWZ variant in the probe.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tail -15 | tee $OUT/pytest_gpu.txt
timeout 200 python3 lab/probe_fused.py --probes 0,6 --extra ",SM_SWZ=1" --out $OUT/probe_swz.json 2>&1 | grep -v Warn | tail -10 | tee $OUT/probe.log
