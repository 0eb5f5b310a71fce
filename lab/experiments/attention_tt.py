"""Experiment (not run on a GPU yet): the fused decode kernel with transposed dots, so each warp owns
an independent softmax stream and nothing crosses warps inside the loop.

    TRITON_INTERPRET=1 python eval/experiments/attention_tt.py          # CPU: vs fp64, GAAC == BF16 twin
    python eval/experiments/attention_tt.py --sass                      # sm_90 registers / barriers / SASS
    python eval/experiments/attention_tt.py --gpu                       # H200: Qwen3-8B 64K B=1 sweep -> $OUT/tt_sweep.json

Why (eval/NOTES.md, session 3): the product kernel computes S = Q K^T with the 4 query heads padded to
16 rows and the tokens split across the CTA's 4 warps, so every sub-tile's softmax max/sum and the P
operand cross warps (74 barriers in its SASS); more warps per SM did not help and 1-2-warp programs
spilled (a 16 x 128 fp32 accumulator per warp). Here S^T = K Q^T (tokens are the M dimension, query
heads padded to only 8 columns: tl.dot takes N = 8) and O^T = V^T P^T (head_dim is M), so with one warp
per program the accumulator is [D, 8] (32 registers at d=128), the softmax reduces over rows inside
the warp, and the split count rises instead (more, smaller programs). Same tile decoder as the product
(``_tile_bits``), so GAAC is bit-identical to this kernel's own BF16 twin (KV_MODE=1); against the
product kernel it differs in accumulation order (close, not equal).
"""
from __future__ import annotations

import math
import os
import sys

if __name__ == "__main__" and "--sass" not in sys.argv and "--gpu" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton
import triton.language as tl

from gaac_hf.kernels.triton._tile import INTERPRET, base_pair_words
from gaac_hf.kernels.triton.attention import NEG, _as_dot_operand, _as_i16, _merge_kernel, _tile_bits


