"""Where one fused v4 call's time goes (lab only): the kernel built with GAAC_STAMPS=1 (kernels/cuda/include/gaac/
stamps.cuh) prints, per CTA, %globaltimer and clock64 at its phase points; this script launches it after an L2 flush,
reads the lines of each launch and reports the phases; then the same for its BF16 twin (decode_attention.cu, the
same launch), whose points 1 (Q loaded, first copies issued; it builds no constants) to 6 mean the same.

    python lab/experiments/v4_stamps.py --out $OUT/stamps.json --cases gemma3:1:16384 qwen3-8b:1:65536 [--launches 5]

Points (thread 0 of each CTA): 0 entry, 1 prologue done (barriers, first copies issued, Q, constants, barrier), 7 the
final arrival won (the last CTA only; 5 or 4 -> 7 is its arrival, 7 -> 6 the final merge itself),
2 first tile staged, 3 tile loop done, 4 the CTA's partial written, 5 its chunk merged (two-level merges only),
6 the final merge done (the last CTA only). Phases are clock64 cycles of the CTA's own SM, converted to ns with the
clock rate the launch itself shows (globaltimer ns / clock cycles over all CTAs); the call's span is globaltimer:
first entry to the final merge's end.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))
import harness  # noqa: E402
from bench_attention_v4 import Case, parse_cases  # noqa: E402
from forced_defines import force_defines  # noqa: E402

from gaac_hf.kernels.cuda import fused_attention_v4 as F4  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--cases", nargs="+", required=True)
ap.add_argument("--launches", type=int, default=5)
ap.add_argument("--define", nargs="*", default=[], help="more forced defines, NAME=V")
ap.add_argument("--per-cta", action="store_true",
                help="also list every CTA's phases with the BF16-stored K / V blocks of its split (which splits are slow)")
args = ap.parse_args()

forced = {"GAAC_STAMPS": 1} | {kv.split("=")[0]: int(kv.split("=")[1]) for kv in args.define}
force_defines(F4, forced)
from gaac_hf.kernels.cuda import attention as A  # noqa: E402  (the BF16 twin: the same stamps, points 0-6)

force_defines(A, {"GAAC_STAMPS": 1})


def captured(fn) -> list[str]:
    """Run fn with the process's stdout (where device printf lands at the sync) sent to a file; its lines."""
    sys.stdout.flush()
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            fn()
            torch.cuda.synchronize()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return [ln for ln in f.read().splitlines() if ln.startswith("GAAC_STAMP ")]


def phases(lines: list[str]) -> dict:
    rows = []
    for ln in lines:
        v = [int(x) for x in ln.split()[1:]]
        rows.append(dict(cta=v[:3], last=v[3], ns=v[4:12], clk=v[12:20]))
    t0 = min(r["ns"][0] for r in rows)
    end = max(max(r["ns"]) for r in rows)
    # clock rate of this launch: per CTA, (last stamp - entry) in ns over cycles; the median CTA
    rates = [(max(r["ns"]) - r["ns"][0]) / max(1, max(r["clk"]) - r["clk"][0]) for r in rows
             if max(r["clk"]) > r["clk"][0]]
    ns_per_clk = statistics.median(rates)

    def span(r, a, b):
        return (r["clk"][b] - r["clk"][a]) * ns_per_clk if r["clk"][a] and r["clk"][b] else None

    def summary(vals):
        vals = [x for x in vals if x is not None]
        return dict(median=statistics.median(vals), max=max(vals), min=min(vals), n=len(vals)) if vals else None

    names = {"prologue": (0, 1), "first_tile_wait": (1, 2), "tile_loop": (2, 3), "partial_write": (3, 4),
             "chunk_merge": (4, 5), "final_merge": (5, 6)}
    out = dict(ctas=len(rows), span_us=(end - t0) / 1e3, ns_per_clk=ns_per_clk,
               entry_skew_us=(max(r["ns"][0] for r in rows) - t0) / 1e3,
               phases_us={k: summary([(span(r, a, b) or 0) / 1e3 if span(r, a, b) is not None else None
                                      for r in rows]) for k, (a, b) in names.items()})
    fin = [r for r in rows if r["last"] == 2]
    if fin:
        r = fin[0]
        out["final_cta"] = dict(cta=r["cta"], entry_after_first_us=(r["ns"][0] - t0) / 1e3,
                                chain_us={k: (span(r, a, b) or 0) / 1e3 for k, (a, b) in names.items()
                                          if span(r, a, b) is not None or (a, b) == (5, 6)})
        # the final merge after a one-level arrival: from point 4
        if not r["clk"][5] and r["clk"][6]:
            out["final_cta"]["chain_us"]["final_merge"] = (r["clk"][6] - r["clk"][4]) * ns_per_clk / 1e3
        if r["clk"][7] and r["clk"][6]:  # point 7: the final arrival won (builds after call Y14)
            out["final_cta"]["final_split_us"] = dict(
                arrival=(r["clk"][7] - (r["clk"][5] or r["clk"][4])) * ns_per_clk / 1e3,
                merge=(r["clk"][6] - r["clk"][7]) * ns_per_clk / 1e3)
        out["final_cta"]["end_us"] = (r["ns"][6] - t0) / 1e3 if r["ns"][6] else None
    last_partial = max(r["ns"][4] for r in rows if r["ns"][4])
    out["last_partial_written_us"] = (last_partial - t0) / 1e3
    out["last_loop_done_us"] = (max(r["ns"][3] for r in rows if r["ns"][3]) - t0) / 1e3
    out["first_tile_staged_us"] = summary([(r["ns"][2] - t0) / 1e3 for r in rows if r["ns"][2]])
    if args.per_cta:
        out["per_cta"] = [dict(cta=r["cta"], code=r["last"], entry_us=(r["ns"][0] - t0) / 1e3,
                               **{k: (span(r, a, b) or 0) / 1e3 for k, (a, b) in names.items() if b < 5})
                          for r in rows]
    return out


