"""Triton GAAC block encoder: BF16 blocks -> slots + escape streams, byte-identical to the reference.

Reference: ``gaac_hf.codec.encode_blocks`` (the executable spec). This kernel must produce the same
``slots`` bytes, escape rows (zeros past the stream included), ``escape_len`` and ``fits`` for every
input bit pattern; :func:`append_escapes_triton` then packs the rows into an escape heap exactly as
``gaac_hf.codec.pack_escapes`` does (and as the cache's reference twin ``gaac_hf.codec.append_escapes``). Only ``group_axis="channel"`` (the format's default) is implemented here;
the token axis stays reference-only.

One program encodes one block (T x D values, e.g. 64 x 128 = 16 KB of BF16) held as a ``[T, Q, 4, 8]``
register tile (see ``_tile.py``): modes are min/max reductions over axis 3, plane words are sums of
shifted codes over axis 3 (or 2 for the tag byte), and the escape stream is a masked scatter at the
groups' prefix-sum offsets. Many blocks (all complete blocks of a prefill) go in one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gaac_hf.codec import EncodedBlocks
from gaac_hf.format import BlockGeometry

from ..paged import DEFAULT_LAUNCH, LaunchConfig
from ._tile import escape_starts, tile_index


@triton.jit
def _encode_kernel(
    X,  # *int16 [N, T, D]: the BF16 blocks' bits
    B8,  # *uint8 [N or 1, D]
    B16,
    SLOTS,  # *uint8 [N, SLOT_BYTES]
    ESC,  # *uint8 [N, CAP]: escape rows
    ESC_LEN,  # *int32 [N]
    FITS,  # *int8 [N]
    TAGS,  # *int32 [N, T, D/8] (written only when WRITE_TAGS)
    base_stride,  # 0 when one base vector serves all blocks, else D
    SLOT_BYTES: tl.constexpr,
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    CAP: tl.constexpr,  # escape row width: longer streams are truncated (and do not fit)
    CAP_P2: tl.constexpr,  # next power of two >= CAP (>= 16), for the zero fill
    LIMIT: tl.constexpr,  # geometry.escape_limit: fits = escape_len <= LIMIT
    ZERO_FILL: tl.constexpr,  # zero the row past the stream (the reference's rows; not needed for a heap)
    T: tl.constexpr,
    D: tl.constexpr,
    WRITE_TAGS: tl.constexpr,
):
    Q: tl.constexpr = D // 32
    n = tl.program_id(0).to(tl.int64)
    grp, elem, chan, t, q, i, j = tile_index(T, D)
    bits = tl.load(X + n * (T * D) + elem).to(tl.int32) & 0xFFFF
    b8 = tl.load(B8 + n * base_stride + chan).to(tl.int32)
    b16 = tl.load(B16 + n * base_stride + chan).to(tl.int32)
    exp = (bits >> 7) & 0xFF
    sm = ((bits >> 8) & 0x80) | (bits & 0x7F)

    # mode per group: narrowest window every value of the group fits in
    off8 = exp - b8
    off16 = exp - b16
    fit3 = (tl.min(off8, axis=3, keep_dims=True) >= 0) & (tl.max(off8, axis=3, keep_dims=True) < 8)
    fit4 = (tl.min(off16, axis=3, keep_dims=True) >= 0) & (tl.max(off16, axis=3, keep_dims=True) < 16)
    tag = tl.where(fit3, 0, tl.where(fit4, 1, 2))  # [T, Q, 4, 1]
    coded = tl.where(tag == 0, off8, tl.where(tag == 1, off16, exp))  # >= 0 in its mode
    code = coded & 7
    high = coded >> 3

    slot = SLOTS + n * SLOT_BYTES
    tl.store(slot + elem, sm.to(tl.uint8))
    lo2 = tl.sum((code & 3) << (2 * j), axis=3, keep_dims=True)  # u16 per group, LSB first
    tl.store((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + grp, lo2.to(tl.uint16))
    hi1 = tl.sum((code >> 2) << j, axis=3, keep_dims=True)
    tl.store(slot + HI1_OFF + grp, hi1.to(tl.uint8))
    if WRITE_TAGS:  # per-group modes for statistics (the reference's EncodedBlocks.tags)
        tl.store(TAGS + n * (T * (D // 8)) + grp, tag)
    tagb = tl.sum(tag << (2 * i), axis=2, keep_dims=True)  # [T, Q, 1, 1]
    tl.store(slot + TAG_OFF + t * Q + q, tagb.to(tl.uint8))

    # escape stream: byte k of a group is bit-plane k of its high bits; truncated at the row width
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5, 0))
    start = escape_starts(cnt, T, D)
    esc = ESC + n * CAP + start
    for k in tl.static_range(0, 5):
        byte = tl.sum(((high >> k) & 1) << j, axis=3, keep_dims=True)
        tl.store(esc + k, byte.to(tl.uint8), mask=(k < cnt) & (start + k < CAP))
    esc_len = tl.sum(tl.reshape(cnt, [T * (D // 8)]), 0)
    if ZERO_FILL:  # the bytes past the stream are zero (disjoint from the scatter above)
        p = tl.arange(0, CAP_P2)
        tl.store(ESC + n * CAP + p, tl.zeros([CAP_P2], tl.uint8), mask=(p < CAP) & (p >= esc_len))
    tl.store(ESC_LEN + n, esc_len)
    tl.store(FITS + n, (esc_len <= LIMIT).to(tl.int8))


@triton.jit
def _pairs(X, row0, TS: tl.constexpr, D: tl.constexpr):
    """Rows [row0, row0+TS) of BF16 ``[*, D]`` at X (int16 pointer) as 4 uint32 ``[TS, G]`` words per
    group: word m = values 2m (bits 0..15) and 2m+1 (bits 16..31). One 16-byte load per group."""
    G: tl.constexpr = D // 8
    t = tl.arange(0, TS)[:, None, None]
    g = tl.arange(0, G)[None, :, None]
    m = tl.arange(0, 4)[None, None, :]
    w = tl.load(X.to(tl.pointer_type(tl.uint32)) + (row0 + t) * (D // 2) + g * 4 + m)
    a, b = tl.split(tl.reshape(w, [TS, G, 2, 2]))
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def _fit(off, MASK: tl.constexpr):
    """Both 16-bit lanes of ``off`` (= exponent + 256 - base) lie in [256, 256 + window)."""
    return (off & MASK) == 0x01000100


@triton.jit
def _code_word(ka, kb):
    """Two pair words of coded values (lanes at bits 0..7 and 16..23) -> one uint32 with the 4 values
    as bytes, in value order."""
    return ((ka | (ka >> 8)) & 0xFFFF) | (((kb | (kb >> 8)) & 0xFFFF) << 16)


@triton.jit
def _lo2_of(A):
    """Bits 0-1 of the 4 coded bytes of A -> 4 2-bit fields in bits 0..7 (value j at 2j)."""
    x = A & 0x03030303
    x = (x | (x >> 6)) & 0x000F000F
    return (x | (x >> 12)) & 0xFF


@triton.jit
def _transpose8(A, B):
    """8x8 bit transpose of a group's coded values (value j = byte j of the 64-bit word B:A): returns
    (A', B') with byte b of B':A' = bit-plane b (bit j = bit b of value j). Three rounds of masked
    swaps (2x2, 4x4 blocks within each word, then nibbles across them): ~20 ops for all 8 planes."""
    t = (A ^ (A >> 7)) & 0x00AA00AA
    A = A ^ t ^ (t << 7)
    t = (B ^ (B >> 7)) & 0x00AA00AA
    B = B ^ t ^ (t << 7)
    t = (A ^ (A >> 14)) & 0x0000CCCC
    A = A ^ t ^ (t << 14)
    t = (B ^ (B >> 14)) & 0x0000CCCC
    B = B ^ t ^ (t << 14)
    return (A & 0x0F0F0F0F) | ((B << 4) & 0xF0F0F0F0), ((A >> 4) & 0x0F0F0F0F) | (B & 0xF0F0F0F0)


@triton.jit
def _encode_groups_kernel(
    X, B8, B16, SLOTS, ESC, ESC_LEN, FITS, TAGS, base_stride,
    SLOT_BYTES: tl.constexpr, LO2_OFF: tl.constexpr, HI1_OFF: tl.constexpr, TAG_OFF: tl.constexpr,
    CAP: tl.constexpr, CAP_P2: tl.constexpr, LIMIT: tl.constexpr, ZERO_FILL: tl.constexpr,
    T: tl.constexpr, D: tl.constexpr, TS: tl.constexpr, WRITE_TAGS: tl.constexpr,
):
    """Same bytes as :func:`_encode_kernel`, in the pair-decoder's layout: a thread owns whole groups
    (``[TS, G]`` tensors), works on BF16 pairs in 32-bit words (exponent fields compared against
    both windows two lanes at a time, with a +256 lane bias so the subtraction cannot borrow across
    lanes), and the block is walked in sub-tiles of TS rows with the escape offset carried."""
    Q: tl.constexpr = D // 32
    G: tl.constexpr = D // 8
    n = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G)[None, :]
    pb8 = B8 + n * base_stride + 8 * g
    pb16 = B16 + n * base_stride + 8 * g
    # base pairs (channel 8g+2m in lane 0, 8g+2m+1 in lane 1), once per program
    a0 = tl.load(pb8 + 0).to(tl.uint32) | (tl.load(pb8 + 1).to(tl.uint32) << 16)
    a1 = tl.load(pb8 + 2).to(tl.uint32) | (tl.load(pb8 + 3).to(tl.uint32) << 16)
    a2 = tl.load(pb8 + 4).to(tl.uint32) | (tl.load(pb8 + 5).to(tl.uint32) << 16)
    a3 = tl.load(pb8 + 6).to(tl.uint32) | (tl.load(pb8 + 7).to(tl.uint32) << 16)
    c0 = tl.load(pb16 + 0).to(tl.uint32) | (tl.load(pb16 + 1).to(tl.uint32) << 16)
    c1 = tl.load(pb16 + 2).to(tl.uint32) | (tl.load(pb16 + 3).to(tl.uint32) << 16)
    c2 = tl.load(pb16 + 4).to(tl.uint32) | (tl.load(pb16 + 5).to(tl.uint32) << 16)
    c3 = tl.load(pb16 + 6).to(tl.uint32) | (tl.load(pb16 + 7).to(tl.uint32) << 16)
    slot = SLOTS + n * SLOT_BYTES
    t = tl.arange(0, TS)[:, None]
    esc_run = tl.full([], 0, tl.int32)
    for sub in tl.static_range(T // TS):
        r0 = sub * TS
        gi = t * G + g
        w0, w1, w2, w3 = _pairs(X + n * (T * D), r0, TS, D)
        e0 = (w0 >> 7) & 0x00FF00FF
        e1 = (w1 >> 7) & 0x00FF00FF
        e2 = (w2 >> 7) & 0x00FF00FF
        e3 = (w3 >> 7) & 0x00FF00FF
        o0 = (e0 | 0x01000100) - a0
        o1 = (e1 | 0x01000100) - a1
        o2 = (e2 | 0x01000100) - a2
        o3 = (e3 | 0x01000100) - a3
        p0 = (e0 | 0x01000100) - c0
        p1 = (e1 | 0x01000100) - c1
        p2 = (e2 | 0x01000100) - c2
        p3 = (e3 | 0x01000100) - c3
        fit3 = _fit(o0, 0xFFF8FFF8) & _fit(o1, 0xFFF8FFF8) & _fit(o2, 0xFFF8FFF8) & _fit(o3, 0xFFF8FFF8)
        fit4 = _fit(p0, 0xFFF0FFF0) & _fit(p1, 0xFFF0FFF0) & _fit(p2, 0xFFF0FFF0) & _fit(p3, 0xFFF0FFF0)
        tag = tl.where(fit3, 0, tl.where(fit4, 1, 2))  # [TS, G]
        # coded exponents, two per word (lanes in 0..255)
        k0 = tl.where(fit3, o0 - 0x01000100, tl.where(fit4, p0 - 0x01000100, e0))
        k1 = tl.where(fit3, o1 - 0x01000100, tl.where(fit4, p1 - 0x01000100, e1))
        k2 = tl.where(fit3, o2 - 0x01000100, tl.where(fit4, p2 - 0x01000100, e2))
        k3 = tl.where(fit3, o3 - 0x01000100, tl.where(fit4, p3 - 0x01000100, e3))
        # sign|mantissa bytes: per word, two bytes -> 16 bits; the group's 8 bytes as one int64
        s0 = ((w0 >> 8) & 0x00800080) | (w0 & 0x007F007F)
        s1 = ((w1 >> 8) & 0x00800080) | (w1 & 0x007F007F)
        s2 = ((w2 >> 8) & 0x00800080) | (w2 & 0x007F007F)
        s3 = ((w3 >> 8) & 0x00800080) | (w3 & 0x007F007F)
        lo = ((s0 & 0xFF) | ((s0 >> 8) & 0xFF00)) | (((s1 & 0xFF) | ((s1 >> 8) & 0xFF00)) << 16)
        hi = ((s2 & 0xFF) | ((s2 >> 8) & 0xFF00)) | (((s3 & 0xFF) | ((s3 >> 8) & 0xFF00)) << 16)
        sm = lo.to(tl.uint64) | (hi.to(tl.uint64) << 32)
        tl.store((slot + r0 * D).to(tl.pointer_type(tl.uint64)) + gi, sm)
        # the group's 8 coded values as bytes (A: values 0-3, B: 4-7); lo2 from their low 2 bits, every
        # other plane (hi1 = bit 2, escape byte k = bit 3 + k) from one 8x8 bit transpose
        A = _code_word(k0, k1)
        B = _code_word(k2, k3)
        lo2 = _lo2_of(A) | (_lo2_of(B) << 8)
        tl.store((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + r0 * G + gi, lo2.to(tl.uint16))
        PA, PB = _transpose8(A, B)  # byte b of PB:PA = bit-plane b
        tl.store(slot + HI1_OFF + r0 * G + gi, (PA >> 16).to(tl.uint8))
        if WRITE_TAGS:
            tl.store(TAGS + n * (T * G) + r0 * G + gi, tag)
        tq = tl.reshape(tag, [TS, Q, 4])
        tagb = tl.sum(tq << (2 * tl.arange(0, 4)[None, None, :]), axis=2)  # [TS, Q]
        tl.store(slot + TAG_OFF + r0 * Q + t * Q + tl.arange(0, Q)[None, :], tagb.to(tl.uint8))
        # escape stream at the groups' prefix-sum offsets (carried across sub-tiles)
        cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5, 0))
        flat = tl.reshape(cnt, [TS * G])
        start = tl.reshape(tl.cumsum(flat, 0) - flat, [TS, G]) + esc_run
        esc = ESC + n * CAP + start
        tl.store(esc, (PA >> 24).to(tl.uint8), mask=(cnt > 0) & (start < CAP))
        raw = cnt == 5
        tl.store(esc + 1, PB.to(tl.uint8), mask=raw & (start + 1 < CAP))
        tl.store(esc + 2, (PB >> 8).to(tl.uint8), mask=raw & (start + 2 < CAP))
        tl.store(esc + 3, (PB >> 16).to(tl.uint8), mask=raw & (start + 3 < CAP))
        tl.store(esc + 4, (PB >> 24).to(tl.uint8), mask=raw & (start + 4 < CAP))
        esc_run = esc_run + tl.sum(flat, 0)
    if ZERO_FILL:
        p = tl.arange(0, CAP_P2)
        tl.store(ESC + n * CAP + p, tl.zeros([CAP_P2], tl.uint8), mask=(p < CAP) & (p >= esc_run))
    tl.store(ESC_LEN + n, esc_run)
    tl.store(FITS + n, (esc_run <= LIMIT).to(tl.int8))


@triton.jit
def _append_escapes_kernel(ESC, CAP, LEN, DST, HEAP, CHUNK: tl.constexpr):
    """Copy the first LEN[i] bytes of escape row i to HEAP[DST[i]:] (rows with DST[i] < 0 skipped)."""
    i = tl.program_id(0).to(tl.int64)
    dst = tl.load(DST + i)
    ln = tl.load(LEN + i)
    if dst >= 0:
        for c in range(0, ln, CHUNK):
            p = c + tl.arange(0, CHUNK)
            b = tl.load(ESC + i * CAP + p, mask=p < ln)
            tl.store(HEAP + dst + p, b, mask=p < ln)


def _check_geometry(geometry: BlockGeometry) -> None:
    if geometry.group_axis != "channel":
        raise NotImplementedError(
            "the Triton kernels implement group_axis='channel' only; use gaac_hf.codec for 'token'"
        )
    g = geometry
    # the kernels write/read every byte of a slot as one of the planes: no padding gaps allowed
    ends = (g.sm_bytes, g.lo2_offset + g.lo2_bytes, g.hi1_offset + g.hi1_bytes, g.tag_offset + g.tag_bytes)
    starts = (g.lo2_offset, g.hi1_offset, g.tag_offset, g.slot_bytes)
    if ends != starts:
        raise NotImplementedError(f"slot layout with padding gaps is not supported: {g}")


def _bases(base: torch.Tensor, n: int, d: int, name: str) -> tuple[torch.Tensor, int]:
    if base.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8, got {base.dtype}")
    if base.dim() == 1:
        base = base.unsqueeze(0)
    if base.dim() != 2 or base.shape[1] != d or base.shape[0] not in (1, n):
        raise ValueError(f"{name} must be [D] or [N, D] = [{n}, {d}], got {tuple(base.shape)}")
    base = base.contiguous()
    return base, (0 if base.shape[0] == 1 else d)


def encode_blocks_triton(
    x: torch.Tensor,
    base8: torch.Tensor,
    base16: torch.Tensor,
    geometry: BlockGeometry,
    *,
    slots: torch.Tensor | None = None,
    escape_width: int | None = None,
    with_tags: bool = False,
    fast: bool = True,
    launch: LaunchConfig | None = None,
) -> EncodedBlocks:
    """Encode N BF16 blocks into slots + escape rows in one launch (byte-identical to
    ``codec.encode_blocks``).

    Args:
        x: bf16 ``[N, T, D]``, T = geometry.block_size, D = geometry.head_dim.
        base8, base16: uint8 ``[D]`` or ``[N, D]`` window starts per channel.
        geometry: the block format (group_axis must be "channel").
        slots: optional preallocated uint8 ``[N, slot_bytes]`` to write into (e.g. rows of a slot
            pool); every byte of each row is written.
        escape_width: width W of the escape rows. Default ``geometry.max_escape_bytes`` with zeros
            past each stream (the reference's rows exactly). A smaller W (e.g.
            ``geometry.escape_limit``, as the cache uses before :func:`append_escapes_triton`)
            truncates longer streams (their blocks do not fit anyway) and skips the zero fill.
        fast: the group-layout kernel (BF16 pairs in 32-bit words, sub-tiles of ``launch.tile_tokens``
            rows, default 16) instead of the block-tile kernel; same bytes, and the faster on the
            H200 (``eval/results/codec_h200_rowscan.json``).
        with_tags: also write the per-group modes (int32 ``[N, T, D/8]``, as the reference's
            ``tags``) for mode statistics; +25% bytes written, so off by default (tags=None).
    Returns:
        ``EncodedBlocks(slots [N, slot_bytes] uint8, escapes [N, W] uint8, escape_len [N] int32,
        fits [N] bool, tags)``.
    """
    _check_geometry(geometry)
    if x.dtype != torch.bfloat16 or x.dim() != 3 or x.shape[1:] != (geometry.block_size, geometry.head_dim):
        raise ValueError(
            f"expected bf16 [N, {geometry.block_size}, {geometry.head_dim}], got {x.dtype} {tuple(x.shape)}"
        )
    n, t, d = x.shape
    b8, s8 = _bases(base8, n, d, "base8")
    b16, s16 = _bases(base16, n, d, "base16")
    if s8 != s16:  # one stride serves both
        b8, b16 = b8.expand(n, d).contiguous(), b16.expand(n, d).contiguous()
        s8 = d
    if slots is None:
        slots = torch.empty(n, geometry.slot_bytes, dtype=torch.uint8, device=x.device)
    elif slots.dtype != torch.uint8 or slots.shape != (n, geometry.slot_bytes) or not slots.is_contiguous():
        raise ValueError(f"slots must be contiguous uint8 [{n}, {geometry.slot_bytes}]")
    full = escape_width is None
    w = geometry.max_escape_bytes if full else int(escape_width)
    if not 0 < w <= geometry.max_escape_bytes:
        raise ValueError(f"escape_width must be in [1, {geometry.max_escape_bytes}], got {w}")
    escapes = torch.empty(n, w, dtype=torch.uint8, device=x.device)
    esc_len = torch.empty(n, dtype=torch.int32, device=x.device)
    fits = torch.empty(n, dtype=torch.int8, device=x.device)
    tags = torch.empty(n, t, d // 8, dtype=torch.int32, device=x.device) if with_tags else None
    if n:
        g = geometry
        kern = _encode_groups_kernel if fast else _encode_kernel
        extra = dict(TS=min((launch or DEFAULT_LAUNCH).tile_tokens or 16, t)) if fast else {}
        kern[(n,)](
            x.contiguous().view(torch.int16), b8, b16, slots, escapes, esc_len, fits, tags if with_tags else esc_len, s8,
            SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset,
            CAP=w, CAP_P2=max(16, triton.next_power_of_2(w)), LIMIT=g.escape_limit, ZERO_FILL=full,
            T=t, D=d, WRITE_TAGS=with_tags, num_warps=4 if fast else max(4, t * d // 1024), **extra,
        )
    return EncodedBlocks(slots=slots, escapes=escapes, escape_len=esc_len, fits=fits.bool(), tags=tags)


def append_escapes_triton(enc: EncodedBlocks, heap: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Append the escape streams of the fitting blocks of ``enc`` to an escape heap, in block order
    (the layout of ``codec.pack_escapes``), without a host sync.

    Args:
        enc: output of :func:`encode_blocks_triton` (escape rows of any width).
        heap: uint8 ``[M]``; the caller guarantees room: ``used + sum(escape_len[fits]) <= M``.
        used: int64 ``[]`` or ``[1]`` device tensor, bytes of the heap in use; advanced in place.
    Returns:
        int64 ``[N]``: each block's stream offset in the heap (meaningless where ``~fits``).
    """
    lens = torch.where(enc.fits, enc.escape_len.to(torch.int64), 0)
    ends = torch.cumsum(lens, 0) + used.reshape(())
    start = ends - lens
    n = lens.shape[0]
    if n:
        dst = torch.where(enc.fits, start, -1)
        _append_escapes_kernel[(n,)](enc.escapes, enc.escapes.shape[1], enc.escape_len, dst, heap, CHUNK=256)
        used.copy_(ends[-1].reshape(used.shape))
    return start
