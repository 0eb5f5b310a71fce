#!/usr/bin/env bash
# Works as installed, not only as checked out: build a wheel from this checkout, install it into a
# fresh virtual environment (--system-site-packages: torch & co. come from the surrounding python,
# --no-deps: nothing is downloaded), and from another directory run gaac-demo, the README's Python
# snippet and gaac-lm-eval on a shipped task.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg
# the checkout's ../shared/data, for the task data the installed package cannot see from elsewhere
export GAAC_HF_DATA="${GAAC_HF_DATA:-$REPO/../shared/data}"

python -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/gaac_hf-*.whl)"
python - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["gaac_hf/calibration_data/smollm2-135m.safetensors", "gaac_hf/integrations/lm_eval/tasks/gaac_piqa.yaml",
        "gaac_hf/integrations/lm_eval/tasks/gaac_tasks.py", "gaac_hf/kernels/triton/attention.py", "gaac_hf/kernels/paged.py"]
missing = [n for n in need if n not in names]
assert not missing, f"wheel lacks {missing}"
print(f"wheel: {len(names)} files")
PY
# no pip of its own (seeding one costs ~10 s): this python's pip installs into it (pip --python)
python -m venv --without-pip --system-site-packages "$WORK/venv"
python -m pip --python "$WORK/venv/bin/python" install -q --no-deps "$WHEEL"
mkdir "$WORK/elsewhere" && cd "$WORK/elsewhere"
# the venv's own copy, not the checkout (an editable install of the checkout may sit in site-packages)
"$WORK/venv/bin/python" -c "import gaac_hf, sys; p = gaac_hf.__file__; print('gaac_hf from', p); sys.exit(not p.startswith('$WORK/venv/'))"
"$WORK/venv/bin/gaac-demo"
python - "$REPO/README.md" > snippet.py <<'PY'
import re, sys
print(re.search(r"## Use it\n\n```python\n(.*?)```", open(sys.argv[1]).read(), re.S).group(1))
PY
"$WORK/venv/bin/python" snippet.py
"$WORK/venv/bin/gaac-lm-eval" --model hf-gaac \
  --model_args pretrained=smollm2,gaac=true,calibration=smollm2-135m,prefill_chunk=64 \
  --tasks gaac_piqa --limit 2 --output_path "$WORK/lm_eval_out"
echo "wheel check: ok"
