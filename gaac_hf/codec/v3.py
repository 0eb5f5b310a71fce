"""Reference GAAC v3 codec in PyTorch: the executable spec of ``docs/FORMAT_V3.md``.

Lossless contract: for every BF16 bit pattern (NaN payloads, +-Inf, +-0, subnormals),
``decode_blocks_v3(encode_blocks_v3(x, ...).data, ...)`` returns the same 16 bits for every block
(blocks with ``fits == False`` decode too; they are only *stored* raw because they would not save bytes).
Vectorized: the only Python loops run over the 16 fixed field positions of a chunk, never over values,
groups or blocks. Runs on any device torch runs on; the CUDA kernels in ``kernels/cuda/gaac_v3`` must
match it byte for byte (encoder) and bit for bit (decoder).

Shapes: N blocks, T = block_size tokens, D = head_dim, C = chunks per block, G = 4C groups.

Exponent coding (per group of 8 channels of one token, windows from the calibration table):
  3-bit: c = e - base8 in [0, 8)            low 3 bits in the code words, nothing else
  4-bit: c = e - base16 in [0, 16)          low 3 bits in the code words, bit 3 in its entry
  raw:   c = (e - base16) mod 256           low 3 bits in the code words, bit 3 in its entry, bits 4..7 in a raw word
Decoding: e = base8 + c for groups without an entry; e = (base16 + c) mod 256 for listed groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format.v3 import (
    ALIGN, CHUNK_ROWS, CODE_WORDS, ENTRY_RAW, GROUP, MODE_3BIT, MODE_4BIT, MODE_RAW, SEGMENT_CHUNKS, SPLIT_PAIR,
    GeometryV3,
)

#: (word, shift) of the regular pairs q = 0..14; pair 15 is split over bit 15/31 of the three words
FIELDS = [(q // 5, 3 * (q % 5)) for q in range(SPLIT_PAIR)]


# ---------------------------------------------------------------------------------------------
# layout helpers
# ---------------------------------------------------------------------------------------------
def split_bf16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 -> (int32 exponent field, int32 sign<<7|mantissa byte), same shape."""
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return (bits >> 7) & 0xFF, ((bits >> 8) & 0x80) | (bits & 0x7F)


def join_bf16(exponent: torch.Tensor, sm: torch.Tensor) -> torch.Tensor:
    bits = ((sm & 0x80) << 8) | (exponent << 7) | (sm & 0x7F)
    return bits.to(torch.int16).view(torch.bfloat16)


def to_chunks(t: torch.Tensor, g: GeometryV3) -> torch.Tensor:
    """[N, T, D] -> [N, C, 4, 8] (chunk c = band * cols + col; row r; channel j of the group)."""
    n = t.shape[0]
    return t.reshape(n, g.bands, CHUNK_ROWS, g.cols, GROUP).permute(0, 1, 3, 2, 4).reshape(n, g.chunks, CHUNK_ROWS, GROUP)


def from_chunks(t: torch.Tensor, g: GeometryV3) -> torch.Tensor:
    n = t.shape[0]
    return t.reshape(n, g.bands, g.cols, CHUNK_ROWS, GROUP).permute(0, 1, 3, 2, 4).reshape(n, g.block_size, g.head_dim)


def chunk_bases(base: torch.Tensor, n: int, g: GeometryV3, name: str) -> torch.Tensor:
    """uint8 [D] or [N, D] -> int32 [N, C, 1, 8], the bases of each chunk's 8 channels."""
    if not isinstance(base, torch.Tensor) or base.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8 exponent bases, got {getattr(base, 'dtype', type(base))}")
    if base.dim() == 1:
        base = base.unsqueeze(0)
    if base.dim() != 2 or base.shape[-1] != g.head_dim or base.shape[0] not in (1, n):
        raise ValueError(f"{name} must have shape [head_dim] or [N, head_dim] = [{n}, {g.head_dim}], got {tuple(base.shape)}")
    b = base.to(torch.int32).expand(n, g.head_dim).reshape(n, 1, g.cols, 1, GROUP)
    return b.expand(n, g.bands, g.cols, 1, GROUP).reshape(n, g.chunks, 1, GROUP)


