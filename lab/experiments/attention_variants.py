"""Experiment record: two variants of the fused decode kernel, benchmarked against kernels.attention.

    python eval/experiments/attention_variants.py          # GPU: Qwen3-8B shape, B=1, 64K; JSON to $OUT
    FORCE_RAW=1 TRITON_INTERPRET=1 python eval/experiments/attention_variants.py   # CPU check, raw blocks mixed in

A copy of ``kernels/attention.py``'s split kernel with two compile-time flags (the product kernel is
unchanged because neither helped; eval/results/attention_variants_h200.json, eval/NOTES.md):

* EARLY_V: decode/load the V tile before the QK dot and softmax (more loads in flight).
* SELECT: branch-free block path (always decode slot max(e, 0), load raw words masked, select), so
  Triton's pipeliner sees one path; tried with num_stages 1 and 2.

Every variant must be bit-identical to the base kernel at the same splits/tile (checked per row).
"""
import json, math, os, sys, time
import torch, triton, triton.language as tl
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gaac_hf.kernels.triton import attention as A
from gaac_hf.kernels.triton._tile import INTERPRET, base_pair_words, pairs_to_tile, raw_pair_words
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _scan_decoder import decode_rows_pairs  # the version measured here
from gaac_hf.kernels.triton.attention import NEG, _as_dot_operand, _as_i16, _merge_kernel, _raw_words


