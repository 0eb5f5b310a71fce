"""SASS warp-instructions per value of the v3 decoder built with another window / thread count (session 38, CPU).

    python lab/experiments/sass_window_count.py WINDOW_SEGS DECODE_THREADS [--out FILE]

eval/sass_decoder.py's count (`measure` with lab defines) at d = 64 / 128 / 256. Question it answers: does the
2-segment x 256-thread decoder (3 points faster on the H100, call Y32) keep issue 14's <= 0.15 warp-instructions per
value? Writes the rows (with the commit and command) where --out says.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "eval"))
import sass_decoder as s  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("window_segs", type=int)
ap.add_argument("threads", type=int)
ap.add_argument("--out")
args = ap.parse_args()
defines = {"WINDOW_SEGS": args.window_segs, "DECODE_THREADS": args.threads}
p = s.wide_share()
with tempfile.TemporaryDirectory() as tmp:
    rows = [s.measure(d, tmp, p, defines=defines) for d in (64, 128, 256)]
for r in rows:
    print(f"d={r['head_dim']} W{args.window_segs} T{args.threads}: window {r['sass_window_without_fix_steps']} + fix step "
          f"{r['sass_fix_step']}: {r['warp_instr_per_value']:.4f} warp-instr/value")
if args.out:
    commit = subprocess.run(["git", "-C", str(s.REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump({"commit": commit, "command": "python " + " ".join(sys.argv), "defines": defines,
                   "target_warp_instr_per_value": 0.15, "wide_group_share_used": round(p, 5),
                   "warp_instr_per_value": {str(r["head_dim"]): r["warp_instr_per_value"] for r in rows},
                   "rows": [{k: v for k, v in r.items() if k != "ops_one_step_item"} for r in rows]}, f, indent=1)