def code_word_index(g: GeometryV3, device) -> torch.Tensor:
    """int64 [C, 3]: position (in 32-bit words, from the code area) of word k of chunk c."""
    c = torch.arange(g.chunks, device=device)
    s, lane = c // SEGMENT_CHUNKS, c % SEGMENT_CHUNKS
    m = torch.clamp(g.chunks - SEGMENT_CHUNKS * s, max=SEGMENT_CHUNKS)
    k = torch.arange(CODE_WORDS, device=device)
    return (CODE_WORDS * SEGMENT_CHUNKS * s + lane)[:, None] + k[None, :] * m[:, None]


def pack_code_words(lo3: torch.Tensor) -> torch.Tensor:
    """lo3 int32 [..., 4, 8] (a chunk's low code bits) -> int64 [..., 3] code words."""
    even = lo3[..., 0::2].flatten(-2).to(torch.int64)  # [..., 16]: pair q = 4r + p, channel 2p
    odd = lo3[..., 1::2].flatten(-2).to(torch.int64)
    words = [torch.zeros_like(even[..., 0]) for _ in range(CODE_WORDS)]
    for q, (k, sh) in enumerate(FIELDS):
        words[k] = words[k] | (even[..., q] << sh) | (odd[..., q] << (16 + sh))
    for b in range(CODE_WORDS):  # the split pair
        words[b] = words[b] | (((even[..., SPLIT_PAIR] >> b) & 1) << 15) | (((odd[..., SPLIT_PAIR] >> b) & 1) << 31)
    return torch.stack(words, -1)


