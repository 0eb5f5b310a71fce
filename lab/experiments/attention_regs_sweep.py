"""Occupancy sweep of the product split kernel: num_warps x sub-tile x maxnreg x programs/SM.

    python eval/experiments/attention_regs_sweep.py [--budget-s 300]   # GPU; JSON to $OUT/regs_sweep.json

Why: compiled for sm_90 offline, the GAAC kernel takes 214-255 registers at every tile size and warp
count (ptxas uses what it is given), i.e. 1-2 CTAs (8 warps) per SM, too few to hide load latency.
maxnreg caps it (some local-memory spill). Qwen3-8B shape, B=1 64K, then the best configs at 128K and
B=4 64K. GAAC rows are checked bit for bit against the BF16 kernel at the same config.
"""
import argparse, json, os, sys, time
import torch, triton
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import bench_attention as BA


def bench(f):
    return triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--gaac", default="", help="configs 'warps,ts,maxnreg;...' (maxnreg 0 = none) instead of the grid")
    ap.add_argument("--bf16", default="", help="same for the BF16 kernel")
    ap.add_argument("--pps", default="2,4,8")
    ap.add_argument("--first-only", action="store_true", help="only the 64K B=1 case")
    args = ap.parse_args()
    t0 = time.time()
    rows, baselines, best = [], {}, {}
    cases = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536)]
    def parse(kind, spec):
        out = []
        for c in filter(None, spec.split(";")):
            w, ts, mr = (int(x) for x in c.split(","))
            out.append((kind, w, ts, mr or None))
        return out
    if args.first_only:
        cases = cases[:1]
    for ci, (shape, B, S) in enumerate(cases):
        case = BA.Case(shape, B, S, "cuda", seed=0)
        nbytes, bf16_bytes = case.nbytes()
        base = dict(fa2=BA.run_sdpa(case, "fa2", False)[0], cudnn=BA.run_sdpa(case, "cudnn", False)[0])
        baselines[f"{shape}/{B}/{S}"] = dict(base, gaac_bytes=nbytes, bf16_bytes=bf16_bytes)
        print(shape, B, S, {k: round(v, 1) for k, v in base.items()}, flush=True)
        if ci == 0:
            confs = [("gaac", w, ts, mr) for w in (4, 8) for ts in (16, 32) for mr in (None, 168, 128, 96)]
            confs += [("bf16", w, ts, mr) for w in (4, 8) for ts in (32, 64) for mr in (None, 128, 96, 80)]
            if args.gaac or args.bf16:
                confs = parse("gaac", args.gaac) + parse("bf16", args.bf16)
            pps_list = tuple(int(x) for x in args.pps.split(","))
        else:
            confs = best["gaac"] + best["bf16"]
            pps_list = (2, 4, 8)
        for kind, w, ts, mr in confs:
            for pps in pps_list:
                if time.time() - t0 > args.budget_s:
                    break
                fn = case.gaac(w, pps, ts, 1, mr) if kind == "gaac" else case.bf16(w, pps, ts, 1, mr)
                case.out.fill_(float("nan"))
                try:
                    o = fn().clone()
                    torch.cuda.synchronize()
                    us = bench(fn)
                    from gaac_hf.kernels.triton.attention import LAST_LAUNCH
                    info = dict(LAST_LAUNCH)
                except Exception as e:
                    print("FAIL", kind, w, ts, mr, pps, type(e).__name__, str(e)[:200], flush=True)
                    continue
                same = None
                if kind == "gaac":
                    ob = case.bf16(w, pps, ts, 1, mr)().clone()
                    same = bool(torch.equal(o.view(torch.int16), ob.view(torch.int16)))
                row = dict(shape=shape, batch=B, context=S, kind=kind, warps=w, ts=ts, maxnreg=mr, pps=pps, us=us,
                           nan=bool(o.isnan().any()), bit_identical_to_bf16_same_config=same,
                           vs_cudnn=base["cudnn"] / us, tbps=(nbytes if kind == "gaac" else bf16_bytes) / us / 1e6, **info)
                rows.append(row)
                print(f"{kind:5s} w{w} ts{ts} maxnreg {mr} pps{pps} S{info.get('splits')} {us:8.1f} us x{row['vs_cudnn']:.3f} cuDNN "
                      f"regs {info.get('n_regs')} spills {info.get('n_spills')} bits={same}", flush=True)
        if ci == 0:
            for kind in ("gaac", "bf16"):
                rk = sorted([r for r in rows if r["kind"] == kind and not r["nan"]], key=lambda r: r["us"])
                seen, top = set(), []
                for r in rk:
                    c = (kind, r["warps"], r["ts"], r["maxnreg"])
                    if c not in seen:
                        seen.add(c)
                        top.append(c)
                best[kind] = top[:2]
            print("best", best, flush=True)
    out = dict(gpu=torch.cuda.get_device_name(), versions=dict(torch=torch.__version__, triton=triton.__version__),
               command="python " + " ".join(sys.argv), baselines_us=baselines, rows=rows, elapsed_s=time.time() - t0)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "regs_sweep.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
