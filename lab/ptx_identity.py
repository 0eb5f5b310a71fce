"""Is the BF16 device code unchanged by a change of the CUDA sources? nvcc -ptx (sm_90a) of the fused v3 kernel
(decode_attention_v3.cu at the planner's defines for the tuned shapes, and two register-table shapes) and of
gaac_v3/kernels.cu (head_dim 16-256, and the GAAC_V3_COUNT build), at two revisions, compared byte for byte.

    python lab/ptx_identity.py BASE_REV [REV]        (REV default: the working tree)

Prints SAME / DIFF per build and, for a DIFF, which kernels (.entry) differ. Needs nvcc, no GPU. The PTX
of a build holds no paths (no -lineinfo), so trees in different folders compare equal when the code is.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NVCC = ["nvcc", "-ptx", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3"]


def fused_defines() -> dict[str, dict]:
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda import attention as A
    from gaac_hf.kernels.cuda import fused_attention as F

    A._sm_count = lambda device: 132
    out = {}
    for d, g in [(64, 3), (128, 4), (256, 4), (128, 16)]:  # tests/test_cuda_build.py FUSED_CONFIGS
        out[f"fused_d{d}g{g}"] = F.plan(8 if d < 256 else 1, 1, g, 64, d, 32768 + 64, None, LaunchConfig())["defines"]
    for d, pseg, kinds in [(128, 1, 2), (256, 2, 2)]:  # test_fused_register_table_matches_ptxas shapes
        threads = F.threads_of(d, F.DEFAULT_WARPS, pseg, kinds)
        per_sm = max(p for p in (1, 2, 3, 4) if 65536 // (threads * p) >= F.regs_needed(d, 4, pseg, kinds))
        out[f"fused_d{d}p{pseg}k{kinds}"] = dict(
            HEAD_DIM=d, QUERY_GROUP=4, PAGE=64, WARPS=F.DEFAULT_WARPS, PROD_SEGS=pseg, KIND_SPLIT=int(kinds == 1),
            STAGES=F.default_stages(d, F.DEFAULT_WARPS, pseg, kinds), MIN_CTAS_PER_SM=per_sm)
    return out


def builds() -> dict[str, tuple[str, dict]]:
    b = {name: ("decode_attention_v3.cu", d) for name, d in fused_defines().items()}
    for d in (16, 64, 80, 96, 112, 128, 256):
        b[f"v3_d{d}"] = ("gaac_v3/kernels.cu", dict(BLOCK_T=64, HEAD_DIM=d))
    b["v3count_d128"] = ("gaac_v3/kernels.cu", dict(BLOCK_T=64, HEAD_DIM=128, GAAC_V3_COUNT=1, GAAC_V3_COUNT_STEPS=2))
    return b


def tree(rev: str | None, dest: Path) -> Path:
    if rev is None:
        return REPO / "kernels" / "cuda"
    dest.mkdir(parents=True)
    arch = subprocess.run(["git", "-C", str(REPO), "archive", rev, "kernels/cuda"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest / "kernels" / "cuda"


def ptx(cuda_dir: Path, source: str, defines: dict, out: Path) -> str:
    src = cuda_dir / source
    cmd = NVCC + [f"-I{cuda_dir / 'include'}", f"-I{src.parent}", *[f"-D{k}={v}" for k, v in defines.items()], str(src), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_text()


def entries(text: str) -> dict[str, str]:
    parts = re.split(r"(?=^\.visible \.entry )", text, flags=re.M)
    return {"header": parts[0]} | {re.match(r"\.visible \.entry (\w+)", p).group(1): p for p in parts[1:]}


def main() -> int:
    base, rev = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        a_dir, b_dir = tree(base, t / "a"), tree(rev, t / "b")
        same = True
        for name, (source, defines) in builds().items():
            pa, pb = ptx(a_dir, source, defines, t / "a.ptx"), ptx(b_dir, source, defines, t / "b.ptx")
            if pa == pb:
                print(f"SAME {name}")
                continue
            same = False
            ea, eb = entries(pa), entries(pb)
            print(f"DIFF {name}: " + ", ".join(k for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
