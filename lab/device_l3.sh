#!/bin/bash
# Call L3 (session 11): where the default fused kernel's instructions go, per source line. Nsight Compute
# SourceCounters (instructions executed per SASS address) of the default launch at Qwen3 B=1 64K, with all
# work and with decoding off (PROBE 1), plus nvdisasm's address -> source-line table of the same cubins
# (built with GAAC_CUDA_LINEINFO=1; same code). Joined on the CPU by lab/ncu_lines.py.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="${1:-unknown}" GAAC_DIRTY=0 GAAC_CUDA_LINEINFO=1 GAAC_CUDA_CACHE=/tmp/gaac_cc
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
for probe in 0 1; do
  timeout 200 ncu --clock-control none --section SourceCounters --section InstructionStats --section SpeedOfLight \
    --section WarpStateStats -k regex:gaac_v3 --launch-skip 2 --launch-count 1 -o /tmp/rep_$probe -f \
    python3 lab/ncu_probe.py default $probe > /tmp/ncu_$probe.log 2>&1 || tail -5 /tmp/ncu_$probe.log
  ncu -i /tmp/rep_$probe.ncu-rep --page source --csv --print-source sass > $OUT/src_probe$probe.csv 2>&1
  ncu -i /tmp/rep_$probe.ncu-rep --page details --csv > $OUT/details_probe$probe.csv 2>&1
  gzip -f $OUT/src_probe$probe.csv
done
ls -la /tmp/gaac_cc/ | head
DIS=$(command -v nvdisasm || ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1)
for f in /tmp/gaac_cc/decode_attention_v3*.cubin; do
  n=$(basename $f .cubin); $DIS --print-line-info -c $f > $OUT/$n.sass 2>&1 || cuobjdump -sass $f > $OUT/$n.sass 2>&1
  gzip -f $OUT/$n.sass
done
grep -h -E "Duration|Executed Ipc|Issue Slots Busy|Instructions" $OUT/details_probe*.csv | cut -c1-200 | head -20
ls -la $OUT
