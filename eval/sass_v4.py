"""Static SASS count of one warp-tile of the fused v4 kernel (CPU only: nvcc + cuobjdump).

    python eval/sass_v4.py [--head-dim 128] [--raw] [--json out.json]

Builds ``kernels/cuda/decode_attention_v4.cu`` with ``GAAC_SASS_TILE_ONLY`` (only the compressed-tile body in
the main loop; 2 = the body of tiles that list raw groups), takes the loop between the mbarrier wait and its
backward branch, and counts its instructions by pipe. On sm_90 the INT pipe (LOP3, SHF, PRMT, IADD3, ...) takes
16 lanes per cycle per scheduler, so a warp instruction there costs two issue cycles; HMMA are the tensor-core
MMAs (the BF16 twin's own). The lab notebook's call R3/R4 timings follow these counts (tests/test_v4_cuda_build.py
keeps them under budget).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "eval"))
from sass_decoder import ptxas_report, tool  # noqa: E402

SRC = REPO / "kernels" / "cuda" / "decode_attention_v4.cu"
INT = {"LOP3", "SHF", "PRMT", "IADD3", "ISETP", "SEL", "LEA", "POPC", "VIADD", "PLOP3", "IABS", "FLO", "BREV", "MOV",
       "IMNMX", "VIMNMX", "LOP", "SHL", "SHR", "BMSK"}
FMA = {"IMAD", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "IDP", "IMUL", "FCHK"}
_BRA = re.compile(r"BRA (?:\S+ )?0x([0-9a-f]+)")


def build(head_dim: int, raw: bool, out: str, group: int = 4, warps: int = 8, ctas: int = 1, extra=None) -> dict:
    d = dict(HEAD_DIM=head_dim, QUERY_GROUP=group, PAGE=64, WARPS=warps, STAGES=2, MIN_CTAS_PER_SM=ctas,
             GAAC_SASS_TILE_ONLY=2 if raw else 1) | dict(extra or {})
    cmd = ["nvcc", "-cubin", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v",
           f"-I{REPO}/kernels/cuda/include", f"-I{REPO}/kernels/cuda", *[f"-D{k}={v}" for k, v in d.items()],
           str(SRC), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return ptxas_report(r.stdout + r.stderr)


def loop_ops(cubin: str) -> collections.Counter:
    sass = subprocess.run([tool("cuobjdump"), "-sass", "-fun", "gaac_v4_decode_split", cubin], capture_output=True,
                          text=True, check=True).stdout
    rows = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+([^;]*);", sass)
    addr = [int(a, 16) for a, _ in rows]
    ins = [t for _, t in rows]
    w = next(i for i, t in enumerate(ins) if "TRYWAIT" in t)
    end = next(i for i, t in enumerate(ins) if i > w and (m := _BRA.search(t)) and int(m.group(1), 16) <= addr[w]
               and "DIV" not in t)
    start = addr.index(int(_BRA.search(ins[end]).group(1), 16))
    return collections.Counter(re.sub(r"^@!?U?P[0-9T] ", "", t).split()[0].split(".")[0] for t in ins[start: end + 1])


def measure(head_dim: int, raw: bool, tmp: str, extra=None) -> dict:
    """Counts of the loop body; ``extra``: more defines (e.g. the planner's CONST_REGS)."""
    cubin = str(Path(tmp) / f"v4_{head_dim}_{int(raw)}.cubin")
    rep = build(head_dim, raw, cubin, extra=extra)
    ops = loop_ops(cubin)
    n = sum(ops.values())
    return dict(head_dim=head_dim, raw=raw, instructions=n, int_pipe=sum(v for k, v in ops.items() if k in INT),
                fma_pipe=sum(v for k, v in ops.items() if k in FMA), hmma=ops["HMMA"], lds=ops["LDS"],
                registers=rep["gaac_v4_decode_split"]["registers"], top=dict(ops.most_common(12)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for d in a.head_dim:
            for raw in (False, True):
                r = measure(d, raw, tmp)
                rows.append(r)
                print(f"d={d} {'raw' if raw else 'fast'}: {r['instructions']} instructions per warp-tile (INT {r['int_pipe']}, "
                      f"FMA {r['fma_pipe']}, HMMA {r['hmma']}, LDS {r['lds']}), {r['registers']} registers")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
