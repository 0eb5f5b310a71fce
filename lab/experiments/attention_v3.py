"""v3 split kernel experiment: branch-free main loop over complete blocks (loads unconditional, so
they can issue early / be pipelined), raw blocks as a rare override branch, tail after the loop,
escape bytes from a per-block chunk (ESC_MODE=1, tl.gather) or direct loads (ESC_MODE=0)."""
import math
import torch, triton, triton.language as tl
from gaac_hf.kernels.triton._tile import INTERPRET, base_pair_words, pairs_to_tile, raw_pair_words
from decode_v2 import _pair_v1 as _pair, _spread1_v1 as _spread1, _spread2_v1 as _spread2  # the decoder v3 was measured with
from gaac_hf.kernels.triton.attention import NEG, _as_dot_operand, _as_i16, _merge_kernel


@triton.jit
def _decode_sub(slot, stream, chunk, esc_base, r0, a0, a1, a2, a3, c0, c1, c2, c3,
                LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
                TS: tl.constexpr, D: tl.constexpr, ESC_MODE: tl.constexpr, ESCW: tl.constexpr):
    Q: tl.constexpr = D // 32
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None]
    g = tl.arange(0, G)[None, :]
    gi = t * G + g
    sm = tl.load((slot + r0 * D).to(tl.pointer_type(tl.int64)) + gi)
    lo2 = tl.load((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + r0 * G + gi).to(tl.uint32)
    hi1 = tl.load(slot + HI1_OFF + r0 * G + gi).to(tl.uint32)
    tag = (tl.load(slot + TAG_OFF + r0 * Q + t * Q + g // 4).to(tl.int32) >> (2 * (g % 4))) & 3
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5 + 65536, 0))
    flat = tl.reshape(cnt, [TS * G])
    incl = tl.cumsum(flat, 0)
    tot = tl.max(incl, 0)
    start = (tl.reshape(incl - flat, [TS, G]) & 0xFFFF) + esc_base
    end = esc_base + (tot & 0xFFFF)
    if ESC_MODE == 1:
        idx = tl.reshape(tl.minimum(start, ESCW - 1), [TS * G])
        e0 = tl.reshape(tl.gather(chunk, idx, 0), [TS, G]).to(tl.uint32)
        e0 = tl.where(tag > 0, e0, 0)
        if end > ESCW:  # rare: stream longer than the chunk
            e0 = tl.load(stream + start, mask=tag > 0, other=0).to(tl.uint32)
    else:
        e0 = tl.load(stream + start, mask=tag > 0, other=0).to(tl.uint32)
    smlo = sm.to(tl.uint32)
    smhi = (sm >> 32).to(tl.uint32)
    n = _spread2(lo2) | (_spread1(hi1) << 2) | (_spread1(e0) << 3)
    z = tl.zeros_like(a0)
    bw0 = tl.where(tag == 0, a0, tl.where(tag == 1, c0, z))
    bw1 = tl.where(tag == 0, a1, tl.where(tag == 1, c1, z))
    bw2 = tl.where(tag == 0, a2, tl.where(tag == 1, c2, z))
    bw3 = tl.where(tag == 0, a3, tl.where(tag == 1, c3, z))
    if tot >= 65536:
        esc = stream + start
        is_raw = tag == 2
        hn = _spread1(tl.load(esc + 1, mask=is_raw, other=0).to(tl.uint32))
        hn = hn | (_spread1(tl.load(esc + 2, mask=is_raw, other=0).to(tl.uint32)) << 1)
        hn = hn | (_spread1(tl.load(esc + 3, mask=is_raw, other=0).to(tl.uint32)) << 2)
        hn = hn | (_spread1(tl.load(esc + 4, mask=is_raw, other=0).to(tl.uint32)) << 3)
        w0 = _pair(smlo & 0xFFFF, n, hn, bw0, True)
        w1 = _pair(smlo >> 16, n >> 8, hn >> 8, bw1, True)
        w2 = _pair(smhi & 0xFFFF, n >> 16, hn >> 16, bw2, True)
        w3 = _pair(smhi >> 16, n >> 24, hn >> 24, bw3, True)
    else:
        w0 = _pair(smlo & 0xFFFF, n, n, bw0, False)
        w1 = _pair(smlo >> 16, n >> 8, n, bw1, False)
        w2 = _pair(smhi & 0xFFFF, n >> 16, n, bw2, False)
        w3 = _pair(smhi >> 16, n >> 24, n, bw3, False)
    return w0, w1, w2, w3, end


@triton.jit
def _step(qm, kt, vt, valid, m_i, l_i, acc, scale_log2, FP32_DOT: tl.constexpr):
    s = tl.dot(qm, tl.trans(_as_dot_operand(kt, FP32_DOT))) * scale_log2
    s = tl.where(valid[None, :], s, NEG)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.where(valid[None, :], tl.exp2(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP32_DOT:
        pv = tl.dot(p, _as_dot_operand(vt, FP32_DOT))
    else:
        pv = tl.dot(p.to(tl.bfloat16), _as_dot_operand(vt, FP32_DOT))
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _v3_kernel(
    Qb, K_SLOTS, V_SLOTS, K_HEAP, V_HEAP, K_ESC_START, V_ESC_START, K_RAW, V_RAW, K_TABLE, V_TABLE,
    K_TAIL, V_TAIL, KB8, KB16, VB8, VB16, NUM_BLOCKS, TAIL_LEN, KV_START, PART_O, PART_L,
    scale_log2, MAXB, BPS, S, K_HEAP_LEN, V_HEAP_LEN,
    HKV: tl.constexpr, GQ: tl.constexpr, QP: tl.constexpr,
    SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    T: tl.constexpr, D: tl.constexpr, KV_MODE: tl.constexpr, HAS_START: tl.constexpr, FP32_DOT: tl.constexpr,
    TS: tl.constexpr, ESC_MODE: tl.constexpr, ESCW: tl.constexpr,
):
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
    nb = tl.load(NUM_BLOCKS + b)
    tlen = tl.load(TAIL_LEN + b)
    if HAS_START:
        start = tl.load(KV_START + b)
    else:
        start = 0
    lo = split * BPS
    hi_full = tl.minimum(lo + BPS, nb)
    tab = bh.to(tl.int64) * MAXB
    tail_off = bh.to(tl.int64) * (T * D)
    tok = tl.arange(0, TS)
    ar = tl.arange(0, ESCW)
    m_i = tl.full([QP], NEG, tl.float32)
    l_i = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    for blk in range(lo, hi_full):
        ek = tl.load(K_TABLE + tab + blk)
        ev = tl.load(V_TABLE + tab + blk)
        if KV_MODE == 0:
            ekc = tl.maximum(ek, 0).to(tl.int64)
            evc = tl.maximum(ev, 0).to(tl.int64)
            kslot = K_SLOTS + ekc * SLOT_BYTES
            vslot = V_SLOTS + evc * SLOT_BYTES
            kst = tl.load(K_ESC_START + ekc)
            vst = tl.load(V_ESC_START + evc)
            kstream = K_HEAP + kst
            vstream = V_HEAP + vst
            if ESC_MODE == 1:
                kchunk = tl.load(kstream + ar, mask=kst + ar < K_HEAP_LEN, other=0)
                vchunk = tl.load(vstream + ar, mask=vst + ar < V_HEAP_LEN, other=0)
            else:
                kchunk = ar
                vchunk = ar
        kesc = tl.full([], 0, tl.int32)
        vesc = tl.full([], 0, tl.int32)
        for sub in tl.static_range(T // TS):
            r0 = sub * TS
            if KV_MODE == 0:
                k0, k1, k2, k3, kesc = _decode_sub(kslot, kstream, kchunk, kesc, r0, ka0, ka1, ka2, ka3, kc0, kc1, kc2, kc3,
                                                   LO2_OFF, HI1_OFF, TAG_OFF, TS, D, ESC_MODE, ESCW)
                v0, v1, v2, v3, vesc = _decode_sub(vslot, vstream, vchunk, vesc, r0, va0, va1, va2, va3, vc0, vc1, vc2, vc3,
                                                   LO2_OFF, HI1_OFF, TAG_OFF, TS, D, ESC_MODE, ESCW)
                if ek < 0:
                    k0, k1, k2, k3 = raw_pair_words(K_RAW + (-1 - ek).to(tl.int64) * (T * D), r0, T, TS, D)
                if ev < 0:
                    v0, v1, v2, v3 = raw_pair_words(V_RAW + (-1 - ev).to(tl.int64) * (T * D), r0, T, TS, D)
            else:
                k0, k1, k2, k3 = raw_pair_words(K_RAW + (-1 - ek).to(tl.int64) * (T * D), r0, T, TS, D)
                v0, v1, v2, v3 = raw_pair_words(V_RAW + (-1 - ev).to(tl.int64) * (T * D), r0, T, TS, D)
            kt = pairs_to_tile(k0, k1, k2, k3, TS, D)
            vt = pairs_to_tile(v0, v1, v2, v3, TS, D)
            valid = tok + r0 < T
            if HAS_START:
                valid = valid & (blk * T + r0 + tok >= start)
            m_i, l_i, acc = _step(qm, kt, vt, valid, m_i, l_i, acc, scale_log2, FP32_DOT)
    if (nb >= lo) & (nb < lo + BPS):  # the tail (virtual block nb), last in block order
        for sub in tl.static_range(T // TS):
            r0 = sub * TS
            k0, k1, k2, k3 = raw_pair_words(K_TAIL + tail_off, r0, tlen, TS, D)
            v0, v1, v2, v3 = raw_pair_words(V_TAIL + tail_off, r0, tlen, TS, D)
            kt = pairs_to_tile(k0, k1, k2, k3, TS, D)
            vt = pairs_to_tile(v0, v1, v2, v3, TS, D)
            valid = tok + r0 < tlen
            if HAS_START:
                valid = valid & (nb * T + r0 + tok >= start)
            m_i, l_i, acc = _step(qm, kt, vt, valid, m_i, l_i, acc, scale_log2, FP32_DOT)
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG)
    prow = qrow.to(tl.int64) * S + split
    tl.store(PART_O + prow[:, None] * D + d[None, :], o, mask=(r < GQ)[:, None])
    tl.store(PART_L + prow, lse, mask=r < GQ)


def v3_attention(q, pk, pv, bases, g, kv_mode, splits, ts=32, warps=4, stages=1, esc_mode=1, escw=512,
                 kv_start=None, out=None):
    B, HQ, D = q.shape
    _, HKV, MAXB = pk["table"].shape
    T = g.block_size
    GQ = HQ // HKV
    QP = max(16, triton.next_power_of_2(GQ))
    S = splits
    BPS = (MAXB + 1 + S - 1) // S
    part_o = torch.empty(B, HQ, S, D, dtype=torch.float32, device=q.device)
    part_l = torch.empty(B, HQ, S, dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=q.device)
    kb8, kb16, vb8, vb16 = bases
    k = _v3_kernel[(B * HKV, S)](
        _as_i16(q), pk["slots"], pv["slots"], pk["heap"], pv["heap"], pk["esc_start"], pv["esc_start"],
        _as_i16(pk["raw"]), _as_i16(pv["raw"]), pk["table"], pv["table"], _as_i16(pk["tail"]), _as_i16(pv["tail"]),
        kb8, kb16, vb8, vb16, pk["num_blocks"], pk["tail_len"], kv_start if kv_start is not None else pk["num_blocks"],
        part_o, part_l, (1 / math.sqrt(D)) * 1.4426950408889634, MAXB, BPS, S, pk["heap"].numel(), pv["heap"].numel(),
        HKV=HKV, GQ=GQ, QP=QP, SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
        TAG_OFF=g.tag_offset, T=T, D=D, KV_MODE=kv_mode, HAS_START=kv_start is not None, FP32_DOT=INTERPRET,
        TS=min(ts, T), ESC_MODE=esc_mode, ESCW=escw, num_warps=warps, num_stages=stages)
    _merge_kernel[(B * HQ,)](part_o, part_l, out.view(torch.int16), S, SP2=max(2, triton.next_power_of_2(S)), D=D)
    return out, k
