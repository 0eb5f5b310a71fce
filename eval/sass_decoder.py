"""Compile the v3 decoder for sm_90 on the CPU (nvcc -cubin, no GPU) and count what a warp issues per value.

    python eval/sass_decoder.py [--out eval/results/sass_decoder.json]

kernels/cuda/gaac_v3/kernels.cu built with -DGAAC_V3_COUNT adds gaac_v3_count_item, a loop-free twin
of one work item of the product decoder gaac_v3_decode (it calls the same decode_item): the main path
of a window of WINDOW_SEGS segments (4 where a segment's values are contiguous, else a block cut into ceil(segments / 8) equal windows) and its fix-up with exactly k unrolled 32-entry
steps (-DGAAC_V3_COUNT_STEPS=k). Loop-free, so the static SASS count is what one warp issues. With
c1, c2 the counts for k = 1, 2: step = c2 - c1, rest = c1 - step, and

    warp_instr_per_value = sum over windows (rest + E[steps] * step) / values

where E[steps] = E[ceil(X / 32)], X ~ Binomial(groups of the window, wide share) with the wide
(4-bit + raw) group share measured on SmolLM2 (eval/results/compression_smollm2_v3.json). NOPs and
the trailing BRA self-loop are not counted (never issued).

The same twin built for FP8 tiles (``fp8_tiles``, issue 18) is counted per code at T = 64, d = 128 (:func:`measure_fp8`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "kernels" / "cuda" / "gaac_v3" / "kernels.cu"
HEAD_DIMS = (64, 128, 256, 80, 96, 112)
INT_PIPE = ("LOP3", "SHF", "IADD3", "PRMT", "SEL", "ISETP", "POPC", "FLO", "LEA", "VIADD", "IMNMX", "BMSK", "VOTE", "SHFL")
NOT_ISSUED = ("NOP",)


def tool(name: str) -> str:
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if p.exists():
            return str(p)
    except ImportError:
        pass
    return name


def nvcc_cmd(head_dim: int, out: str, block_t: int = 64, steps: int | None = None,
             defines: dict | None = None) -> list[str]:
    """``defines``: more NAME=value for kernels.cu (a lab build, e.g. WINDOW_SEGS / DECODE_THREADS)."""
    count = [] if steps is None else ["-DGAAC_V3_COUNT", f"-DGAAC_V3_COUNT_STEPS={steps}"]
    extra = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    return ["nvcc", "-cubin", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v",
            f"-DBLOCK_T={block_t}", f"-DHEAD_DIM={head_dim}", *count, *extra, str(SRC), "-o", out]


def expected_steps(groups: int, p: float) -> float:
    """E[ceil(X / 32)] for X ~ Binomial(groups, p)."""
    from math import comb, log, exp

    tot, lp, lq = 0.0, log(p), log1p_neg(p)
    for k in range(groups + 1):
        pk = exp(log(comb(groups, k)) + k * lp + (groups - k) * lq)
        tot += pk * -(-k // 32)
    return tot


def log1p_neg(p: float) -> float:
    from math import log1p

    return log1p(-p)


def wide_share() -> float:
    p = REPO / "eval" / "results" / "compression_smollm2_v3.json"
    if p.exists():
        ms = json.loads(p.read_text())["mode_shares"]
        return sum(1 - ms[k]["3bit"] for k in ("K", "V")) / 2
    return 0.101  # SmolLM2 v2 report: 4-bit 9.7% + raw 0.4%


def ptxas_report(log: str) -> dict:
    out, cur = {}, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            cur = out.setdefault(m.group(1), {})
        elif cur is not None and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif cur is not None and (m := re.search(r"Used (\d+) registers", line)):
            cur["registers"] = int(m.group(1))
    return out


def sass_ops(cubin: str, fn: str) -> collections.Counter:
    text = subprocess.run([tool("cuobjdump"), "-sass", "-fun", fn, cubin], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter()
    lines = [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    for ln in lines:
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", ln)
        if m:
            ops[m.group(1)] += 1
    # the trailing "BRA self" after EXIT is padding, never issued
    for ln in reversed(lines):
        if "NOP" in ln:
            continue
        if re.search(r"BRA\s+0x([0-9a-f]+)", ln) and ln.split("/*")[1].split("*/")[0].lstrip("0") == re.search(r"BRA\s+0x([0-9a-f]+)", ln).group(1).lstrip("0"):
            ops["BRA"] -= 1
        break
    for k in NOT_ISSUED:
        ops.pop(k, None)
    return ops


def measure(head_dim: int, tmp: str, p_wide: float, block_t: int = 64, defines: dict | None = None) -> dict:
    """One head_dim's count; ``defines`` (lab builds) may set WINDOW_SEGS, which the per-value cost then follows."""
    counts, res = {}, {}
    for steps in (1, 2):
        cubin = os.path.join(tmp, f"v3_{head_dim}_{steps}.cubin")
        r = subprocess.run(nvcc_cmd(head_dim, cubin, block_t, steps, defines), capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr)
        res = ptxas_report(r.stderr + r.stdout)
        counts[steps] = sass_ops(cubin, "gaac_v3_count_item")
    c1, c2 = sum(counts[1].values()), sum(counts[2].values())
    step, rest = c2 - c1, 2 * c1 - c2
    chunks = (block_t // 4) * (head_dim // 8)
    segs = -(-chunks // 32)
    nwin = -(-segs // 8)
    win = min(4, segs) if 32 % (head_dim // 8) == 0 else -(-segs // nwin)  # kernels.cu WINDOW_SEGS (BF16)
    if defines and "WINDOW_SEGS" in defines:
        win = min(int(defines["WINDOW_SEGS"]), segs)
    cost = values = 0.0
    for w0 in range(0, segs, win):
        ch = min(chunks, 32 * (w0 + win)) - 32 * w0
        cost += rest + expected_steps(4 * ch, p_wide) * step
        values += 32 * ch
    ints = sum(counts[1][o] for o in INT_PIPE)
    enc = sass_ops(os.path.join(tmp, f"v3_{head_dim}_1.cubin"), "gaac_v3_encode")
    return {
        "head_dim": head_dim,
        "warp_instr_per_value": round(cost / values, 4),
        "thread_instr_per_value": round(32 * cost / values, 3),
        "sass_window_without_fix_steps": rest,
        "sass_fix_step": step,
        "window_segments": win,
        "expected_fix_steps_per_full_window": round(expected_steps(4 * 32 * win, p_wide), 3) if chunks >= 32 * win else None,
        "int_pipe_share_of_one_step_item": round(ints / c1, 3),
        # loop-free per CTA (one chunk per lane): static count / 1,024 values per warp; includes the
        # once-per-block tail (segment table, padding) and the rare paths, so an upper bound
        "encoder_warp_instr_per_value": round(sum(enc.values()) / 1024, 4),
        "ops_one_step_item": dict(counts[1].most_common()),
        "resources": {k: v for k, v in res.items() if not k.startswith("gaac_v3_count")},
    }


CANDIDATE = REPO / "kernels" / "cuda" / "gaac_v3" / "candidate_tagplane.cu"


def measure_candidate_b(head_dim: int, tmp: str) -> dict:
    """The rejected tag-plane layout (candidate_tagplane.cu): one loop-free segment, 1,024 values."""
    cubin = os.path.join(tmp, f"b_{head_dim}.cubin")
    cmd = ["nvcc", "-cubin", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", f"-DHEAD_DIM={head_dim}",
           str(CANDIDATE), "-o", cubin]
    subprocess.run(cmd, check=True, capture_output=True)
    ops = sass_ops(cubin, "candidate_tagplane_segment")
    return {"head_dim": head_dim, "warp_instr_per_value": round(sum(ops.values()) / 1024, 4), "sass_segment": sum(ops.values()),
            "ops": dict(ops.most_common())}


#: warp-instruction issue slots per second of an H200 (132 SMs x 4 schedulers x 1.98 GHz; eval/sass_sm90.py's model)
ISSUE_SLOTS_PER_S = 132 * 4 * 1.98e9


def fp8_stream_codes_per_s() -> float:
    """The byte rate cuDNN reads BF16 K/V at on the H200 (``eval/results/attention_h200.json``, Qwen3-8B B=4 64K):
    the code rate of an FP8 decode kernel that streams plain FP8 codes as fast as the H200's HBM gives them."""
    res = json.loads((REPO / "eval" / "results" / "attention_h200.json").read_text())
    shape = res["shapes"]["qwen3-8b"]
    row = next(r for r in res["rows"] if r["shape"] == "qwen3-8b" and r["batch"] == 4 and r["context"] == 65536)
    kv_bytes = 2 * row["batch"] * shape["kv_heads"] * row["context"] * shape["head_dim"] * 2  # K and V, BF16
    return kv_bytes / (row["us"]["cudnn"] * 1e-6)


def fp8_wide_share(dtype: str) -> float:
    """Share of FP8-tile groups outside the narrow window (wide + raw) on real SmolLM2 K/V (K and V averaged)."""
    ms = json.loads((REPO / "eval" / "results" / "compression_fp8_smollm2.json").read_text())["per_dtype"][dtype]["mode_shares"]
    return sum(1 - ms[k]["narrow"] for k in ("K", "V")) / 2


def measure_fp8(fp8: int, dtype: str, tmp: str) -> dict:
    """The FP8-tile decoder (kernels.cu -DGAAC_FP8=1 E4M3, 2 E5M2) at T = 64, d = 128: its window is the whole block,
    32 codes per chunk; fix-up steps weighted by :func:`fp8_wide_share`. Issue cycles count the INT pipe at half rate
    (16 lanes per cycle per scheduler, eval/sass_v4.py). ``decode_alone_vs_fp8_stream``: the decode alone, issue-bound,
    against the code rate of an FP8 kernel streaming plain codes (:func:`fp8_stream_codes_per_s`): issue 18's fused
    kernel cannot beat that baseline while this is below 1."""
    stream = fp8_stream_codes_per_s()
    counts = {}
    for steps in (1, 2):
        cubin = os.path.join(tmp, f"fp8_{fp8}_{steps}.cubin")
        r = subprocess.run(nvcc_cmd(128, cubin, 64, steps, {"GAAC_FP8": fp8}), capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr)
        counts[steps] = sass_ops(cubin, "gaac_v3_count_item")
    c1, c2 = sum(counts[1].values()), sum(counts[2].values())
    i1, i2 = (sum(counts[k][o] for o in INT_PIPE) for k in (1, 2))
    p = fp8_wide_share(dtype)
    chunks = (64 // 4) * (128 // 8)
    e = expected_steps(4 * chunks, p)
    instr = (2 * c1 - c2 + e * (c2 - c1)) / (32 * chunks)
    cycles = (2 * (c1 + i1) - (c2 + i2) + e * (c2 + i2 - c1 - i1)) / (32 * chunks)
    return {
        "dtype": dtype, "head_dim": 128, "block_t": 64, "wide_share_used": round(p, 4), "expected_fix_steps": round(e, 3),
        "sass_window_without_fix_steps": 2 * c1 - c2, "sass_fix_step": c2 - c1,
        "warp_instr_per_code": round(instr, 4), "issue_cycles_per_code": round(cycles, 4),
        "issue_cycles_per_code_to_match_fp8_stream": round(ISSUE_SLOTS_PER_S / stream, 4),
        "decode_alone_vs_fp8_stream": round(ISSUE_SLOTS_PER_S / cycles / stream, 3),
        "decode_alone_vs_fp8_stream_one_cycle_per_instr": round(ISSUE_SLOTS_PER_S / instr / stream, 3),
        "ops_one_step_item": dict(counts[1].most_common()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "eval" / "results" / "sass_decoder.json"))
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    ap.add_argument("--candidates", action=argparse.BooleanOptionalAction, default=True,
                    help="also count the rejected tag-plane layout (candidate_tagplane.cu)")
    args = ap.parse_args(argv)
    p_wide = wide_share()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(int(d), tmp, p_wide) for d in args.head_dims.split(",")]
        cand = [measure_candidate_b(d, tmp) for d in (64, 128, 256)] if args.candidates else []
        fp8 = [measure_fp8(i, dt, tmp) for i, dt in ((1, "fp8_e4m3"), (2, "fp8_e5m2"))]
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "kernels/cuda/gaac_v3"], capture_output=True, text=True).stdout.strip())
    out = {
        "target": "sm_90a (nvcc -cubin on a CPU machine)",
        "nvcc": nvcc,
        "commit": commit + ("+dirty" if dirty else ""),
        "command": "python eval/sass_decoder.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "method": __doc__.split("\n\n")[2].strip(),
        "warp_instr_per_value": {str(r["head_dim"]): r["warp_instr_per_value"] for r in rows},
        "wide_group_share_used": round(p_wide, 5),
        "target_warp_instr_per_value": 0.15,
        "v2_triton_decoder_warp_instr_per_value": 0.59,
        "rows": rows,
        "rejected_candidate_B_tagplane": {"source": "kernels/cuda/gaac_v3/candidate_tagplane.cu", "rows": cand,
                                          "warp_instr_per_value": {str(r["head_dim"]): r["warp_instr_per_value"] for r in cand}},
        # issue 18: the FP8-tile decoder's count against the H200's issue rate (measure_fp8's docstring)
        "fp8_tiles": {"issue_slots_per_s": ISSUE_SLOTS_PER_S, "fp8_stream_codes_per_s": round(fp8_stream_codes_per_s(), -9),
                      "fp8_stream_from": "eval/results/attention_h200.json (cuDNN, Qwen3-8B B=4 64K)",
                      "rows": fp8},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"d={r['head_dim']:3d}: {r['warp_instr_per_value']:.4f} warp-instr/value (window {r['sass_window_without_fix_steps']}, "
              f"encoder <= {r['encoder_warp_instr_per_value']:.3f}, "
              f"fix step {r['sass_fix_step']}), "
              f"regs " + ", ".join(f"{k.removeprefix('gaac_v3_')} {v.get('registers')}" for k, v in r["resources"].items()))
    for r in cand:
        print(f"rejected candidate B (tag plane) d={r['head_dim']}: {r['warp_instr_per_value']:.4f} warp-instr/value")
    for r in fp8:
        print(f"FP8 tiles {r['dtype']}: {r['warp_instr_per_code']:.4f} warp-instr / {r['issue_cycles_per_code']:.4f} issue "
              f"cycles per code; decode alone at most {r['decode_alone_vs_fp8_stream']}x an FP8 code stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
