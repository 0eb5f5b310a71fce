#!/bin/bash
# Next GPU session, call V2 (one H200, <= 590 s): the CUDA reservations of gaac_hf/cache/reserve_cuda.py (written in
# session 20 without a GPU) and the GPU tests changed since their last run, then the H200 memory report with pools in
# reservations. $1: the commit measured, as a literal.
# Prediction (lab notebook, session 20): tests/test_cache_reserve_gpu.py passes (span maps 2 MiB granules in place,
# generate bit-identical with and without reservations, no reserved pool moves, decode steps never sync); if the span
# test fails first, the likely cause is torch.as_tensor refusing the VMM pointer or the CUmemAllocationProp layout.
# Memory: GAAC's peak over the weights 0.90-0.91x DynamicCache's at 32K / 64K (allocated ~0.705x of BF16 plus at most
# 8 granules of rounding per pool, 72 pools x 16 MiB worst case), the pools mapped outside torch's allocator counted.
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
timeout 240 python3 -m pytest -q -m gpu -x tests/test_cache_reserve_gpu.py tests/test_cache_v3_gpu.py tests/test_v4_gpu.py \
  2>&1 | tail -15 | tee $OUT/pytest_gpu_v2.txt
echo "tests after $(( $(date +%s) - T0 )) s"
GAAC_RESERVE_CUDA=1 timeout $(( 585 - ($(date +%s) - T0) )) python3 eval/memory_report.py --gpu --gpu-layers 12 \
  --out $OUT/memory_h200_reserved.json 2>&1 | grep -v Warn | tail -6
echo "done after $(( $(date +%s) - T0 )) s"
