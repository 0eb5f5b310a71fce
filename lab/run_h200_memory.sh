#!/bin/bash
# H200 call for issue 19 (bounded allocation, checksums): one call, < 10 minutes.
# Usage (device tool, repo root):  GAAC_COMMIT=<the commit you run> GAAC_DIRTY=0 bash lab/run_h200_memory.sh
#   1. the GPU tests of the cache: the no-sync decode path with and without checksums, cache.verify(),
#      and the CUDA allocation bound of docs/CACHE.md "Memory" (tests/test_cache_gpu.py);
#   2. eval/memory_report.py --gpu: torch.cuda.max_memory_allocated of generate() (prefill + 8 tokens)
#      at 32K and 64K, random-init Qwen3-8B shape (all 36 layers), GAACCache + gaac vs DynamicCache +
#      sdpa -> $OUT/memory_h200.json (copy it to eval/results/memory_h200.json).
# Prediction: peak over the weights ~ KV + prefill activations; GAAC's KV is ~0.71x of BF16's
# (~9.7 GB -> ~6.9 GB at 64K), so gaac_vs_dynamic_peak_over_before ~0.75-0.85 at both contexts.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_cache_gpu.py tests/test_cache_memory.py tests/test_cache_integrity.py \
  2>&1 | tail -6 | tee $OUT/pytest_gpu.txt
timeout 360 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 36 \
  --out $OUT/memory_h200.json 2>&1 | tail -6 | tee $OUT/memory_h200.log
