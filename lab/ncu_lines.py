"""Join Nsight Compute's per-SASS-address counts with nvdisasm's line table (lab only; call L3).

    python lab/ncu_lines.py src_probe0.csv.gz kernel.sass.gz [N]

src CSV: ``ncu --page source --csv --print-source sass`` (Address, Source, Instructions Executed, stall
samples); sass: ``nvdisasm --print-line-info -c`` of the same cubin (``GAAC_CUDA_LINEINFO=1``). Prints warp-
instructions executed per source line (innermost line, and the line of decode_attention_v3.cu it was
inlined into) and per function of the kernel source, with the stall samples beside them.
"""
import collections
import csv
import gzip
import io
import re
import sys


def _open(p):
    return io.TextIOWrapper(gzip.open(p), encoding="utf-8", errors="replace") if p.endswith(".gz") else open(p)


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def ncu_rows(path):
    rows = list(csv.reader(_open(path)))
    h = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    hdr = rows[h]
    col = {c: i for i, c in enumerate(hdr)}
    samp = next(c for c in hdr if "Sampling (All" in c)
    out = []
    for r in rows[h + 1:]:
        if len(r) != len(hdr):
            continue
        out.append((int(r[col["Address"]], 16), r[col["Source"]], num(r[col["Instructions Executed"]]), num(r[col[samp]])))
    return out


def line_table(path, shift):
    """offset -> chain of (file, line), innermost first. NVRTC names the program's own text (the
    ``#define`` lines, then the kernel source) ``runtime...cu``: its lines map to the kernel source
    ``shift`` lines up."""
    table, chain = {}, []
    for ln in _open(path):
        if "//##" in ln and "File" in ln:
            chain = []
            for m in re.finditer(r'File "([^"]+)", line (\d+)', ln):
                f, line = m.group(1).split("/")[-1], int(m.group(2))
                if f.startswith("runtime"):
                    f, line = "decode_attention_v3.cu", line - shift
                chain.append((f, line))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", ln)
        if m:
            table[int(m.group(1), 16)] = list(chain)
    return table


def main():
    src, sass = sys.argv[1], sys.argv[2]
    n_top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    shift = int(sys.argv[4]) if len(sys.argv) > 4 else 11  # -D defines NVRTC saw before the source
    rows = ncu_rows(src)
    base = min(a for a, *_ in rows)
    lt = line_table(sass, shift)
    kern = open("kernels/cuda/decode_attention_v3.cu").read().split("\n")
    funcs = []  # (line, name) of every function / lambda / loop head in the kernel source
    for i, t in enumerate(kern, 1):
        m = re.match(r"__device__ __forceinline__ \w+ (\w+)\(", t) or re.match(r"\s*auto (\w+) = \[&\]", t)
        if m:
            funcs.append((i, m.group(1)))
        elif "for (int it = 0; it < n_tiles; ++it)" in t:
            funcs.append((i, f"tile loop @{i}"))
        elif "gaac_v3_decode_split(" in t:
            funcs.append((i, "kernel body"))

    def func_of(line):
        best = "?"
        for l, name in funcs:
            if l <= line:
                best = name
        return best

    tot = sum(e for _, _, e, _ in rows)
    tot_s = sum(s for *_, s in rows) or 1
    by_line, by_func, by_op = collections.Counter(), collections.Counter(), collections.Counter()
    samp_func = collections.Counter()
    for a, text, e, s in rows:
        ch = lt.get(a - base, [])
        inner = ch[0] if ch else ("?", 0)
        outer_k = next((fl for fl in reversed(ch) if fl[0] == "decode_attention_v3.cu"), None)
        inner_k = next((fl for fl in ch if fl[0] == "decode_attention_v3.cu"), None)
        by_line[(inner, outer_k)] += e
        key = func_of(inner_k[1]) if inner_k else inner[0]
        by_func[key] += e
        samp_func[key] += s
        by_op[text.split()[0] if text.split() else "?"] += e
    print(f"warp-instructions executed: {tot / 1e6:.2f}M ({len(rows)} SASS addresses, {len(lt)} with lines)")
    print("\nper function of decode_attention_v3.cu (innermost kernel-source frame):")
    for k, v in by_func.most_common():
        print(f"  {v / 1e6:7.2f}M {100 * v / tot:5.1f}%  samples {100 * samp_func[k] / tot_s:5.1f}%  {k}")
    print("\nper opcode:", ", ".join(f"{k} {100 * v / tot:.1f}%" for k, v in by_op.most_common(16)))
    print(f"\ntop {n_top} source lines (innermost, inlined into):")
    print("\nkernel-source lines (outermost frame in decode_attention_v3.cu) of the mbarrier waits (ptx.cuh mbar_wait):")
    waits = collections.Counter()
    for a, text, e, s in rows:
        ch = lt.get(a - base, [])
        if ch and ch[0][0] == "ptx.cuh" and 48 <= ch[0][1] <= 56:
            outer_k = next((fl for fl in reversed(ch) if fl[0] == "decode_attention_v3.cu"), ("?", 0))
            waits[outer_k[1]] += e
    for l, v in waits.most_common(8):
        print(f"  {v / 1e6:6.2f}M line {l}: {kern[l - 1].strip()[:90] if l else ''}")
    for ((f, l), ok), v in by_line.most_common(n_top):
        text = kern[l - 1].strip()[:70] if f == "decode_attention_v3.cu" else ""
        print(f"  {v / 1e6:6.2f}M {f}:{l} <- {ok[1] if ok else '-'}  {text}")


if __name__ == "__main__":
    main()