def unpack_code_words(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_code_words`: int64 [..., 3] -> int32 [..., 4, 8]."""
    ev, od = [], []
    for k, sh in FIELDS:
        ev.append((words[..., k] >> sh) & 7)
        od.append((words[..., k] >> (16 + sh)) & 7)
    ev.append(sum(((words[..., b] >> 15) & 1) << b for b in range(CODE_WORDS)))
    od.append(sum(((words[..., b] >> 31) & 1) << b for b in range(CODE_WORDS)))
    pairs = torch.stack([torch.stack(ev, -1), torch.stack(od, -1)], -1)  # [..., 16, 2]
    return pairs.reshape(*words.shape[:-1], CHUNK_ROWS, GROUP).to(torch.int32)


def _u32_bytes(w: torch.Tensor) -> torch.Tensor:
    """int64 [..., k] (values < 2**32) -> uint8 [..., 4k], little-endian."""
    sh = torch.arange(4, device=w.device, dtype=torch.int64) * 8
    return ((w.unsqueeze(-1) >> sh) & 0xFF).to(torch.uint8).flatten(-2)


def _gather_u32(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """int64 little-endian words at byte offsets ``idx`` of a uint8 pool (out-of-range bytes read 0)."""
    src = torch.cat([pool, pool.new_zeros(4)]).to(torch.int64)
    m = pool.numel()
    out = torch.zeros_like(idx)
    for b in range(4):
        j = idx + b
        out |= src[torch.where((j >= 0) & (j < m), j, m)] << (8 * b)
    return out


def _align(x: torch.Tensor, a: int) -> torch.Tensor:
    return (x + a - 1) // a * a


# ---------------------------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------------------------
@dataclass
class EncodedBlocksV3:
    """Output of :func:`encode_blocks_v3`.

    data:   uint8 ``[N, geometry.raw_bytes]``: row i holds block i's bytes in its first ``nbytes[i]``
            (those past the row are dropped: such a block has ``fits == False``), zeros after.
    nbytes: int32 ``[N]``: stored length of each compressed block (16-byte multiple).
    fits:   bool ``[N]``: ``nbytes <= raw_bytes``; False -> store the block raw (BF16).
    modes:  int32 ``[N, T, D/8]`` mode of every group (statistics only; not stored as such).
    """

    data: torch.Tensor
    nbytes: torch.Tensor
    fits: torch.Tensor
    modes: torch.Tensor


def group_modes_v3(e: torch.Tensor, b8: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """int32 [..., 8] exponents with their bases -> int32 [...] mode of each group (the narrowest that fits)."""
    off8, off16 = e - b8, e - b16
    fit3 = ((off8 >= 0) & (off8 < 8)).all(-1)
    fit4 = ((off16 >= 0) & (off16 < 16)).all(-1)
    return torch.where(fit3, MODE_3BIT, torch.where(fit4, MODE_4BIT, MODE_RAW)).to(torch.int32)


def write_listing(rows: torch.Tensor, coded: torch.Tensor, mode: torch.Tensor, g: GeometryV3, *,
                  raw_word_bytes: int = 4, raw_bits: int = 4) -> torch.Tensor:
    """Write the code words, segment table, entries and raw words of N blocks into encoder rows.

    rows: uint8 ``[N, cap + 1]`` (column ``cap`` is a sink for bytes past the row). coded: int32
    ``[N, C, 4, 8]`` coded exponents; mode: int32 ``[N, C, 4]``. A raw group's word holds bits
    ``4 .. 4 + raw_bits`` of its 8 codes: channel 2p's at bit ``raw_bits * p``, channel 2p+1's at
    ``raw_bits * (4 + p)`` (BF16: 4 bits in a u32; FP8 E5M2: 1 bit in a u8), at offsets aligned to the
    word. Returns int64 ``[N]`` stored lengths (16-byte multiples).
    """
    n, dev, cap = rows.shape[0], rows.device, rows.shape[1] - 1
    words = pack_code_words(coded & 7)  # [N, C, 3]
    flat = torch.zeros(n, CODE_WORDS * g.chunks, dtype=torch.int64, device=dev)
    flat[:, code_word_index(g, dev).reshape(-1)] = words.reshape(n, -1)
    rows[:, g.code_offset : g.code_offset + g.code_bytes] = _u32_bytes(flat)

    # entries and raw words, in group order (chunk-major, row-minor)
    wide = (mode != MODE_3BIT).reshape(n, -1).to(torch.int64)  # [N, G]
    raw = (mode == MODE_RAW).reshape(n, -1).to(torch.int64)
    c_ = coded.to(torch.int64)
    p = torch.arange(4, device=dev, dtype=torch.int64)
    h = ((((c_[..., 0::2] >> 3) & 1) << p) | (((c_[..., 1::2] >> 3) & 1) << (4 + p))).sum(-1)  # [N, C, 4]
    rword = (((c_[..., 0::2] >> 4) << (raw_bits * p)) | ((c_[..., 1::2] >> 4) << (raw_bits * (4 + p)))).sum(-1)
    pos = (torch.arange(g.chunks, device=dev) % SEGMENT_CHUNKS)[:, None] * CHUNK_ROWS + torch.arange(CHUNK_ROWS, device=dev)
    entry = (pos.unsqueeze(0) | ((mode == MODE_RAW).to(torch.int64) << 7) | (h << 8)).reshape(n, -1)
    n_ent, n_raw = wide.sum(-1), raw.sum(-1)
    ent_rank = torch.cumsum(wide, -1) - wide
    raw_rank = torch.cumsum(raw, -1) - raw
    raw_off = _align(g.entry_offset + 2 * n_ent, raw_word_bytes)
    nbytes = _align(raw_off + raw_word_bytes * n_raw, ALIGN)

    def put(dest: torch.Tensor, keep: torch.Tensor, val: torch.Tensor, width: int) -> None:
        for b in range(width):
            d = dest + b
            d = torch.where(keep.bool() & (d < cap), d, cap)
            rows.scatter_(1, d, ((val >> (8 * b)) & 0xFF).to(torch.uint8))

    put(g.entry_offset + 2 * ent_rank, wide, entry, 2)
    put(raw_off[:, None] + raw_word_bytes * raw_rank, raw, rword.reshape(n, -1), raw_word_bytes)
    # segment table: entry and raw counts before each segment boundary
    cw = torch.cat([torch.zeros_like(wide[:, :1]), torch.cumsum(wide, -1)], -1)
    cr = torch.cat([torch.zeros_like(raw[:, :1]), torch.cumsum(raw, -1)], -1)
    bnd = torch.clamp(torch.arange(g.segments + 1, device=dev) * SEGMENT_CHUNKS * CHUNK_ROWS, max=g.groups)
    segtab = cw[:, bnd] | (cr[:, bnd] << 16)
    rows[:, g.segtab_offset : g.segtab_offset + g.segtab_bytes] = _u32_bytes(segtab)
    return nbytes


def encode_blocks_v3(x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry: GeometryV3) -> EncodedBlocksV3:
    """Encode N blocks.

    Args:
        x: BF16 ``[N, T, D]``.
        base8, base16: uint8 ``[D]`` or ``[N, D]`` window starts (base8 <= 248, base16 <= 240).
        geometry: the v3 block geometry.
    """
    g = geometry
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"GAAC encodes bfloat16 tensors, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 3 or tuple(x.shape[1:]) != (g.block_size, g.head_dim):
        raise ValueError(f"expected blocks of shape [N, {g.block_size}, {g.head_dim}], got {tuple(x.shape)}")
    n, dev, cap = x.shape[0], x.device, g.raw_bytes
    b8, b16 = chunk_bases(base8, n, g, "base8"), chunk_bases(base16, n, g, "base16")
    if n and (int(b8.max()) > 248 or int(b16.max()) > 240):
        raise ValueError("window bases out of range (base8 <= 248, base16 <= 240)")
    e, sm = split_bf16(x.contiguous())
    e, sm = to_chunks(e, g), to_chunks(sm, g)  # [N, C, 4, 8]
    mode = group_modes_v3(e, b8, b16)  # [N, C, 4]
    coded = torch.where((mode == MODE_3BIT)[..., None], e - b8, (e - b16) & 0xFF)
    rows = torch.zeros(n, cap + 1, dtype=torch.uint8, device=dev)  # column cap is a sink for dropped bytes
    rows[:, : g.numel] = sm.reshape(n, -1).to(torch.uint8)
    nbytes = write_listing(rows, coded, mode, g)
    fits = nbytes <= cap
    return EncodedBlocksV3(rows[:, :cap].contiguous(), nbytes.to(torch.int32), fits,
                           from_chunks(mode.unsqueeze(-1).expand(*mode.shape, GROUP), g)[..., ::GROUP].contiguous())


# ---------------------------------------------------------------------------------------------
# the pool and the block table
# ---------------------------------------------------------------------------------------------
def pack_blocks(enc: EncodedBlocksV3, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded rows (+ the BF16 blocks, for those that do not fit) -> (pool uint8 [M], entries int64 [N]).

    Block i's bytes are ``pool[entries[i] & ~15:]``: ``nbytes[i]`` compressed bytes, or ``raw_bytes``
    of BF16 when ``entries[i] & ENTRY_RAW``. ``start``: pool offset of the first block (16-byte multiple).
    """
    if start % ALIGN:
        raise ValueError(f"pool offsets must be multiples of {ALIGN}, got {start}")
    n, cap = enc.data.shape
    lens = torch.where(enc.fits, enc.nbytes.to(torch.int64), cap)
    offs = torch.cumsum(lens, 0) - lens
    src = torch.where(enc.fits[:, None], enc.data, x.reshape(n, -1).contiguous().view(torch.uint8).reshape(n, cap))
    keep = torch.arange(cap, device=src.device) < lens[:, None]
    return src[keep], offs + start + torch.where(enc.fits, 0, ENTRY_RAW)


# ---------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------
def decode_pool_v3(pool: torch.Tensor, entries: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor,
                   geometry: GeometryV3, *, validate: bool = True) -> torch.Tensor:
    """Decode N blocks of a pool through their block-table entries (compressed or raw).

    Args:
        pool: uint8 ``[M]``. entries: int64 ``[N]`` (see :func:`pack_blocks`).
        base8, base16: uint8 ``[D]`` or ``[N, D]``.
        validate: reject corrupt blocks (segment table, entry positions, lengths); one host sync.
    Returns: BF16 ``[N, T, D]``.
    """
    g = geometry
    if pool.dtype != torch.uint8 or pool.dim() != 1:
        raise ValueError(f"pool must be uint8 [M], got {pool.dtype} {tuple(pool.shape)}")
    if entries.dim() != 1 or entries.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"entries must be int [N], got {entries.dtype} {tuple(entries.shape)}")
    n, dev = entries.shape[0], pool.device
    entries = entries.to(dev, torch.int64)
    start = entries & ~(ALIGN - 1)
    is_raw = (entries & ENTRY_RAW).bool()
    if validate and n and (bool((entries & (ALIGN - 1) & ~ENTRY_RAW).any()) or int(start.min()) < 0):
        raise ValueError("corrupt GAAC v3 block table: entries must be 16-byte offsets (+1 for raw blocks)")
    byte = lambda off: pool[torch.clamp(off, 0, max(pool.numel() - 1, 0))].to(torch.int32)  # noqa: E731
    ar = torch.arange(g.numel, device=dev)
    out_bits = torch.empty(n, g.block_size, g.head_dim, dtype=torch.int32, device=dev)
    if bool(is_raw.any()):
        st = start[is_raw][:, None] + 2 * ar
        if validate and int(st.max()) + 1 >= pool.numel():
            raise ValueError("corrupt GAAC v3 block table: a raw block runs past the pool")
        out_bits[is_raw] = (byte(st) | (byte(st + 1) << 8)).reshape(-1, g.block_size, g.head_dim)
    c = ~is_raw
    if bool(c.any()):
        st = start[c]
        m = st.shape[0]
        sm = byte(st[:, None] + ar).reshape(m, g.chunks, CHUNK_ROWS, GROUP)
        widx = g.code_offset + 4 * code_word_index(g, dev).reshape(-1)
        words = _gather_u32(pool, st[:, None] + widx).reshape(m, g.chunks, CODE_WORDS)
        lo3 = unpack_code_words(words)
        b8 = chunk_bases(base8 if base8.dim() == 1 else base8[c], m, g, "base8")
        b16 = chunk_bases(base16 if base16.dim() == 1 else base16[c], m, g, "base16")
        e = b8 + lo3  # every group decoded as 3-bit first (the decoders' main path)
        e = _apply_entries(pool, st, e, lo3, b16, g, validate)
        out_bits[c] = (from_chunks(((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F), g))
    return out_bits.to(torch.int16).view(torch.bfloat16)


def _apply_entries(pool, st, e, lo3, b16, g: GeometryV3, validate: bool, *, raw_word_bytes: int = 4,
                   raw_bits: int = 4, exp_mask: int = 0xFF) -> torch.Tensor:
    """The fix-up pass: listed groups get e = (base16 + lo3 + 8 * high) & exp_mask (raw words as in
    :func:`write_listing`; BF16: defaults, FP8: ``codec.fp8``)."""
    m, dev = st.shape[0], st.device
    seg = _gather_u32(pool, st[:, None] + g.segtab_offset + 4 * torch.arange(g.segments + 1, device=dev))
    ent_start, raw_start = seg & 0xFFFF, seg >> 16
    n_ent = ent_start[:, -1]
    if validate:
        lim = torch.tensor([SEGMENT_CHUNKS * CHUNK_ROWS] * g.segments, device=dev)
        lim[-1] = g.groups - SEGMENT_CHUNKS * CHUNK_ROWS * (g.segments - 1)
        d_e, d_r = ent_start.diff(dim=-1), raw_start.diff(dim=-1)
        nb = _align(_align(g.entry_offset + 2 * n_ent, raw_word_bytes) + raw_word_bytes * raw_start[:, -1], ALIGN)
        if bool((ent_start[:, 0] != 0).any() | (raw_start[:, 0] != 0).any() | (d_e < 0).any() | (d_e > lim).any()
                | (d_r < 0).any() | (d_r > d_e).any()) or int((st + nb).max()) > pool.numel():
            raise ValueError("corrupt GAAC v3 block: bad segment table or block runs past the pool")
    jmax = int(n_ent.max())
    if jmax == 0:
        return e
    j = torch.arange(jmax, device=dev).expand(m, jmax)
    valid = j < n_ent[:, None]
    raw_hi = st[:, None] + g.entry_offset + 2 * j
    v = _gather_u32(pool, raw_hi) & 0xFFFF
    s = torch.searchsorted(ent_start[:, 1:].contiguous(), j.contiguous(), right=True).clamp(max=g.segments - 1)
    pos, is_raw, h = v & 0x7F, (v >> 7) & 1, v >> 8
    is_raw = is_raw * valid
    cum = torch.cumsum(is_raw, -1) - is_raw  # raw entries before j
    first = torch.gather(ent_start, 1, s)  # first entry of j's segment
    cum_first = torch.gather(torch.cat([cum, cum.new_zeros(m, 1)], -1), 1, first.clamp(max=jmax))
    ridx = torch.gather(raw_start, 1, s) + cum - cum_first
    raw_off = _align(g.entry_offset + 2 * n_ent, raw_word_bytes)
    R = (_gather_u32(pool, st[:, None] + raw_off[:, None] + raw_word_bytes * ridx) & ((1 << (8 * raw_word_bytes)) - 1)) * is_raw
    chunk = SEGMENT_CHUNKS * s + pos // CHUNK_ROWS
    if validate:
        mseg = torch.clamp(g.chunks - SEGMENT_CHUNKS * s, max=SEGMENT_CHUNKS)
        prev = torch.cat([torch.full_like(pos[:, :1], -1), pos[:, :-1]], -1)
        seg_first = j == first
        bad = valid & ((pos // CHUNK_ROWS >= mseg) | (~seg_first & (pos <= prev)))
        if bool(bad.any()):
            raise ValueError("corrupt GAAC v3 block: entry outside its segment or out of order")
    grp = torch.where(valid, chunk * CHUNK_ROWS + pos % CHUNK_ROWS, g.groups)  # g.groups = sink
    p = torch.arange(4, device=dev, dtype=torch.int64)
    rmask = (1 << raw_bits) - 1
    hi_even = ((h[..., None] >> p) & 1) | (((R[..., None] >> (raw_bits * p)) & rmask) << 1)  # [m, J, 4]
    hi_odd = ((h[..., None] >> (4 + p)) & 1) | (((R[..., None] >> (raw_bits * (4 + p))) & rmask) << 1)
    hi = torch.stack([hi_even, hi_odd], -1).reshape(m, jmax, GROUP).to(torch.int32)
    eg = e.reshape(m, -1, GROUP)
    eg = torch.cat([eg, eg.new_zeros(m, 1, GROUP)], 1)
    lo = torch.cat([lo3.reshape(m, -1, GROUP), lo3.new_zeros(m, 1, GROUP)], 1)
    bg = torch.cat([b16.expand(m, g.chunks, CHUNK_ROWS, GROUP).reshape(m, -1, GROUP), lo.new_zeros(m, 1, GROUP)], 1)
    gi = grp[..., None].expand(m, jmax, GROUP)
    fixed = (torch.gather(bg, 1, gi) + torch.gather(lo, 1, gi) + 8 * hi) & exp_mask
    eg.scatter_(1, gi, fixed)
    return eg[:, :-1].reshape(e.shape)


def decode_blocks_v3(data: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry: GeometryV3,
                     *, validate: bool = True) -> torch.Tensor:
    """Decode encoder rows ``data`` uint8 ``[N, W]`` (block i at the start of row i, W a multiple of 16)
    as compressed blocks. Returns BF16 ``[N, T, D]``."""
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % ALIGN:
        raise ValueError(f"data must be uint8 [N, W] with W a multiple of {ALIGN}, got {data.dtype} {tuple(data.shape)}")
    n, w = data.shape
    entries = torch.arange(n, device=data.device, dtype=torch.int64) * w
    return decode_pool_v3(data.reshape(-1), entries, base8, base16, geometry, validate=validate)


def stored_bytes(enc: EncodedBlocksV3, geometry: GeometryV3, entry_bytes: int = 8) -> torch.Tensor:
    """int64 [N]: bytes each block takes in a pool, with its block-table entry."""
    return torch.where(enc.fits, enc.nbytes.to(torch.int64), geometry.raw_bytes) + entry_bytes
