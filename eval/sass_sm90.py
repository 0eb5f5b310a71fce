"""Compile the GAAC Triton kernels for sm_90 on any machine (no GPU) and count what they issue.

    python eval/sass_sm90.py --out eval/results/sass_sm90.json

Uses Triton's bundled ptxas / cuobjdump (``triton.compile`` with a ``GPUTarget("cuda", 90, 32)``):
registers, spilled bytes (stack), shared memory and the SASS instruction mix of

* the standalone decoder (fast pair decoder and the reference-semantics one) and the group encoder,
  which are loop-free (one program = one block, sub-tiles unrolled): static count = instructions each
  warp issues, so ``warp_instr_per_value = count * warps / (T * D)`` and the INT-pipe share of it
  (LOP3/SHF/IADD3/PRMT/SEL/ISETP/...: 16 lanes per H100/H200 sub-partition, half the issue rate of
  the FMA pipe that runs IMAD/FFMA);
* the fused attention kernel (GAAC and BF16 modes, product config) for registers and barriers.

Why: the ceiling of a decoder that is issue-bound is ``issue rate / instructions per value``; with
the H200's 132 SMs x 4 schedulers x 1.98 GHz this turns the counts into GB/s bounds, no device time.
The triton here may differ from the GPU image's (3.6): register counts move by a few percent.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gaac_hf.format import BlockGeometry  # noqa: E402
from gaac_hf.kernels.triton import attention as A  # noqa: E402
from gaac_hf.kernels.triton import decode as Dm  # noqa: E402
from gaac_hf.kernels.triton import encode as E  # noqa: E402
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

INT_PIPE = ("LOP3", "SHF", "IADD3", "PRMT", "SEL", "ISETP", "IABS", "POPC", "FLO", "BREV", "LEA", "VIADD", "IMNMX", "BMSK", "SGXT")
#: H200 (SXM) issue model used for the bounds: SMs, schedulers per SM, clock (GHz)
SMS, SCHED, GHZ = 132, 4, 1.98


def _bin(name):
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile90(fn, sig, consts, num_warps, num_stages=1):
    full = dict(sig)
    full.update({k: "constexpr" for k in consts})
    # pointers 16-byte aligned, as a real launch specializes them (torch allocations): without it the
    # compiler cannot vectorize global loads/stores and the counts overstate memory instructions
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v.startswith("*")}
    src = ASTSource(fn, signature=full, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))


def inspect(k):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
        path = f.name
    try:
        sass = subprocess.run([_bin("cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
        res = subprocess.run([_bin("cuobjdump"), "-res-usage", path], capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    regs, stack, shared = (int(x) for x in m.groups()) if m else (None, None, None)
    return dict(regs=regs, stack_bytes=stack, shared_bytes=k.metadata.shared, sass_total=sum(ops.values()),
                int_pipe=sum(ops[o] for o in INT_PIPE), imad=ops["IMAD"], barriers=ops["BAR"],
                ops=dict(ops.most_common()))


def per_value(info, warps, values):
    w = info["sass_total"] * warps / values
    wi = info["int_pipe"] * warps / values
    issue_bound = SMS * SCHED * GHZ * 1e9 / w  # values/s if issue-bound
    int_bound = SMS * SCHED * 0.5 * GHZ * 1e9 / wi  # INT pipe: half a warp-instruction per cycle
    return dict(warp_instr_per_value=w, int_warp_instr_per_value=wi,
                bound_gbps_bf16=min(issue_bound, int_bound) * 2 / 1e9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="eval/results/sass_sm90.json")
    args = p.parse_args()
    rows = []
    dsig = dict(SLOTS="*u8", HEAP="*u8", ESC_START="*i64", heap_len="i64", B8="*u8", B16="*u8", OUT="*i16", ROWOFF="*i16",
                base_stride="i32")
    pool = lambda i: {f"SLOTS{i}": "*u8", f"HEAP{i}": "*u8", f"ESC_START{i}": "*i64", f"RAW{i}": "*i16",  # noqa: E731
                      f"TABLE{i}": "*i32", f"B8_{i}": "*u8", f"B16_{i}": "*u8", f"TAIL{i}": "*i16"}
    tsig = dict(**pool(0), **pool(1), OUT="*i16", ROWOFF="*i16", H="i32", MAXB="i32", S="i32", NB="i32", TAIL_LEN="i32",
                tail_sb="i64", tail_sh="i64", tail_st="i64", kind_stride="i64")
    esig = dict(X="*i16", B8="*u8", B16="*u8", SLOTS="*u8", ESC="*u8", ESC_LEN="*i32", FITS="*i8", TAGS="*i32", base_stride="i32")
    for d in (64, 128, 256):
        g = BlockGeometry(64, d, "channel")
        geo = dict(SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset, T=64, D=d)
        ts = 16 if d <= 64 else 8  # decode_blocks_triton's launch defaults
        for fast in (True, False):
            w = max(2, d // 64) if fast else max(4, 64 * d // 1024)
            info = inspect(compile90(Dm._decode_kernel, dsig, dict(geo, FAST=fast, TS=ts if fast else 64), w))
            rows.append(dict(kernel="decode_fast" if fast else "decode", head_dim=d, num_warps=w, **info,
                             **per_value(info, w, 64 * d)))
        # decode_tables_triton: the same fast block decode behind a table lookup, plus the raw-copy
        # and tail branches (static counts include them: the per-value figures are upper bounds)
        w = max(2, d // 64)
        info = inspect(compile90(Dm._table_decode_kernel, tsig, dict(geo, TS=ts), w))
        rows.append(dict(kernel="decode_tables", head_dim=d, num_warps=w, **info, **per_value(info, w, 64 * d)))
        lim = g.escape_limit
        cons = dict(geo, CAP=lim, CAP_P2=max(16, triton.next_power_of_2(lim)), LIMIT=lim, ZERO_FILL=False, TS=32, WRITE_TAGS=False)
        info = inspect(compile90(E._encode_groups_kernel, esig, cons, 4))
        rows.append(dict(kernel="encode_groups", head_dim=d, num_warps=4, **info, **per_value(info, 4, 64 * d)))
    asig = dict(Qb="*i16", K_SLOTS="*u8", V_SLOTS="*u8", K_HEAP="*u8", V_HEAP="*u8", K_ESC_START="*i64", V_ESC_START="*i64",
                K_RAW="*i16", V_RAW="*i16", K_TABLE="*i32", V_TABLE="*i32", K_TAIL="*i16", V_TAIL="*i16", KB8="*u8",
                KB16="*u8", VB8="*u8", VB16="*u8", NUM_BLOCKS="*i32", TAIL_LEN="*i32", KV_START="*i32",
                PART_O="*fp32", PART_L="*fp32", ROWOFF="*i16", scale_log2="fp32", MAXB="i32", BPS="i32", S="i32")
    g = BlockGeometry(64, 128, "channel")
    for mode, ts in ((0, 32), (1, 64)):
        cons = dict(HKV=8, GQ=4, QP=16, SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
                    TAG_OFF=g.tag_offset, T=64, D=128, KV_MODE=mode, HAS_START=False, FP32_DOT=False, TS=ts)
        info = inspect(compile90(A._attn_split_kernel, asig, cons, 4))
        rows.append(dict(kernel="attention_gaac" if mode == 0 else "attention_bf16", head_dim=128, num_warps=4,
                         tile_tokens=ts, shape="qwen3-8b (32 q / 8 kv)", **info))
    out = dict(target="sm_90 (compiled on a CPU machine)", triton=triton.__version__,
               command="python " + " ".join(sys.argv), issue_model=dict(sms=SMS, schedulers=SCHED, ghz=GHZ,
               int_pipe_ops=INT_PIPE, note="bound_gbps_bf16: BF16 bytes/s if the kernel were issue-bound (all "
               "instructions, 1/cycle/scheduler) or INT-pipe-bound (0.5/cycle/scheduler), whichever is lower; "
               "static counts include branches not taken (the raw-group path), so bounds are conservative"),
               rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    harness.write_result(args.out, out)
    for r in rows:
        extra = (f" warp-instr/value {r['warp_instr_per_value']:.3f} (INT {r['int_warp_instr_per_value']:.3f})"
                 f" bound {r['bound_gbps_bf16']:.0f} GB/s") if "bound_gbps_bf16" in r else ""
        print(f"{r['kernel']:15s} d={r['head_dim']:3d} w{r['num_warps']:2d} regs {r['regs']:3d} stack {r['stack_bytes']:3d}"
              f" sass {r['sass_total']:5d} BAR {r['barriers']:3d}{extra}")


if __name__ == "__main__":
    main()
