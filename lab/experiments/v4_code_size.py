"""Code size of the fused v4 kernel on the CPU (nvcc + cuobjdump, no GPU), lab only: per planner launch the whole
``gaac_v4_decode_split`` SASS count and registers, and eval/sass_v4.py's warp-tile bodies, with experiment defines.

    python lab/experiments/v4_code_size.py --out lab/results/session27_code_size.json

Its experiment defines (ONE_TILE_BODY, K_ROLLED) left the kernel in session 28 after call Y10 measured them (no gain;
lab/cuda-decode-notebook.md): rerun it at commit 369ba63, which holds them.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "eval"))
import sass_v4  # noqa: E402
from sass_decoder import tool  # noqa: E402

from gaac_hf.kernels import LaunchConfig  # noqa: E402
from gaac_hf.kernels.cuda import attention as A  # noqa: E402
from gaac_hf.kernels.cuda import fused_attention_v4 as F4  # noqa: E402
from gaac_hf.kernels.cuda import runtime  # noqa: E402

A._sm_count = F4._sm_count = lambda device: 132  # an H100 / H200 SM count, for the planner
VARIANTS = {128: [{}, {"ONE_TILE_BODY": 1}],
            256: [{}, {"CONST_REGS": 0}, {"ONE_TILE_BODY": 1}, {"K_ROLLED": 1, "CONST_REGS": 0},
                  {"K_ROLLED": 1, "CONST_REGS": 0, "ONE_TILE_BODY": 1}]}
ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
rows = []
with tempfile.TemporaryDirectory() as tmp:
    for d, (g, streams) in ((128, (4, 8)), (256, (4, 1))):
        p = F4.plan(streams, 1, g, 64, d, 65536 + 64, None, LaunchConfig())
        for extra in VARIANTS[d]:
            defs = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(g, p["splits"], d)) | extra
            out = f"{tmp}/k.cubin"
            r = subprocess.run(runtime.nvcc_command(F4.SOURCE, defs, "sm_90a", out), capture_output=True, text=True)
            r.check_returncode()
            res = runtime.parse_ptxas(r.stdout + r.stderr)["gaac_v4_decode_split"]
            sass = subprocess.run([tool("cuobjdump"), "-sass", "-fun", "gaac_v4_decode_split", out],
                                  capture_output=True, text=True, check=True).stdout
            n = len(re.findall(r"/\*[0-9a-f]{4,}\*/", sass))
            body = {("raw" if raw else "no_raw"): sass_v4.measure(d, raw, tmp, extra=extra)["instructions"]
                    for raw in (False, True)}
            rows.append(dict(head_dim=d, group=g, defines=extra, kernel_sass_instructions=n, kernel_bytes=16 * n,
                             registers=res["registers"], spills=res["spill_stores"] + res["spill_loads"],
                             tile_body_instructions=body))
            print(rows[-1], flush=True)
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
Path(args.out).write_text(json.dumps(dict(commit=commit, command=" ".join(sys.argv), arch="sm_90a",
                                          note="planner's launch at 64K, batch x kv heads 8 (d=128) / 1 (d=256)",
                                          rows=rows), indent=1))
print("wrote", args.out)
