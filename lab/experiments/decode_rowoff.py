"""Experiment: a fast decoder that reads per-row escape offsets instead of scanning for them.

    python eval/experiments/decode_rowoff.py            # CPU interpreter: bit-exact vs the reference codec
    python eval/experiments/decode_rowoff.py --sass     # sm_90 SASS counts vs the product (no GPU)
    python eval/experiments/decode_rowoff.py --gpu [--out F.json]   # H200: bits + GB/s vs the product

Format v2 stores no escape offsets, so the product decoder (``_tile.decode_rows_pairs``) derives them
per sub-tile with ``tl.cumsum`` over the group counts and ``tl.max`` for the rows' total (~24% of its
instructions at d=128, most of its barriers; eval/NOTES.md). This experiment supposes a format with
one uint16 per block row: the exclusive prefix of the block's escape bytes at that row, top bit of
row 0 = "a raw group in this block" (computed here on the host from the slots, ``row_offsets``).
Group g's offset in row t is then row_off[t] + popc(ones & below_g) + 5 * popc(twos & below_g), with
ones / twos the 4-bit / raw tags of the row's tag bits (2, 4 or 8 bytes per row at d = 64 / 128 / 256).
Triton's CPU interpreter lacks ``libdevice.popc``; under it a SWAR popcount stands in (same values;
the product's ``_tile._popc``). The product now computes these offsets per block in the kernel
(``_tile.row_offsets``, "row scan" here), without a format change.
Not a product path: the format change it measures is not made.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--sass" not in sys.argv and "--gpu" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is defined

import triton
import triton.language as tl

from gaac_hf.kernels.triton._tile import INTERPRET, _tag_escape_bytes, base_pair_words, group_plane_words, pairs_to_tile, planes_to_pairs


@triton.jit
def _in_row_prefix(tw, g, SWAR: tl.constexpr, WHOLE: tl.constexpr = False):
    """Escape bytes of the groups before group g (< 16) of a 32-bit tag word (all 16 groups if WHOLE):
    the product's popcount helper (``_tile._tag_escape_bytes``; SWAR under the interpreter there)."""
    if WHOLE:
        return _tag_escape_bytes(tw, 0x55555555)
    else:
        return _tag_escape_bytes(tw, (tl.full([1, 1], 1, tl.uint32) << (2 * g).to(tl.uint32)) - 1)


