#!/bin/bash
# Profile of the fused kernel: ncu stall reasons + SASS instruction counts of its main loops.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
export GAAC_CUDA_CACHE=$OUT/cubins
timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
  --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis \
  -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python3 lab/ncu_fused.py 2 6 2 > $OUT/ncu_fused.txt 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Executed Ipc|Issue Slots|Registers|Stall|Bank|Executed Instructions |Theoretical Occ|Block Limit|Shared Memory Config" $OUT/ncu_fused.txt | cut -c1-140 | head -50
timeout 200 ncu --clock-control none --section WarpStateStats --section SourceCounters \
  -k regex:gaac_v3 --launch-skip 2 --launch-count 1 python3 lab/ncu_fused.py 2 6 2 > $OUT/ncu_fused_src.txt 2>&1
grep -iE "stall|warp cycles|smsp__pcsamp" $OUT/ncu_fused_src.txt | cut -c1-160 | head -40
for f in $OUT/cubins/*.cubin; do cuobjdump -sass $f > ${f%.cubin}.sass 2>/dev/null; done
ls $OUT/cubins | head; wc -l $OUT/cubins/*.sass | tail -3