def split_kinds(case, S: int) -> list[tuple[int, int]] | None:
    """Per split of sequence 0, kv head 0: (K blocks stored BF16, V blocks stored BF16) among the blocks it covers."""
    if not case.v4:
        return None
    kv, T = case.kv, 64
    maxb = kv.k.table.shape[2]
    p = F4.plan(case.B, case.hkv, case.hq // case.hkv, T, case.d, min(int(kv.active_blocks or maxb), maxb) * T + T,
                torch.device("cuda"), F4.LaunchConfig())
    tps, nb = p["tokens_per_split"], S // T
    kraw = (kv.k.table[0, 0, :nb] & 1).tolist()
    vraw = (kv.v.table[0, 0, :nb] & 1).tolist()
    out = []
    for x in range(p["splits"]):
        blks = range(x * tps // T, min(nb, -(-(x + 1) * tps // T)))
        out.append((sum(kraw[i] for i in blks), sum(vraw[i] for i in blks)))
    return out


results = []
buf = harness.flush_buffer(torch.device("cuda"))
for shape, B, S in parse_cases(args.cases):
    case = Case(shape, B, S, torch.device("cuda"))
    for kernel, f in (("gaac", case.gaac()), ("twin", case.cuda(case.twin_config()))):
        captured(f)  # compile, warm
        launches = []
        for _ in range(args.launches):
            buf.zero_()
            torch.cuda.synchronize()
            launches.append(phases(captured(f)))
        spans = [x["span_us"] for x in launches]
        med = launches[sorted(range(len(spans)), key=lambda i: spans[i])[len(spans) // 2]]
        results.append(dict(shape=shape, batch=B, context=S, kernel=kernel, median_launch=med, spans_us=spans))
        ph = med["phases_us"]
        print(f"{shape} B={B} {S} {kernel}: span {med['span_us']:.1f} us (launches "
              f"{', '.join(f'{s:.1f}' for s in spans)}), entry skew {med['entry_skew_us']:.1f}, first tile staged at "
              f"median {med['first_tile_staged_us']['median']:.1f}", flush=True)
        print("   per-CTA phases, median / max us: " + "; ".join(
            f"{k} {v['median']:.2f}/{v['max']:.2f}" for k, v in ph.items() if v), flush=True)
        if args.per_cta and kernel == "gaac":
            kinds = split_kinds(case, S)
            rows_ = [c for c in med["per_cta"] if c["cta"][1] == 0 and c["cta"][2] == 0]
            for c in rows_:
                c["bf16_blocks_kv"] = kinds[c["cta"][0]] if kinds and c["cta"][0] < len(kinds) else None
            mixed = [c["tile_loop"] for c in rows_ if c["bf16_blocks_kv"] and sum(c["bf16_blocks_kv"])]
            plain = [c["tile_loop"] for c in rows_ if c["bf16_blocks_kv"] and not sum(c["bf16_blocks_kv"])]
            print(f"   tile_loop (warp 0) of splits with a BF16 block: n={len(mixed)} median "
                  f"{statistics.median(mixed) if mixed else float('nan'):.2f}; without: n={len(plain)} median "
                  f"{statistics.median(plain) if plain else float('nan'):.2f}", flush=True)
            for c in sorted(rows_, key=lambda c: -c["tile_loop"])[:6]:
                print(f"   slow split {c['cta'][0]}: tile_loop {c['tile_loop']:.2f} prologue {c['prologue']:.2f} "
                      f"first_tile_wait {c['first_tile_wait']:.2f} partial_write {c['partial_write']:.2f} "
                      f"bf16 K/V blocks {c['bf16_blocks_kv']}", flush=True)
        if "final_cta" in med:
            fc = med["final_cta"]
            print(f"   final CTA: entry +{fc['entry_after_first_us']:.1f}, chain "
                  + ", ".join(f"{k} {v:.2f}" for k, v in fc["chain_us"].items()) + f", end {fc['end_us']}", flush=True)
            if "final_split_us" in fc:
                print(f"   final merge = arrival {fc['final_split_us']['arrival']:.2f} + merge "
                      f"{fc['final_split_us']['merge']:.2f} us", flush=True)
    del case
    torch.cuda.empty_cache()
commit = os.environ.get("GAAC_COMMIT") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                                         cwd=REPO).stdout.strip()
Path(args.out).write_text(json.dumps(dict(commit=commit, command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                                          versions=dict(torch=torch.__version__), forced=forced, rows=results),
                                     indent=1))
print("wrote", args.out)
