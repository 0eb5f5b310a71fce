#!/bin/bash
# Next session (written in session 37, whose only call, Y29, ran on an H100): on an **H200** (pass needs_h200: the
# static BF16 cache at B=4 64K does not fit an H100), carry .kvdump. Usage: $0 <commit> <seconds>.
# (0) GPU tests touched since the last H200 run: the tail append (kernels/cuda/tail_append.cu, eager and graph steps);
# (1) e2e 64K B=1 / B=4, --compile-ops fused (now with the residual adds in place: no memcpy per GEMM) + kernel tables:
#     issue 15's e2e file if it beats eval/results/e2e_compiled_h200.json; (2) the H100's flat split sweep again on the
#     H200 (does 96 -> 128 CTAs matter where each SM moves ~40% more bytes?); (3) codec windows (issue 14).
# Predictions: lab/cuda-decode-notebook.md, "Call Y31 prediction".
LIMIT=${2:-560}
source lab/device_env.sh >/dev/null 2>&1
# the graph-gap probe (session 39): us per kernel boundary in a replayed graph, small / big-smem / alternating, +-PDL
timeout 60 python3 lab/experiments/graph_gaps/probe.py --out $OUT/graph_gaps_probe_$GPU.json 2>&1 | grep -E "us/launch|rror"
# the tail kernel in eager steps (4ac9550) has not run on a GPU: the cache-level GPU tests first (v3 and v4 caches, graphs)
timeout 240 python3 -m pytest -q -m gpu tests/test_pdl.py tests/test_tail_append.py tests/test_cuda_graphs_gpu.py tests/test_cache_v3_gpu.py \
  tests/test_v4_gpu.py -k "tail or graph or cache or generate or sync" -p no:cacheprovider > $OUT/pytest_gpu_$GPU.txt 2>&1
tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
timeout 240 python3 eval/bench_e2e.py --contexts 65536 --batches 1 4 --steps 6 --prof-steps 2 --prefill-reps 1 \
  --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 205 --graphs --compile-ops fused \
  --kernel-table --out $OUT/e2e_fused_$GPU.json 2>&1 | grep -v Warn | tail -3
echo "e2e done after $SECONDS s"
# (1b) the same at B=1 with the compiled kernels launched with programmatic dependent launch (inductor's enable_pdl;
# session 39), and GAAC's tail append and attention too (GAAC_PDL=1): do the graph gaps shrink? (combo kernels ran on the H100 in Y32: GPU ratio unchanged, gaps grew)
[ $(left) -gt 200 ] && GAAC_PDL=1 timeout 110 python3 eval/bench_e2e.py --contexts 65536 --batches 1 --steps 6 --prof-steps 2 \
  --prefill-reps 1 --skip-dynamic --skip-stock-graph --format-version 4 --budget-s 90 --graphs --compile-ops fused-pdl \
  --kernel-table --out $OUT/e2e_fused_pdl_b1_$GPU.json 2>&1 | grep -v Warn | tail -2
[ $(left) -gt 45 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && timeout 40 python3 lab/experiments/codec_v3_sweep.py --head-dims 64,128,256 --out $OUT/codec_v3_sweep_w2_$GPU.json --variants 4:8:2:128 2:4:2:256 4:4:1:256 4:8:1:128 2>&1 | grep -E "^d=|wrote"
# issue 18 (session 39): the FP8-tile decoder against the FP8 code stream an FP8 attention kernel reads
[ $(left) -gt 45 ] && [ -f .kvdump/smollm2_kv_v3.pt ] && timeout 40 python3 lab/experiments/fp8_decode_rate.py --out $OUT/fp8_decode_rate_$GPU.json 2>&1 | grep -E "codes/s|rror"
[ $(left) -gt 60 ] && SWEEP_CASES="qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536" SWEEP_SPLITS="3 4 12 14 15 16" timeout 50 python3 lab/experiments/v4_splits_sweep.py --out $OUT/v4_splits_qwen3_$GPU.json 2>&1 | grep qwen3
# every SM busy at 8 kv heads (264 CTAs = 2 per SM of the H200's 132) where 128 leave 4 idle: an H100 answered no
[ $(left) -gt 55 ] && timeout 50 python3 lab/experiments/v4_define_ab.py --out $OUT/v4_w4_$GPU.json --cases qwen3-8b:1:65536 qwen3-8b:1:131072 qwen3-8b:4:65536 --variants "" launch=4:2:2 2>&1 | grep -E "B=|wrote|rror"
echo "all done after $SECONDS s"
