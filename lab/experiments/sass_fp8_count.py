"""Lab (session 39, issue 18): what one warp issues per FP8 code in the FP8-tile decoder, counted on the CPU.

    python lab/experiments/sass_fp8_count.py [--out FILE.json]

The v3 decoder's loop-free count twin (``kernels/cuda/gaac_v3/kernels.cu`` with ``-DGAAC_V3_COUNT``, the method of
eval/sass_decoder.py) built for FP8 tiles (``-DGAAC_FP8=1`` E4M3, ``2`` E5M2) at T = 64, d = 128: one window of the
whole block (FP8 windows are whole blocks), fix-up steps weighted by the wide + raw group share measured on real
SmolLM2 K/V (``eval/results/compression_fp8_smollm2.json``). The INT pipe issues 16 lanes per cycle per scheduler
(eval/sass_v4.py), so issue cycles = instructions + INT instructions. Beside it: the H200 issue budget per code if a
fused kernel is to stream codes as fast as its bytes allow (ratio x an FP8 baseline's HBM-bound code rate), from the
same issue model as eval/sass_sm90.py (132 SMs x 4 schedulers x 1.98 GHz) and a code stream of --stream-codes-per-s
(default: 4.26e12, the byte rate cuDNN reads BF16 K/V at in eval/results/attention_h200.json, B=4 64K)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
from sass_decoder import INT_PIPE, expected_steps, nvcc_cmd, sass_ops  # noqa: E402

ISSUE_CYCLES_PER_S = 132 * 4 * 1.98e9  # warp-instruction issue slots per second on an H200 (eval/sass_sm90.py)


def count(fp8: int, tmp: str) -> dict:
    c = {}
    for steps in (1, 2):
        cubin = os.path.join(tmp, f"fp8_{fp8}_{steps}.cubin")
        r = subprocess.run(nvcc_cmd(128, cubin, 64, steps, {"GAAC_FP8": fp8}), capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        c[steps] = sass_ops(cubin, "gaac_v3_count_item")
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--stream-codes-per-s", type=float, default=4.26e12)
    args = ap.parse_args(argv)
    rep = json.loads((REPO / "eval" / "results" / "compression_fp8_smollm2.json").read_text())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fp8, dtype in ((1, "fp8_e4m3"), (2, "fp8_e5m2")):
            ms = rep["per_dtype"][dtype]["mode_shares"]
            p_wide = sum(1 - ms[k]["narrow"] for k in ("K", "V")) / 2
            c = count(fp8, tmp)
            c1, c2 = sum(c[1].values()), sum(c[2].values())
            i1, i2 = (sum(c[k][o] for o in INT_PIPE) for k in (1, 2))
            step, rest = c2 - c1, 2 * c1 - c2
            istep, irest = i2 - i1, 2 * i1 - i2
            chunks = (64 // 4) * (128 // 8)  # one window: the whole block, 32 codes per chunk
            e = expected_steps(4 * chunks, p_wide)
            codes = 32 * chunks
            instr = (rest + e * step) / codes
            cycles = (rest + irest + e * (step + istep)) / codes
            ratio = rep["per_dtype"][dtype]["ratio_over_fp8"]
            need = args.stream_codes_per_s * ratio  # codes/s a fused kernel must reach to read bytes as fast as the baseline
            match = ISSUE_CYCLES_PER_S / args.stream_codes_per_s  # cycles per code at the baseline's own code rate
            rows[dtype] = {
                "wide_share": round(p_wide, 4), "expected_fix_steps": round(e, 3),
                "sass_window_without_fix_steps": rest, "sass_fix_step": step,
                "warp_instr_per_code": round(instr, 4), "issue_cycles_per_code": round(cycles, 4),
                "decode_only_codes_per_s_at_issue_bound": round(ISSUE_CYCLES_PER_S / cycles, -9),
                "ratio_over_fp8": ratio, "codes_per_s_needed": round(need, -9),
                "issue_cycles_per_code_budget": round(ISSUE_CYCLES_PER_S / need, 4),
                # to be faster than the baseline at all, decode + attention must fit this many cycles per code
                "issue_cycles_per_code_to_match_baseline": round(match, 4),
                # the decode alone, issue-bound, against the baseline's code rate (attention work not counted)
                "decode_alone_max_speed_vs_baseline": round(ISSUE_CYCLES_PER_S / cycles / args.stream_codes_per_s, 3),
                "decode_alone_max_speed_vs_baseline_one_cycle_per_instr": round(
                    ISSUE_CYCLES_PER_S / instr / args.stream_codes_per_s, 3),
                "ops_one_step_item": dict(c[1].most_common(12)),
            }
            r = rows[dtype]
            print(f"{dtype}: {r['warp_instr_per_code']} warp-instr / {r['issue_cycles_per_code']} issue cycles per code "
                  f"(decode alone); budget for decode + attention at {r['codes_per_s_needed']:.3g} codes/s: "
                  f"{r['issue_cycles_per_code_budget']} cycles per code (to match the baseline: "
                  f"{r['issue_cycles_per_code_to_match_baseline']}); decode alone at most "
                  f"{r['decode_alone_max_speed_vs_baseline']}x the baseline's code rate")
    if args.out:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        Path(args.out).write_text(json.dumps({"rows": rows, "commit": commit, "command": "python " + " ".join(sys.argv),
                                              "issue_cycles_per_s": ISSUE_CYCLES_PER_S,
                                              "stream_codes_per_s": args.stream_codes_per_s}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