@triton.jit
def _bits(SLOTS, stream, RAW, TAIL, e, is_blk, vlen, tail_off, r0, esc_base, a0, a1, a2, a3, c0, c1, c2, c3,
          SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
          TS: tl.constexpr, T: tl.constexpr, D: tl.constexpr, KV_MODE: tl.constexpr, SELECT: tl.constexpr):
    if KV_MODE == 0:
        if SELECT:
            w0, w1, w2, w3, esc_next = decode_rows_pairs(
                SLOTS + tl.maximum(e, 0).to(tl.int64) * SLOT_BYTES, stream, r0, esc_base, a0, a1, a2, a3, c0, c1, c2, c3,
                LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
            use_raw = e < 0
            rp = tl.where(is_blk, RAW + tl.maximum(-1 - e, 0).to(tl.int64) * (T * D), TAIL + tail_off)
            x0, x1, x2, x3 = raw_pair_words(rp, r0, tl.where(use_raw, vlen, 0), TS, D)
            w0 = tl.where(use_raw, x0, w0)
            w1 = tl.where(use_raw, x1, w1)
            w2 = tl.where(use_raw, x2, w2)
            w3 = tl.where(use_raw, x3, w3)
        else:
            if e >= 0:
                w0, w1, w2, w3, esc_next = decode_rows_pairs(
                    SLOTS + e.to(tl.int64) * SLOT_BYTES, stream, r0, esc_base, a0, a1, a2, a3, c0, c1, c2, c3,
                    LO2_OFF, HI1_OFF, TAG_OFF, TS, D)
            else:
                w0, w1, w2, w3 = _raw_words(RAW, TAIL, e, is_blk, vlen, tail_off, r0, TS, T, D)
                esc_next = esc_base
    else:
        if SELECT:
            rp = tl.where(is_blk, RAW + tl.maximum(-1 - e, 0).to(tl.int64) * (T * D), TAIL + tail_off)
            w0, w1, w2, w3 = raw_pair_words(rp, r0, vlen, TS, D)
        else:
            w0, w1, w2, w3 = _raw_words(RAW, TAIL, e, is_blk, vlen, tail_off, r0, TS, T, D)
        esc_next = esc_base
    return pairs_to_tile(w0, w1, w2, w3, TS, D), esc_next


@triton.jit
def _kern(Qb, K_SLOTS, V_SLOTS, K_HEAP, V_HEAP, K_ESC_START, V_ESC_START, K_RAW, V_RAW, K_TABLE, V_TABLE,
          K_TAIL, V_TAIL, KB8, KB16, VB8, VB16, NUM_BLOCKS, TAIL_LEN, PART_O, PART_L, scale_log2, MAXB, BPS, S,
          HKV: tl.constexpr, GQ: tl.constexpr, QP: tl.constexpr, SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr,
          HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr, KV_MODE: tl.constexpr,
          FP32_DOT: tl.constexpr, TS: tl.constexpr, EARLY_V: tl.constexpr, SELECT: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    HQ: tl.constexpr = HKV * GQ
    r = tl.arange(0, QP)
    d = tl.arange(0, D)
    qrow = b * HQ + h * GQ + r
    qbits = tl.load(Qb + qrow[:, None] * D + d[None, :], mask=(r < GQ)[:, None], other=0)
    qm = _as_dot_operand(qbits, FP32_DOT)
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
    m_i = tl.full([QP], NEG, tl.float32)
    l_i = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
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
            kt, kesc = _bits(K_SLOTS, kstream, K_RAW, K_TAIL, ek, is_blk, vlen, tail_off, r0, kesc,
                             ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3, SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE, SELECT)
            if EARLY_V:
                vt, vesc = _bits(V_SLOTS, vstream, V_RAW, V_TAIL, ev, is_blk, vlen, tail_off, r0, vesc,
                                 va0, va1, va2, va3, vc0, vc1, vc2, vc3, SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE, SELECT)
            s = tl.dot(qm, tl.trans(_as_dot_operand(kt, FP32_DOT))) * scale_log2
            valid = tok + r0 < vlen
            s = tl.where(valid[None, :], s, NEG)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.where(valid[None, :], tl.exp2(s - m_new[:, None]), 0.0)
            l_i = l_i * alpha + tl.sum(p, 1)
            if not EARLY_V:
                vt, vesc = _bits(V_SLOTS, vstream, V_RAW, V_TAIL, ev, is_blk, vlen, tail_off, r0, vesc,
                                 va0, va1, va2, va3, vc0, vc1, vc2, vc3, SLOT_BYTES, LO2_OFF, HI1_OFF, TAG_OFF, TS, T, D, KV_MODE, SELECT)
            if FP32_DOT:
                pv = tl.dot(p, _as_dot_operand(vt, FP32_DOT))
            else:
                pv = tl.dot(p.to(tl.bfloat16), _as_dot_operand(vt, FP32_DOT))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG)
    prow = qrow.to(tl.int64) * S + split
    tl.store(PART_O + prow[:, None] * D + d[None, :], o, mask=(r < GQ)[:, None])
    tl.store(PART_L + prow, lse, mask=r < GQ)


def launch(q, pk, pv, bases, g, kv_mode, splits, ts, warps, stages, early_v, select, out):
    B, HQ, D = q.shape
    _, HKV, MAXB = pk["table"].shape
    T = g.block_size
    GQ = HQ // HKV
    QP = max(16, triton.next_power_of_2(GQ))
    S = splits
    BPS = (MAXB + 1 + S - 1) // S
    part_o = torch.empty(B, HQ, S, D, dtype=torch.float32, device=q.device)
    part_l = torch.empty(B, HQ, S, dtype=torch.float32, device=q.device)
    kb8, kb16, vb8, vb16 = bases
    k = _kern[(B * HKV, S)](
        _as_i16(q), pk["slots"], pv["slots"], pk["heap"], pv["heap"], pk["esc_start"], pv["esc_start"],
        _as_i16(pk["raw"]), _as_i16(pv["raw"]), pk["table"], pv["table"], _as_i16(pk["tail"]), _as_i16(pv["tail"]),
        kb8, kb16, vb8, vb16, pk["num_blocks"], pk["tail_len"], part_o, part_l, (1 / math.sqrt(D)) * 1.4426950408889634,
        MAXB, BPS, S, HKV=HKV, GQ=GQ, QP=QP, SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
        TAG_OFF=g.tag_offset, T=T, D=D, KV_MODE=kv_mode, FP32_DOT=INTERPRET, TS=ts, EARLY_V=early_v, SELECT=select,
        num_warps=warps, num_stages=stages)
    _merge_kernel[(B * HQ,)](part_o, part_l, out.view(torch.int16), S, SP2=max(2, triton.next_power_of_2(S)), D=D)
    return out, getattr(k, "n_regs", None), getattr(k, "n_spills", None)


def main():
    import bench_attention as BA
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = dev == "cpu"
    shape, B, S = ("qwen3-8b", 1, 65536) if not smoke else ("qwen3-8b", 1, 256)
    force = os.environ.get("FORCE_RAW")
    case = BA.Case(shape, B, S, dev, seed=0)
    if force:  # some raw blocks in the K table, to check SELECT on both paths
        from gaac_hf.kernels.triton.attention import pack_paged_kv
        nblk = case.hkv * (S // 64)
        case.pk = pack_paged_kv(case.k, [S] * B, *case.kb, case.geom, force_raw=torch.arange(nblk, device=dev) % 3 == 1)
    g = case.geom
    bases = (*case.kb, *case.vb)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 8
    rows = []
    ref_bits = {}
    bench = (lambda f: triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median") * 1e3) if not smoke else (lambda f: (f(), 0.0)[1])
    configs = []
    for kv_mode in (0, 1):
        for early_v in (0, 1):
            for select in (0, 1):
                for stages in ((1, 2) if select else (1,)):
                    for pps in (4,):
                        for ts in ((32,) if kv_mode == 0 else (64,)):
                            configs.append((kv_mode, early_v, select, stages, pps, ts))
    if smoke:
        configs = [c for c in configs if c[3] == 1 and c[4] == 4]
    for kv_mode, early_v, select, stages, pps, ts in configs:
        splits = max(1, min((pps * sms + B * case.hkv - 1) // (B * case.hkv), (case.pk["max_blocks"] + 2) // 2))
        pk, pv = (case.pk, case.pv) if kv_mode == 0 else (case.bk, case.bv)
        out = torch.full_like(case.q, float("nan"))
        f = lambda: launch(case.q, pk, pv, bases, g, kv_mode, splits, ts, 4, stages, early_v, select, out)
        try:
            o, regs, spills = f()
            us = bench(f)
        except Exception as e:
            print("FAIL", kv_mode, early_v, select, stages, pps, ts, type(e).__name__, str(e)[:200], flush=True)
            continue
        key = (splits, ts)
        bits = o.view(torch.int16).clone()
        same = None
        if key in ref_bits:
            same = bool(torch.equal(bits, ref_bits[key]))
        else:
            ref_bits[key] = bits
        row = dict(kind="gaac" if kv_mode == 0 else "bf16", early_v=early_v, select=select, stages=stages, pps=pps,
                   ts=ts, splits=splits, us=us, regs=regs, spills=spills, bits_equal_first_of_same_config=same,
                   nan=bool(o.isnan().any()))
        rows.append(row)
        print(json.dumps(row), flush=True)
    # baselines from the product kernel, same process
    base = {"gaac": bench(case.gaac()), "bf16": bench(case.bf16(4, 4, 64, 1, None)),
            "cudnn": BA.run_sdpa(case, "cudnn", smoke)[0], "fa2": BA.run_sdpa(case, "fa2", smoke)[0]}
    print("baselines", base)
    out = dict(gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu", shape=shape, batch=B, context=S,
               versions=dict(torch=torch.__version__, triton=triton.__version__), rows=rows, baselines_us=base,
               command="python " + " ".join(sys.argv), force_raw=bool(force))
    path = os.path.join(os.environ.get("OUT", "/tmp"), "variants%s.json" % ("_raw" if force else ""))
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
