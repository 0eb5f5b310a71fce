# Sourced by the device scripts (lab/device_y15.sh, lab/device_y16.sh): the call's time limit and what is left of it,
# the environment every step runs in, the card's name (h100 / h200) and the editable install of this checkout.
# Expects $1 = the commit the call measures and LIMIT set by the caller.
left() { echo $((LIMIT - SECONDS)); }
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"

# On an H200: issue 19's memory line and issue 14's codec file (the call carries .kvdump for the codec file).
h200_memory_codec() {
  [ "$GPU" = h200 ] || return 0
  timeout 90 python3 eval/memory_report.py --gpu --contexts 32768 65536 --gpu-layers 12 --out $OUT/memory_h200.json 2>&1 \
    | grep -E "gaac_vs|wrote|rror" | sed 's/.stats.*gaac_vs/ gaac_vs/' | tail -6
  [ -f .kvdump/smollm2_kv_v3.pt ] && (R=$PWD; cd /tmp && timeout 40 \
    python3 $R/eval/bench_codec_v3.py --kv $R/.kvdump/smollm2_kv_v3.pt --out $OUT/codec_v3_h200.json 2>&1 | grep -E "^d=|wrote|rror")
  echo "memory and codec done after $SECONDS s"
}

# Kernel defines NAME=V flipped in this working copy for the rest of the call (recorded in $OUT/flipped.txt; the
# files the call writes then carry GAAC_DIRTY=1, and the flip is committed afterwards with the same source).
flip_defines() {
  local K="kernels/cuda/decode_attention_v4.cu kernels/cuda/decode_attention.cu kernels/cuda/include/gaac/attend.cuh
           kernels/cuda/include/gaac/ptx.cuh" nv n
  for nv in "$@"; do
    n=${nv%=*}
    sed -i -E "s/^#define $n [0-9]+( |$)/#define $n ${nv#*=}\1/" $K; grep -h "^#define $n " $K | tee -a $OUT/flipped.txt
    export GAAC_DIRTY=1
  done
}

# The GPU tests of both kernels within $1 seconds (skipped under 30), into $OUT/pytest_gpu_$GPU.txt.
gpu_tests() {
  [ "$1" -gt 30 ] && timeout "$1" python3 -m pytest -q -m gpu tests/test_v4_gpu.py tests/test_cuda_attention.py \
    -p no:cacheprovider > $OUT/pytest_gpu_$GPU.txt 2>&1; tail -2 $OUT/pytest_gpu_$GPU.txt; echo "tests done after $SECONDS s"
}
