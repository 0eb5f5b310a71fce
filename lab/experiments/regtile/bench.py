"""Register tiles on the H200: decode check, bit identity with the BF16 twin, and speed vs cuDNN / FA2 / the
BF16 twin / the fused v3 kernel, all in one process (lab prototype; see format.py).

    python lab/experiments/regtile/bench.py --out $OUT/regtile.json [--cases qwen3-8b:1:65536,...]

Prints the checks first (a failing check is reported, then the timings still run), writes the JSON after
every case.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "eval"))
import format as F  # noqa: E402  (the layout under test; main() switches it to format4 with --fmt 4)
import format4 as F4  # noqa: E402
import format4i as F4i  # noqa: E402
import harness  # noqa: E402

from gaac_hf.kernels.cuda import runtime  # noqa: E402

_inc = runtime._include_dirs
runtime._include_dirs = lambda source: _inc(source) + [str(runtime.HERE)]  # lab: core.cuh as gaac_v3/core.cuh
SOURCE = str(HERE / "regtile.cu")
LOG2E = 1.4426950408889634
WAVES = 1


# the runtime's cache key hashes the source and kernels/cuda's headers, not this folder's f4_pair.h: its digest
# goes in as a define, so an edited header never reuses a stale cubin
LAB_HEADERS = int(hashlib.sha256((HERE / "f4_pair.h").read_bytes()).hexdigest()[:7], 16)


def module(D, G, W, S, ctas, wide_fix=1):
    return runtime.load(SOURCE, dict(HEAD_DIM=D, QUERY_GROUP=G, WARPS=W, STAGES=S, MIN_CTAS_PER_SM=ctas,
                                     WIDE_FIX=wide_fix, FMT4={F4: 1, F4i: 2}.get(F, 0), LAB_HEADERS=LAB_HEADERS),
                        torch.device("cuda"))


def smem_bytes(D, W, S):
    geo = F.Geometry(D)
    return 2 * (D // 16) * 32 * (8 if F in (F4, F4i) else 16) + W * S * 2 * geo.tile_bytes


# ---------------------------------------------------------------------------------------------------------
# decode check (regtile_dump): every tile of a pool rebuilt by the kernel's LaneTile code vs the input bits
# ---------------------------------------------------------------------------------------------------------
def dump(pool, b8, b16, D, kind):
    mod = module(D, 4, 4, 2, 1)
    n_tiles = pool.shape[0] * 4
    out = torch.full((n_tiles, 16, D), -1, dtype=torch.int16, device="cuda")  # poison: 0xFFFF (a NaN)
    runtime.launch(mod, "regtile_dump", ((n_tiles + 3) // 4,), (128,), smem_bytes(D, 4, 1), pool, b8, b16,
                   np.int32(n_tiles), np.int32(kind == "v"), out, device=torch.device("cuda"))
    torch.cuda.synchronize()
    return out.view(-1, 64, D)


def decode_checks() -> dict:
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv

    res = {}
    for D in (128, 64):
        for kind in "kv":
            # KV-like values with one tile of every block carrying an arbitrary 16-bit pattern: all 65,536
            # patterns appear (NaN payloads, Inf, zeros, subnormals), in 3-bit, 4-bit and raw groups
            x = synthetic_kv((1, 1, 65536 * 4 * 16, D), kind, 7, device="cuda")[0, 0]
            b8, b16 = calibrate(x[None, None])
            b8, b16 = b8[0].contiguous(), b16[0].contiguous()
            tiles = x.reshape(-1, 16, D).clone()
            n = tiles.shape[0]
            pats = torch.arange(65536, device="cuda", dtype=torch.int32)
            ti = 4 * torch.arange(65536, device="cuda") + torch.randint(0, 4, (65536,), device="cuda")  # one per block
            r = torch.randint(0, 16, (65536,), device="cuda")
            c = torch.randint(0, D, (65536,), device="cuda")
            tiles.view(torch.int16)[ti, r, c] = pats.to(torch.int16)
            blocks = tiles.reshape(-1, 64, D)
            enc = F.encode(blocks, b8, b16, kind)
            pool = enc.data[enc.fits].contiguous()
            got = dump(pool, b8, b16, D, kind)
            want = blocks[enc.fits].view(torch.int16)
            ref = F.decode(pool, b8, b16, D, kind).view(torch.int16)
            bad = int((got != want).sum())
            covered = torch.zeros(65536, dtype=torch.bool, device="cuda")
            covered[(want.to(torch.int32) & 0xFFFF).flatten().long()] = True
            m = enc.modes[enc.fits]
            res[f"d{D}_{kind}"] = dict(blocks=int(enc.fits.numel()), fitting=int(enc.fits.sum()), wrong_values=bad,
                                       ref_matches=bool(torch.equal(ref, want)), patterns_covered=int(covered.sum()),
                                       groups_4bit=float((m == 1).float().mean()), groups_raw=float((m == 2).float().mean()))
            print(f"decode d{D} {kind}: {res[f'd{D}_{kind}']}", flush=True)
    return res


# ---------------------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------------------
class Case:
    def __init__(self, shape, B, S, seed=0):
        from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
        from gaac_hf.kernels.cuda.attention import pack_paged_bf16

        real = shape.endswith("-real")  # real K/V of one SmolLM2 layer (dump_real.py), the shipped bases
        hq, hkv, d = harness.ATTENTION_SHAPES["smollm2-135m" if real else shape]
        self.shape, self.B, self.S, self.hq, self.hkv, self.d = shape, B, S, hq, hkv, d
        dev = "cuda"
        if real:
            dump = torch.load(REPO / ".kvdump" / "regtile_real_smollm2.pt")
            if dump["k"].shape[2] < S:
                raise ValueError(f"the real dump holds {dump['k'].shape[2]} tokens, the case asks {S}")
            # the batch repeats the same sequences (bytes in DRAM are what the timing sees; L2 is flushed)
            self.k = dump["k"][:, :, :S].expand(B, -1, -1, -1).contiguous().to(dev)
            self.v = dump["v"][:, :, :S].expand(B, -1, -1, -1).contiguous().to(dev)
            k8, k16, v8, v16 = (dump[n].to(torch.uint8).to(dev) for n in ("b8k", "b16k", "b8v", "b16v"))
        else:
            self.k = synthetic_kv((B, hkv, S, d), "k", seed, device=dev)
            self.v = synthetic_kv((B, hkv, S, d), "v", seed + 1, device=dev)
            (k8, k16), (v8, v16) = calibrate(self.k), calibrate(self.v)
        self.q = torch.randn(B, hq, d, generator=torch.Generator(device=dev).manual_seed(seed), device=dev).to(torch.bfloat16)
        self.bases = [t.contiguous() for t in (k8, k16, v8, v16)]
        lens = [S] * B
        g = torch.Generator().manual_seed(seed)
        self.rk = F.pack_pool(self.k, lens, k8, k16, "k", generator=g)
        self.rv = F.pack_pool(self.v, lens, v8, v16, "v", generator=g)
        self.pk, self.pv = pack_paged_bf16(self.k, lens, 64), pack_paged_bf16(self.v, lens, 64)
        self.kv_bytes = 2 * B * hkv * S * d * 2
        self.rt_bytes = F.bytes_of(self.rk) + F.bytes_of(self.rv)
        self.raw_blocks = self.rk["n_raw_blocks"] + self.rv["n_raw_blocks"]
        self.out = torch.empty_like(self.q)
        self.v3 = None

    def plan(self, W, splits):
        from gaac_hf.kernels import LaunchConfig
        from gaac_hf.kernels.cuda.attention import plan

        maxb = self.pk["table"].shape[2]
        return plan(self.B, self.hkv, self.hq // self.hkv, 64, self.d, maxb * 64 + 64, self.q.device,
                    LaunchConfig(num_splits=splits, num_warps=W))

    def regtile(self, W, S, ctas, splits, wide_fix=1):
        from gaac_hf.kernels.cuda.attention import _counters, split_partials

        p = self.plan(W, splits)
        mod = module(self.d, self.hq // self.hkv, W, S, ctas, wide_fix)
        sp = p["splits"]
        part_o, part_lse = split_partials(self.B, self.hq, sp, self.d, self.q.device)
        nt8 = 8 * math.ceil(self.hq // self.hkv / 8)
        smem = max(smem_bytes(self.d, W, S), 4 * (2 * W * nt8 + W * nt8 * self.d), 4 * (self.hq // self.hkv) * sp)
        rk, rv, (k8, k16, v8, v16) = self.rk, self.rv, self.bases
        counters = _counters(self.q.device, self.B * self.hkv)
        maxb = rk["table"].shape[2]
        scale = np.float32(LOG2E / math.sqrt(self.d))
        out = self.out

        def f():
            runtime.launch(mod, "regtile_decode_split", (sp, self.hkv, self.B), (32 * W,), smem, self.q,
                           rk["pool"], rv["pool"], rk["raw"], rv["raw"], rk["table"], rv["table"], rk["tail"], rv["tail"],
                           k8, k16, v8, v16, rk["num_blocks"], rk["tail_len"], None, part_o, part_lse, out, counters,
                           np.int32(self.hkv), np.int32(maxb), np.int32(p["tokens_per_split"]), scale,
                           device=self.q.device)
            return out
        return f, sp

    def twin(self, W=None, splits=None):
        from gaac_hf.kernels import LaunchConfig
        from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors

        pk, pv = self.pk, self.pv
        cfg = LaunchConfig(num_splits=splits, num_warps=W) if W else None
        out = torch.empty_like(self.q)
        return lambda: bf16_decode_attention_tensors(
            self.q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"], pk["num_blocks"],
            pk["tail_len"], config=cfg, out=out)

    def fused_v3(self):
        from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3, pack_paged_v3

        if self.v3 is None:
            bk, bv = (self.bases[0], self.bases[1]), (self.bases[2], self.bases[3])
            self.v3 = pack_paged_v3(self.k, self.v, [self.S] * self.B, 64, torch.stack([torch.stack(bk), torch.stack(bv)]))
        out = torch.empty_like(self.q)
        return lambda: gaac_decode_attention_v3(self.q, self.v3, out=out)


def launches(case):
    """(W, S, CTAs per SM) options that fit shared memory and the registers measured on sm_90a (168 at d=128,
    ~112 at d=64), with the split count filling one wave."""
    out = []
    if F in (F4, F4i):  # session 17: 128 registers at MIN_CTAS_PER_SM = 16 / W without spills (ptxas, sm_90a)
        for W, S, ctas in ((4, 2, 3), (4, 2, 4), (8, 2, 2), (8, 2, 1), (2, 2, 8), (8, 3, 1), (2, 4, 4), (2, 3, 5), (4, 3, 2)):
            if (smem_bytes(case.d, W, S) + 1024) * ctas <= 227 * 1024:
                out.append((W, S, ctas, max(1, (132 * ctas) // (case.B * case.hkv))))
        if WAVES > 1:  # more splits than one wave of CTAs (few kv heads, long contexts)
            out += [(W, S, c, sp * WAVES) for W, S, c, sp in out if (W, c) in ((8, 1), (8, 2), (4, 3))]
        return out
    regs = 168 if case.d == 128 else 112
    for W, S in ((4, 2), (2, 2), (8, 2), (4, 3), (2, 4)):
        for ctas in range(8, 0, -1):
            if (smem_bytes(case.d, W, S) + 1024) * ctas > 227 * 1024 or 32 * W * ctas * regs > 65536:
                continue
            splits = max(1, (132 * ctas) // (case.B * case.hkv))
            out.append((W, S, ctas, splits))
            break
    # occupancy probes (session 17): a deeper ring at 3 CTAs, and 4 CTAs of 4 warps under a 128-register cap
    # (ptxas spills ~150 B per thread there: is more warps per scheduler worth the spill traffic?)
    for W, S, ctas in ((4, 4, 3), (4, 2, 4)):
        if case.d == 128 and (smem_bytes(case.d, W, S) + 1024) * ctas <= 227 * 1024:
            out.append((W, S, ctas, max(1, (132 * ctas) // (case.B * case.hkv))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="qwen3-8b:1:65536,qwen3-8b:4:65536,qwen3-8b:1:131072,qwen3-8b:16:32768")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--fmt", choices=("3", "4", "4i"), default="3",
                    help="3: format.py (3-bit groups + 4-bit fix); 4: format4.py (fixed 4-bit lanes); 4i: format4i.py "
                         "(F4 with sign/mantissa words)")
    ap.add_argument("--waves", type=int, default=1, help="also time the best launch shapes with this many waves of splits")
    a = ap.parse_args(argv)
    global F, WAVES
    WAVES = a.waves
    F = {"3": F, "4": F4, "4i": F4i}[a.fmt]
    result = dict(provenance=harness.provenance(argv=sys.argv), timer="cuda-graph replay, L2 flushed, median of 15",
                  data="synthetic KV-like (calibration.synthetic)", layout=F.__name__, decode={}, cases=[])
    path = Path(a.out)

    def save():
        path.write_text(json.dumps(result, indent=1))

    t0 = time.time()
    if not a.skip_decode:
        try:
            result["decode"] = decode_checks()
        except Exception as e:  # reported, the timings still run
            print(f"decode check failed: {type(e).__name__}: {e}", flush=True)
            result["decode"] = dict(error=f"{type(e).__name__}: {e}")
        save()
    print(f"[{time.time() - t0:.0f}s] decode checks done", flush=True)
    for spec in a.cases.split(","):
        shape, B, S = spec.split(":")
        case = Case(shape, int(B), int(S))
        row = dict(shape=shape, B=case.B, S=case.S, kv_bytes=case.kv_bytes, regtile_bytes=case.rt_bytes,
                   ratio=case.kv_bytes / case.rt_bytes, raw_blocks=case.raw_blocks, runs={})
        t = {}
        t["cudnn"], _ = harness.time_and_error("cudnn", lambda: harness.sdpa_decode("cudnn", case.q, case.k, case.v))
        t["fa2"], _ = harness.time_and_error("fa2", lambda: harness.sdpa_decode("fa2", case.q, case.k, case.v))
        t["twin_default"], _ = harness.time_and_error("twin", lambda: case.twin())
        t["fused_v3_default"], _ = harness.time_and_error("v3", lambda: case.fused_v3())
        ref = harness.sdpa_decode("cudnn", case.q, case.k, case.v)().reshape(case.q.shape).float()
        for (W, St, ctas, splits) in launches(case):
            name = f"rt_w{W}s{St}c{ctas}_sp{splits}"
            try:
                f, sp = case.regtile(W, St, ctas, splits)
                case.out.view(torch.int16).fill_(-1)  # poison
                o = f().clone()
                twin = case.twin(W, sp)().clone()
                same = bool(torch.equal(o.view(torch.int16), twin.view(torch.int16)))
                err = float((o.float() - ref).norm() / ref.norm())
                us = harness.timeit_graph(f)
                fp, _ = case.regtile(W, St, ctas, splits, wide_fix=0)
                us_probe = harness.timeit_graph(fp)
                tw_us = harness.timeit_graph(case.twin(W, sp))
                row["runs"][name] = dict(W=W, stages=St, ctas_per_sm=ctas, splits=sp, us=us, bit_identical_to_twin=same,
                                         rel_err_vs_cudnn=err, us_no_wide_fix=us_probe, twin_same_launch_us=tw_us)
                print(f"  {shape} B={B} {S} {name} splits {sp}: {us:.1f} us (no wide fix {us_probe:.1f}; twin same "
                      f"launch {tw_us:.1f}) identical={same} err={err:.2e}", flush=True)
            except Exception as e:
                print(f"  {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                row["runs"][name] = dict(error=f"{type(e).__name__}: {e}"[:500])
        row["baselines_us"] = t
        best = min((r["us"] for r in row["runs"].values() if "us" in r), default=None)
        row["best_regtile_us"] = best
        if best and t["cudnn"]:
            row["speedup_vs_cudnn"] = t["cudnn"] / best
        if best and t["fa2"]:
            row["speedup_vs_fa2"] = t["fa2"] / best
        result["cases"].append(row)
        save()
        print(f"[{time.time() - t0:.0f}s] {shape} B={B} {S}: cuDNN {t['cudnn']}, FA2 {t['fa2']}, twin {t['twin_default']}, "
              f"fused v3 {t['fused_v3_default']}, regtile best {best} (ratio {row['ratio']:.3f}, raw blocks "
              f"{case.raw_blocks})", flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
