"""Static SASS count of one compressed warp-tile of regtile.cu (CPU only: nvcc + Triton's cuobjdump).

    python lab/experiments/regtile/sass_count.py [-DWIDE_FIX=0 ...]

Builds with SASS_FAST_ONLY (only the compressed-tile body in the loop), takes the instructions between the
loop's mbarrier wait and the next, and counts them by pipe: on sm_90 the INT pipe (LOP3, SHF, PRMT, IADD3,
ISETP, SEL, LEA, POPC, ...) takes 16 lanes per cycle per scheduler, so a warp instruction there costs two
issue cycles, IMAD / FFMA / FMUL run on the FMA pipes.
"""
import collections, glob, re, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CUOBJDUMP = (glob.glob(str(Path(sys.prefix) / "lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump")) or ["cuobjdump"])[0]
INT = {"LOP3", "SHF", "PRMT", "IADD3", "ISETP", "SEL", "LEA", "POPC", "VIADD", "PLOP3", "IABS", "FLO", "BREV", "MOV", "IMNMX", "VIMNMX", "LOP", "SHL", "SHR"}
FMA = {"IMAD", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "IDP", "IMUL", "FCHK"}


def main(extra):
    d = dict(HEAD_DIM=128, QUERY_GROUP=4, WARPS=4, STAGES=2, MIN_CTAS_PER_SM=3, SASS_FAST_ONLY=1)
    cmd = ["nvcc", "-cubin", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v",
           f"-I{REPO}/kernels/cuda/include", f"-I{REPO}/kernels/cuda", *[f"-D{k}={v}" for k, v in d.items()], *extra,
           str(HERE / "regtile.cu"), "-o", "/tmp/regtile_count.cubin"]
    log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    sass = subprocess.run([CUOBJDUMP, "-sass", "-fun", "regtile_decode_split", "/tmp/regtile_count.cubin"],
                          capture_output=True, text=True, check=True).stdout
    rows = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+([^;]*);", sass)
    addr = [int(a, 16) for a, _ in rows]
    ins = [t for _, t in rows]
    w = next(i for i, t in enumerate(ins) if "TRYWAIT" in t)
    # the loop: the backward branch after the wait that jumps to at or before it
    end = next(i for i, t in enumerate(ins) if i > w and (m := re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", t))
               and int(m.group(1), 16) <= addr[w] and "DIV" not in t)
    start = addr.index(int(re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", ins[end]).group(1), 16))
    body = ins[start: end + 1]
    ops = collections.Counter(re.sub(r"^@!?U?P[0-9T] ", "", t).split()[0].split(".")[0] for t in body)
    n_int = sum(v for k, v in ops.items() if k in INT)
    n_fma = sum(v for k, v in ops.items() if k in FMA)
    print(f"{' '.join(extra) or 'default'}: regs {regs}, body {len(body)} instrs, INT pipe {n_int} (= {2 * n_int} issue "
          f"cycles), FMA pipe {n_fma}, HMMA {ops['HMMA']}, LDS {ops['LDS']}, BRA {ops['BRA']}")
    print("  ", ", ".join(f"{k} {v}" for k, v in ops.most_common(18)))


if __name__ == "__main__":
    main(sys.argv[1:])