@triton.jit
def _tt_kernel(
    Qb, K_SLOTS, V_SLOTS, K_HEAP, V_HEAP, K_ESC_START, V_ESC_START, K_RAW, V_RAW, K_TABLE, V_TABLE,
    K_TAIL, V_TAIL, KB8, KB16, VB8, VB16, NUM_BLOCKS, TAIL_LEN, PART_O, PART_L, scale_log2, MAXB, BPS, S,
    HKV: tl.constexpr, GQ: tl.constexpr, NQ: tl.constexpr,
    SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    T: tl.constexpr, D: tl.constexpr, KV_MODE: tl.constexpr, FP32_DOT: tl.constexpr, TS: tl.constexpr,
):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    HQ: tl.constexpr = HKV * GQ
    r = tl.arange(0, NQ)
    d = tl.arange(0, D)
    qrow = b * HQ + h * GQ + r
    qbits = tl.load(Qb + qrow[:, None] * D + d[None, :], mask=(r < GQ)[:, None], other=0)  # [NQ, D]
    qT = tl.trans(_as_dot_operand(qbits, FP32_DOT))  # [D, NQ]
    if KV_MODE == 0:
        ka0, ka1, ka2, ka3 = base_pair_words(KB8, h, D)
        kc0, kc1, kc2, kc3 = base_pair_words(KB16, h, D)
        va0, va1, va2, va3 = base_pair_words(VB8, h, D)
        vc0, vc1, vc2, vc3 = base_pair_words(VB16, h, D)
    else:
        ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3 = 0, 0, 0, 0, 0, 0, 0, 0
        va0, va1, va2, va3, vc0, vc1, vc2, vc3 = 0, 0, 0, 0, 0, 0, 0, 0
    nb = tl.load(NUM_BLOCKS + b)
    tlen = tl.load(TAIL_LEN + b)
    lo = split * BPS
    hi = tl.minimum(lo + BPS, nb + 1)
    tab = bh.to(tl.int64) * MAXB
    tail_off = bh.to(tl.int64) * (T * D)
    tok = tl.arange(0, TS)
    m_i = tl.full([NQ], NEG, tl.float32)
    l_i = tl.zeros([NQ], tl.float32)
    acc = tl.zeros([D, NQ], tl.float32)  # O^T
    for blk in range(lo, hi):
        is_blk = blk < nb
        ek = tl.load(K_TABLE + tab + blk, mask=is_blk, other=-1)
        ev = tl.load(V_TABLE + tab + blk, mask=is_blk, other=-1)
        vlen = tl.where(is_blk, T, tlen)
        if KV_MODE == 0:
            kstream = K_HEAP + tl.load(K_ESC_START + tl.maximum(ek, 0))
            vstream = V_HEAP + tl.load(V_ESC_START + tl.maximum(ev, 0))
        else:
            kstream = K_HEAP
            vstream = V_HEAP
        kesc = tl.full([], 0, tl.int32)
        vesc = tl.full([], 0, tl.int32)
        for sub in tl.static_range(T // TS):
            r0 = sub * TS
            kt, kesc = _tile_bits(K_SLOTS, kstream, K_RAW, K_TAIL, ek, is_blk, vlen, tail_off, r0, kesc,
                                  ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3,
                                  SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE)
            s = tl.dot(_as_dot_operand(kt, FP32_DOT), qT) * scale_log2  # S^T [TS, NQ]
            valid = (tok + r0 < vlen)[:, None]
            s = tl.where(valid, s, NEG)
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.where(valid, tl.exp2(s - m_new[None, :]), 0.0)
            l_i = l_i * alpha + tl.sum(p, 0)
            vt, vesc = _tile_bits(V_SLOTS, vstream, V_RAW, V_TAIL, ev, is_blk, vlen, tail_off, r0, vesc,
                                  va0, va1, va2, va3, vc0, vc1, vc2, vc3,
                                  SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE)
            vT = tl.trans(_as_dot_operand(vt, FP32_DOT))  # [D, TS]
            if FP32_DOT:
                pv = tl.dot(vT, p)
            else:
                pv = tl.dot(vT, p.to(tl.bfloat16))
            acc = acc * alpha[None, :] + pv
            m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[None, :]  # [D, NQ]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG)
    prow = qrow.to(tl.int64) * S + split
    tl.store(PART_O + prow[None, :] * D + d[:, None], o, mask=(r < GQ)[None, :])
    tl.store(PART_L + prow, lse, mask=r < GQ)


def tt_attention(q, pk, pv, bases, g, kv_mode, splits, ts=16, warps=1, stages=1, out=None):
    B, HQ, D = q.shape
    _, HKV, MAXB = pk["table"].shape
    T = g.block_size
    GQ = HQ // HKV
    NQ = max(8, triton.next_power_of_2(GQ))
    S = splits
    BPS = (MAXB + 1 + S - 1) // S
    part_o = torch.empty(B, HQ, S, D, dtype=torch.float32, device=q.device)
    part_l = torch.empty(B, HQ, S, dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=q.device)
    kb8, kb16, vb8, vb16 = bases
    k = _tt_kernel[(B * HKV, S)](
        _as_i16(q), pk["slots"], pv["slots"], pk["heap"], pv["heap"], pk["esc_start"], pv["esc_start"],
        _as_i16(pk["raw"]), _as_i16(pv["raw"]), pk["table"], pv["table"], _as_i16(pk["tail"]), _as_i16(pv["tail"]),
        kb8, kb16, vb8, vb16, pk["num_blocks"], pk["tail_len"], part_o, part_l,
        (1 / math.sqrt(D)) * 1.4426950408889634, MAXB, BPS, S,
        HKV=HKV, GQ=GQ, NQ=NQ, SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
        TAG_OFF=g.tag_offset, T=T, D=D, KV_MODE=kv_mode, FP32_DOT=INTERPRET, TS=min(ts, T),
        num_warps=warps, num_stages=stages)
    _merge_kernel[(B * HQ,)](part_o, part_l, out.view(torch.int16), S, SP2=max(2, triton.next_power_of_2(S)), D=D)
    return out, k


def _check_cpu():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import bench_attention as BA
    from gaac_hf.kernels.triton import attention as A
    ok = True
    for shape, B, S in (("qwen3-8b", 1, 300), ("smollm2-135m", 2, 200), ("gemma3", 1, 130)):
        case = BA.Case(shape, B, S, "cpu", seed=0)
        g = case.geom
        lens = [S] * B
        nblk = case.hkv * (S // 64) * B
        pk = A.pack_paged_kv(case.k, lens, *case.kb, g, force_raw=torch.arange(nblk) % 3 == 1)
        pv = case.pv
        bases = (*case.kb, *case.vb)
        ref = A.attention_reference(case.q, case.k, case.v, lens)
        for splits, ts in ((1, 16), (3, 32)):
            o, _ = tt_attention(case.q, pk, pv, bases, g, 0, splits, ts=ts)
            ob, _ = tt_attention(case.q, case.bk, case.bv, bases, g, 1, splits, ts=ts)
            err = float((o.double() - ref).norm() / ref.norm())
            same = torch.equal(o.view(torch.int16), ob.view(torch.int16))
            ok &= same and err < 1e-2 and not bool(o.isnan().any())
            print(f"{shape} B={B} S={S} splits={splits} ts={ts}: rel err vs fp64 {err:.2e}, GAAC == own BF16 twin: {same}")
    return ok


def _sass():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sass_sm90 as SS
    from gaac_hf.format import BlockGeometry
    g = BlockGeometry(64, 128, "channel")
    sig = dict(Qb="*i16", K_SLOTS="*u8", V_SLOTS="*u8", K_HEAP="*u8", V_HEAP="*u8", K_ESC_START="*i64", V_ESC_START="*i64",
               K_RAW="*i16", V_RAW="*i16", K_TABLE="*i32", V_TABLE="*i32", K_TAIL="*i16", V_TAIL="*i16", KB8="*u8",
               KB16="*u8", VB8="*u8", VB16="*u8", NUM_BLOCKS="*i32", TAIL_LEN="*i32", PART_O="*fp32", PART_L="*fp32",
               scale_log2="fp32", MAXB="i32", BPS="i32", S="i32")
    for mode in (0, 1):
        for w in (1, 2, 4):
            for ts in (16, 32):
                cons = dict(HKV=8, GQ=4, NQ=8, SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
                            TAG_OFF=g.tag_offset, T=64, D=128, KV_MODE=mode, FP32_DOT=False, TS=ts)
                try:
                    info = SS.inspect(SS.compile90(_tt_kernel, sig, cons, w))
                except Exception as e:
                    print(mode, w, ts, "FAIL", str(e).splitlines()[-1][:120])
                    continue
                ctas = min(32, 65536 // max(1, info["regs"] * 32 * w))
                print(f"{'gaac' if mode == 0 else 'bf16'} warps {w} ts {ts}: regs {info['regs']} stack {info['stack_bytes']} "
                      f"BAR {info['barriers']} SASS {info['sass_total']} -> {ctas} CTAs ({ctas * w} warps) per SM")


def _gpu(budget_s=100.0):
    import json
    import time
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import bench_attention as BA
    t0 = time.time()
    case = BA.Case("qwen3-8b", 1, 65536, "cuda", seed=0)
    g, bases = case.geom, (*case.kb, *case.vb)
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3  # noqa: E731
    base = dict(cudnn=BA.run_sdpa(case, "cudnn", False)[0], fa2=BA.run_sdpa(case, "fa2", False)[0],
                gaac_product=bench(case.gaac()), bf16_product=bench(case.bf16(4, 4, 64, 1, None)))
    print({k: round(v, 1) for k, v in base.items()}, flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for w, ts in ((1, 16), (1, 32), (2, 16), (4, 32)):
        for pps in (4, 8, 11):
            if time.time() - t0 > budget_s:
                break
            splits = max(1, min((pps * sms + 7) // 8, (case.pk["max_blocks"] + 2) // 2))
            out = torch.full_like(case.q, float("nan"))
            f = lambda: tt_attention(case.q, case.pk, case.pv, bases, g, 0, splits, ts=ts, warps=w, out=out)  # noqa: E731
            fb = lambda: tt_attention(case.q, case.bk, case.bv, bases, g, 1, splits, ts=ts, warps=w)  # noqa: E731
            try:
                o, k = f()
                ob, kb = fb()
                us, us_b = bench(f), bench(fb)
            except Exception as e:  # noqa: BLE001
                print("FAIL", w, ts, pps, type(e).__name__, str(e)[:160], flush=True)
                continue
            row = dict(warps=w, ts=ts, pps=pps, splits=splits, us_gaac=us, us_bf16=us_b, vs_cudnn=base["cudnn"] / us,
                       regs=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None),
                       nan=bool(o.isnan().any()), gaac_equals_bf16_twin=bool(torch.equal(o.view(torch.int16), ob.view(torch.int16))))
            rows.append(row)
            print(row, flush=True)
    res = dict(gpu=torch.cuda.get_device_name(), versions=dict(torch=torch.__version__, triton=triton.__version__),
               command="python " + " ".join(sys.argv), case="qwen3-8b B=1 65536", baselines_us=base, rows=rows)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "tt_sweep.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    if "--sass" in sys.argv:
        _sass()
    elif "--gpu" in sys.argv:
        _gpu()
    else:
        sys.exit(0 if _check_cpu() else 1)
