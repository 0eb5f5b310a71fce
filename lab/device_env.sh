# Sourced by the device scripts (lab/device_y15.sh, lab/device_y16.sh): the call's time limit and what is left of it,
# the environment every step runs in, the card's name (h100 / h200) and the editable install of this checkout.
# Expects $1 = the commit the call measures and LIMIT set by the caller.
left() { echo $((LIMIT - SECONDS)); }
export PYTHONUNBUFFERED=1 GAAC_COMMIT="$1" GAAC_DIRTY=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100 && echo h100 || echo h200)
echo "gpu: $GPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