@triton.jit
def _rows_rowoff(slot, stream, rowoff, r0, has_raw, b8w0, b8w1, b8w2, b8w3, b16w0, b16w1, b16w2, b16w3,
                 LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
                 TS: tl.constexpr, D: tl.constexpr, SWAR: tl.constexpr):
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None]
    g = tl.arange(0, G)[None, :]
    smlo, smhi, lo2, hi1 = group_plane_words(slot, r0, LO2_OFF, HI1_OFF, TS, D)
    if D == 64:  # the row's 8 tags in 2 bytes
        tw = tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint16)) + r0 + t).to(tl.uint32)
        pre = _in_row_prefix(tw, g, SWAR)
        tag = (tw >> (2 * g).to(tl.uint32)) & 3
    elif D == 128:  # 16 tags in 4 bytes
        tw = tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + r0 + t)
        pre = _in_row_prefix(tw, g, SWAR)
        tag = (tw >> (2 * g).to(tl.uint32)) & 3
    else:  # d=256: 32 tags in two words, groups 0-15 and 16-31
        w32 = (slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + 2 * (r0 + t)
        tw0 = tl.load(w32)
        tw1 = tl.load(w32 + 1)
        upper = g >= 16
        gg = tl.where(upper, g - 16, g)
        tw = tl.where(upper, tw1, tw0)
        pre = _in_row_prefix(tw, gg, SWAR) + tl.where(upper, _in_row_prefix(tw0, 0, SWAR, True), 0)
        tag = (tw >> (2 * gg).to(tl.uint32)) & 3
    start = (tl.load(rowoff + r0 + t).to(tl.uint32) & 0x7FFF) + pre
    esc = stream + start
    e0 = tl.load(esc, mask=tag > 0, other=0).to(tl.uint32)
    return planes_to_pairs(smlo, smhi, lo2, hi1, tag, esc, e0, has_raw, b8w0, b8w1, b8w2, b8w3,
                           b16w0, b16w1, b16w2, b16w3)


@triton.jit
def _decode_rowoff_kernel(SLOTS, HEAP, ESC_START, ROWOFF, B8, B16, OUT, base_stride,
                          SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr,
                          TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr, TS: tl.constexpr,
                          SWAR: tl.constexpr):
    """The product's standalone fast decoder, offsets from ROWOFF (uint16 [N, T])."""
    n = tl.program_id(0).to(tl.int64)
    stream = HEAP + tl.load(ESC_START + n)
    rowoff = ROWOFF + n * T
    has_raw = tl.load(rowoff) < 0  # int16 view of the uint16: the top bit
    a0, a1, a2, a3 = base_pair_words(B8 + n * base_stride, 0, D)
    c0, c1, c2, c3 = base_pair_words(B16 + n * base_stride, 0, D)
    r = tl.arange(0, TS)[:, None]
    c = tl.arange(0, D)[None, :]
    for sub in tl.static_range(T // TS):
        w0, w1, w2, w3 = _rows_rowoff(SLOTS + n * SLOT_BYTES, stream, rowoff, sub * TS, has_raw,
                                      a0, a1, a2, a3, c0, c1, c2, c3, LO2_OFF, HI1_OFF, TAG_OFF, TS, D, SWAR)
        tl.store(OUT + n * (T * D) + (sub * TS + r) * D + c, pairs_to_tile(w0, w1, w2, w3, TS, D))  # as the product


@triton.jit
def _row_totals(slot, rows, TAG_OFF: tl.constexpr, D: tl.constexpr, SWAR: tl.constexpr):
    """Escape bytes of each of ``rows`` of a slot (from its tag words) and whether the row has a raw group."""
    if D == 64:
        tw = tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint16)) + rows).to(tl.uint32)
        tot = _in_row_prefix(tw, 0, SWAR, True)
        raw = (tw >> 1) & (tw ^ 0xFFFFFFFF) & 0x5555
    elif D == 128:
        tw = tl.load((slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + rows)
        tot = _in_row_prefix(tw, 0, SWAR, True)
        raw = (tw >> 1) & (tw ^ 0xFFFFFFFF) & 0x55555555
    else:
        w32 = (slot + TAG_OFF).to(tl.pointer_type(tl.uint32)) + 2 * rows
        tw0 = tl.load(w32)
        tw1 = tl.load(w32 + 1)
        tot = _in_row_prefix(tw0, 0, SWAR, True) + _in_row_prefix(tw1, 0, SWAR, True)
        raw = ((tw0 >> 1) & (tw0 ^ 0xFFFFFFFF) & 0x55555555) | ((tw1 >> 1) & (tw1 ^ 0xFFFFFFFF) & 0x55555555)
    return tot, raw


@triton.jit
def _decode_rowscan_kernel(SLOTS, HEAP, ESC_START, SCRATCH, B8, B16, OUT, base_stride,
                           SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr,
                           TAG_OFF: tl.constexpr, T: tl.constexpr, D: tl.constexpr, TS: tl.constexpr,
                           SWAR: tl.constexpr):
    """No format change: the block's row offsets are computed once per block (one scan of T row
    totals from the tag words) into a per-program SCRATCH row (int32 [grid, T]), then read per
    sub-tile as the row-offset decoder reads its stored ones."""
    n = tl.program_id(0).to(tl.int64)
    slot = SLOTS + n * SLOT_BYTES
    stream = HEAP + tl.load(ESC_START + n)
    rows = tl.arange(0, T)
    tot, raw = _row_totals(slot, rows, TAG_OFF, D, SWAR)
    ex = tl.cumsum(tot, 0) - tot
    has_raw = tl.max(raw, 0) != 0
    rowoff = SCRATCH + n * T
    tl.store(rowoff + rows, ex.to(tl.int32))
    tl.debug_barrier()  # the scratch row is read back by other threads of the program
    a0, a1, a2, a3 = base_pair_words(B8 + n * base_stride, 0, D)
    c0, c1, c2, c3 = base_pair_words(B16 + n * base_stride, 0, D)
    r = tl.arange(0, TS)[:, None]
    c = tl.arange(0, D)[None, :]
    for sub in tl.static_range(T // TS):
        w0, w1, w2, w3 = _rows_rowoff(slot, stream, rowoff, sub * TS, has_raw,
                                      a0, a1, a2, a3, c0, c1, c2, c3, LO2_OFF, HI1_OFF, TAG_OFF, TS, D, SWAR)
        tl.store(OUT + n * (T * D) + (sub * TS + r) * D + c, pairs_to_tile(w0, w1, w2, w3, TS, D))


def decode_rowscan(slots, heap, esc_start, base8, base16, geometry, tile_tokens=8, num_warps=2):
    import torch
    g = geometry
    n = slots.shape[0]
    out = torch.full((n, g.block_size, g.head_dim), float("nan"), dtype=torch.bfloat16, device=slots.device)
    scratch = torch.empty(n, g.block_size, dtype=torch.int32, device=slots.device)
    _decode_rowscan_kernel[(n,)](slots, heap, esc_start, scratch, base8, base16, out.view(torch.int16),
                                 base8.shape[-1] if base8.dim() > 1 else 0,
                                 SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
                                 TAG_OFF=g.tag_offset, T=g.block_size, D=g.head_dim, TS=tile_tokens,
                                 SWAR=INTERPRET, num_warps=num_warps)
    return out


def row_offsets(slots, geometry):
    """uint16 [N, T] (as int16 bits): exclusive prefix of each block's escape bytes per row, top bit of
    row 0 set when the block has a raw group. From the slots' tag planes (d=128: 4 tag bytes per row)."""
    import torch
    g = geometry
    n, t, q = slots.shape[0], g.block_size, g.head_dim // 32
    tagb = slots[:, g.tag_offset: g.tag_offset + t * q].reshape(n, t, q).to(torch.int32)
    tags = torch.stack([(tagb >> (2 * i)) & 3 for i in range(4)], dim=-1).reshape(n, t, 4 * q)
    cnt = torch.where(tags == 1, 1, torch.where(tags == 2, 5, 0)).sum(-1)  # [N, T] bytes per row
    off = torch.cumsum(cnt, 1) - cnt
    off[:, 0] += (tags == 2).flatten(1).any(1).int() * 32768
    return off.to(torch.int32).to(torch.int16)  # uint16 bit patterns


def decode_rowoff(slots, heap, esc_start, base8, base16, geometry, tile_tokens=8, num_warps=2):
    import torch
    g = geometry
    n = slots.shape[0]
    out = torch.full((n, g.block_size, g.head_dim), float("nan"), dtype=torch.bfloat16, device=slots.device)
    ro = row_offsets(slots, g)
    _decode_rowoff_kernel[(n,)](slots, heap, esc_start, ro, base8, base16, out.view(torch.int16),
                                base8.shape[-1] if base8.dim() > 1 else 0,
                                SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
                                TAG_OFF=g.tag_offset, T=g.block_size, D=g.head_dim, TS=tile_tokens,
                                SWAR=INTERPRET, num_warps=num_warps)
    return out


def _check_cpu():
    ok = True
    for d in (64, 128, 256):
        ok &= _check_cpu_dim(d)
    return ok


def _check_cpu_dim(d):
    import torch
    from gaac_hf.codec import decode_blocks, encode_blocks, pack_escapes
    from gaac_hf.format import BlockGeometry
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    g = BlockGeometry(64, d, "channel")
    x = synthetic_kv((1, 2, 64 * 6, d), "k", seed=d, device="cpu")
    b8, b16 = calibrate(x)
    x = x.clone()
    xi = x.view(torch.int16)
    gen = torch.Generator().manual_seed(d)
    idx = torch.randint(0, xi.numel(), (xi.numel() // 200,), generator=gen)  # arbitrary bits: raw groups
    xi.view(-1)[idx] = torch.randint(-32768, 32767, (idx.numel(),), generator=gen, dtype=torch.int16)
    x[0, 1, 64:128] *= 300.0  # 4-bit groups
    blocks = x[0].reshape(-1, 64, d)
    heads = torch.arange(2).repeat_interleave(6)
    enc = encode_blocks(blocks, b8[heads], b16[heads], g)
    fit = enc.fits
    heap, start = pack_escapes(enc.escapes[fit], enc.escape_len[fit])
    slots = enc.slots[fit].contiguous()
    modes = [float((enc.tags[fit] == m).float().mean()) for m in range(3)]
    want = decode_blocks(slots, (heap, start), b8[heads][fit], b16[heads][fit], g)
    got = decode_rowoff(slots, heap, start, b8[heads][fit].contiguous(), b16[heads][fit].contiguous(), g,
                        tile_tokens=16 if d <= 64 else 8, num_warps=max(2, d // 64))
    same = torch.equal(got.view(torch.int16), want.view(torch.int16))
    got2 = decode_rowscan(slots, heap, start, b8[heads][fit].contiguous(), b16[heads][fit].contiguous(), g,
                          tile_tokens=16 if d <= 64 else 8, num_warps=max(2, d // 64))
    same2 = torch.equal(got2.view(torch.int16), want.view(torch.int16))
    print(f"d={d} in-kernel row scan bit-exact vs reference: {same2}")
    same = same and same2
    print(f"d={d} blocks={int(fit.sum())}/{fit.numel()} modes 3/4/raw={[round(m, 3) for m in modes]} "
          f"row-offset decoder bit-exact vs reference: {same}")
    return same


def _sass():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sass_sm90 as S
    from gaac_hf.format import BlockGeometry
    from gaac_hf.kernels.triton import decode as Dm
    for d in (64, 128, 256):
        _sass_dim(S, BlockGeometry(64, d, "channel"), Dm)


def _sass_dim(S, g, Dm):
    d = g.head_dim
    w, ts = max(2, d // 64), (16 if d <= 64 else 8)  # the product's fast-decoder launch defaults
    geo = dict(SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset, T=64, D=d, TS=ts)
    psig = dict(SLOTS="*u8", HEAP="*u8", ESC_START="*i64", heap_len="i64", B8="*u8", B16="*u8", OUT="*i16", ROWOFF="*i16",
                base_stride="i32")
    rsig = dict(SLOTS="*u8", HEAP="*u8", ESC_START="*i64", ROWOFF="*i16", B8="*u8", B16="*u8", OUT="*i16", base_stride="i32")
    for name, info in (("product", S.inspect(S.compile90(Dm._decode_kernel, psig, dict(geo, FAST=True), w))),
                       ("row offsets", S.inspect(S.compile90(_decode_rowoff_kernel, rsig, dict(geo, SWAR=False), w))),
                       ("row scan", S.inspect(S.compile90(_decode_rowscan_kernel, dict(rsig, ROWOFF=None) and
                                                          {k if k != "ROWOFF" else "SCRATCH": (v if k != "ROWOFF" else "*i32")
                                                           for k, v in rsig.items()}, dict(geo, SWAR=False), w)))):
        pv = S.per_value(info, w, 64 * d)
        print(f"d={d} w{w} ts{ts} {name:15s} regs {info['regs']:3d} sass {info['sass_total']:5d} BAR {info['barriers']:3d} "
              f"warp-instr/value {pv['warp_instr_per_value']:.3f} INT {pv['int_warp_instr_per_value']:.3f} "
              f"issue bound {pv['bound_gbps_bf16']:.0f} GB/s")


def _gpu(out_path=None, dev="cuda", tokens=65536, dims=(64, 128, 256), values=2**28):
    import json
    import platform

    import torch
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else dev,
           "versions": dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version()),
           "command": "python " + " ".join(sys.argv), "dims": []}
    ok = True
    for d in dims:  # as many heads as give `values` BF16 values (2**28: 537 MB, ~10x the L2) per head dim
        r = _gpu_dim(d, max(1, values // (tokens * d)), dev, tokens)
        res["dims"].append(r)
        ok &= all(x.get("bit_identical_to_product", True) for x in r["rows"]) and r["product_equals_reference_subset"]
    if out_path:
        with open(out_path, "w") as fh:
            json.dump(res, fh, indent=1)
    return ok


def _gpu_dim(d, heads, dev, tokens):
    """K of ``heads`` kv-heads at ``tokens`` (537 MB of BF16 at 64K, ~10x the L2), encoded by the
    product's Triton encoder: both decoders bit-identical to each other and to the reference on a
    subset, then timed (median of do_bench; the product decoder at its default launch, this one at
    the same launch and three others)."""
    import torch
    from gaac_hf.codec import decode_blocks
    from gaac_hf.format import BlockGeometry
    from gaac_hf.kernels.triton.decode import decode_blocks_triton
    from gaac_hf.kernels.triton.encode import append_escapes_triton, encode_blocks_triton
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    g = BlockGeometry(64, d, "channel")
    x = synthetic_kv((1, heads, tokens, d), "k", seed=d, device=dev)
    b8, b16 = calibrate(x)
    blocks = x[0].reshape(heads * (tokens // 64), 64, d)
    hb = torch.arange(heads, device=dev).repeat_interleave(tokens // 64)
    c8, c16 = b8[hb].contiguous(), b16[hb].contiguous()
    enc = encode_blocks_triton(blocks, c8, c16, g, fast=True, escape_width=g.escape_limit)
    fit = enc.fits
    assert bool(fit.all()), "every block of synthetic KV should fit"
    heap = torch.zeros(int(enc.escape_len.sum()) + 1, dtype=torch.uint8, device=dev)
    used = torch.zeros(1, dtype=torch.int64, device=dev)
    start = append_escapes_triton(enc, heap, used)
    slots = enc.slots.contiguous()
    ro = row_offsets(slots, g)
    n = slots.shape[0]
    out_p = decode_blocks_triton(slots, (heap, start), c8, c16, g, fast=True)
    res = {"blocks": n, "head_dim": d, "heads": heads, "bytes_bf16": n * 64 * d * 2, "rows": []}
    sub = slice(0, 256)
    want = decode_blocks(slots[sub], (heap, start[sub]), c8[sub], c16[sub], g)
    res["product_equals_reference_subset"] = bool(torch.equal(out_p[sub].view(torch.int16), want.view(torch.int16)))
    for w, ts in dict.fromkeys(((max(2, d // 64), 16 if d <= 64 else 8), (2, 16), (4, 8), (2, 8))):
        o = torch.full_like(out_p, float("nan"))

        def run(o=o, w=w, ts=ts):
            _decode_rowoff_kernel[(n,)](slots, heap, start, ro, c8, c16, o.view(torch.int16), d,
                                        SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset,
                                        TAG_OFF=g.tag_offset, T=64, D=d, TS=ts, SWAR=INTERPRET, num_warps=w)
        run()
        same = bool(torch.equal(o.view(torch.int16), out_p.view(torch.int16)))
        us = triton.testing.do_bench(run, return_mode="median") * 1e3
        res["rows"].append(dict(kernel="rowoff", warps=w, tile_tokens=ts, us=us, gbps=res["bytes_bf16"] / us / 1e3,
                                bit_identical_to_product=same))
    us = triton.testing.do_bench(lambda: decode_blocks_triton(slots, (heap, start), c8, c16, g, fast=True, out=out_p),
                                 return_mode="median") * 1e3
    res["rows"].append(dict(kernel="product_fast_default", us=us, gbps=res["bytes_bf16"] / us / 1e3))
    for r in res["rows"]:
        print(f"d={d}", r, flush=True)
    return res


if __name__ == "__main__":
    if "--sass" in sys.argv:
        _sass()
    elif "--gpu" in sys.argv:
        o = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
        sys.exit(0 if _gpu(o) else 1)
    else:
        sys.exit(0 if _check_cpu() else 1)
