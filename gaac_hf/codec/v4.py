"""Reference GAAC v4 codec in PyTorch: the executable spec of ``gaac_hf/format/v4.py`` (register tiles,
fixed 4-bit lanes, sign/mantissa words).

Lossless contract: for every BF16 bit pattern, a block whose tiles fit (``fits``) decodes to the same
16 bits; a block that does not fit is stored as its BF16 bytes (``pack_blocks_v4``) and read back as such
(``decode_pool_v4``).

Host-sync free: ``encode_blocks_v4`` and ``pack_blocks_v4`` (and the decoders with ``validate=False``)
never read a tensor value on the host (no ``.item()``, ``.tolist()``, ``nonzero``, boolean-mask
indexing, data-dependent shapes or Python branches on values), so they run on CUDA inside a CUDA-graph
capture. The only Python loops run over fixed field positions (4 pairs, 2 halves, 3 record slots).

Shapes: N blocks, T = block_size, D = head_dim, n = N * T / 16 tiles, NP = D / 4 pairs per lane,
KS = D / 16 groups per lane, G = 32 * KS groups per tile.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format.v4 import (
    ALIGN, CODE_FIRST, ENTRY_RAW, GUARD, HIGH_FIRST, LANES, MAX_RAW_LANE, MAX_RAW_TILE, RAW_AT, RECORD_BYTES, SIDE,
    SIGN_MANT, TILE_ROWS, GeometryV4,
)

_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# layout helpers
# ---------------------------------------------------------------------------------------------
def lane_coords(head_dim: int, kind: str, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) int64 ``[32, NP, 2]``: token row (0..15) and channel of value h of pair q held by lane l
    in a 16 x D tile (K: A = K; V: A = V^T, so a V pair spans two tokens of one channel)."""
    if kind not in ("k", "v"):
        raise ValueError(f"kind must be 'k' or 'v', got {kind!r}")
    l = torch.arange(LANES, device=device).view(LANES, 1, 1)
    q = torch.arange(head_dim // 4, device=device).view(1, -1, 1)
    h = torch.arange(2, device=device).view(1, 1, 2)
    g, t, s, j = l // 4, l % 4, q // 4, q % 4
    if kind == "k":
        row = g + 8 * (j & 1) + 0 * h
        col = 16 * s + 2 * t + 8 * (j >> 1) + h
    else:
        row = 2 * t + 8 * (j >> 1) + h
        col = 16 * s + g + 8 * (j & 1) + 0 * h
    shape = (LANES, head_dim // 4, 2)
    return row.expand(shape), col.expand(shape)


def _perm(head_dim: int, kind: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat index row * D + col [32 * NP * 2] in lane order, channel of each [32 * NP * 2])."""
    row, col = lane_coords(head_dim, kind, device)
    return (row * head_dim + col).reshape(-1), col.reshape(-1)


def _field_shifts(first: int, device) -> torch.Tensor:
    """int64 [8]: bit of value 2 j + h of a group (pair j, half h) in its code / record word, before the
    mod-32 fold: first + 16 h + 4 j (a 4-bit field at bit p occupies bits p .. p + 3 mod 32)."""
    v = torch.arange(8, device=device)
    return first + 16 * (v % 2) + 4 * (v // 2)


def _sm_shifts(device) -> torch.Tensor:
    """int64 [4]: bit of the four values of sign/mantissa word k (pair 2k low, high; pair 2k+1 low, high)
    masked to SIGN_MANT & 0xFFFF, before the fold: 0, 16, 8, 24 (pair 2k+1 = rotl(pair, 8))."""
    v = torch.arange(4, device=device)
    return 16 * (v % 2) + 8 * (v // 2)


def _pack_fields(v: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Disjoint bit fields v ``[..., F]`` at bits ``shifts`` ``[F]`` mod 32 (each field's bits above 31 wrap
    to the bottom: a rotate left) -> u32 words int64 ``[...]``."""
    t = (v.to(torch.int64) << shifts).sum(-1)  # disjoint fields: the sum is an or
    return (t & _M32) | (t >> 32)


def _unpack_fields(w: torch.Tensor, shifts: torch.Tensor, mask: int) -> torch.Tensor:
    """Inverse of :func:`_pack_fields`: u32 words int64 ``[...]`` -> fields ``[..., F]`` (rotr(w, p) & mask)."""
    return ((w | (w << 32)).unsqueeze(-1) >> shifts) & mask  # the doubled word: bits p .. p + 15 = rotr(w, p)


def _words_to_bytes(w: torch.Tensor) -> torch.Tensor:
    """int64 u32 values ``[..., k]`` -> uint8 ``[..., 4 k]`` little-endian (via int32 bits)."""
    s = (w - ((w >> 31) << 32)).to(torch.int32).contiguous()
    return s.view(torch.uint8)


def _bytes_to_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4 k]`` -> int64 u32 values ``[..., k]`` (little-endian)."""
    return b.contiguous().view(torch.int32).to(torch.int64) & _M32


def _tile_bases(base16: torch.Tensor, n_blocks: int, g: GeometryV4, name: str = "base16") -> torch.Tensor:
    """uint8 ``[D]`` or ``[N, D]`` -> int32 ``[N or 1, 1, D]`` (a tile's bases = its block's)."""
    if not isinstance(base16, torch.Tensor) or base16.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8 exponent bases, got {getattr(base16, 'dtype', type(base16))}")
    if base16.dim() == 1:
        base16 = base16.unsqueeze(0)
    if base16.dim() != 2 or base16.shape[-1] != g.head_dim or base16.shape[0] not in (1, n_blocks):
        raise ValueError(f"{name} must have shape [head_dim] or [N, head_dim] = [{n_blocks}, {g.head_dim}], "
                         f"got {tuple(base16.shape)}")
    return base16.to(torch.int32).unsqueeze(1)


def _check_kind(kind: str) -> None:
    if kind not in ("k", "v"):
        raise ValueError(f"kind must be 'k' or 'v', got {kind!r}")


# ---------------------------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------------------------
@dataclass
class EncodedBlocksV4:
    """Output of :func:`encode_blocks_v4`.

    data:       uint8 ``[N, block_bytes]``: the tiles of each block (meaningful only where ``fits``).
    fits:       bool ``[N]``: every tile has <= 3 raw groups and <= 1 per lane; False -> store as BF16.
    raw_groups: int64 ``[N]``: raw groups per block (all its tiles, fitting or not).
    """

    data: torch.Tensor
    fits: torch.Tensor
    raw_groups: torch.Tensor


def encode_blocks_v4(x: torch.Tensor, base16: torch.Tensor, geometry: GeometryV4, kind: str) -> EncodedBlocksV4:
    """Encode N blocks of one kind (K or V) without a host synchronisation.

    Args:
        x: BF16 ``[N, T, D]``.
        base16: uint8 ``[N, D]`` (per block) or ``[D]``: the window start of every channel (0..255).
        geometry: the v4 geometry (T = block_size, D = head_dim).
        kind: ``"k"`` or ``"v"`` (the lane layout).
    """
    g = geometry
    _check_kind(kind)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"GAAC encodes bfloat16 tensors, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 3 or tuple(x.shape[1:]) != (g.block_size, g.head_dim):
        raise ValueError(f"expected blocks of shape [N, {g.block_size}, {g.head_dim}], got {tuple(x.shape)}")
    N, D, dev = x.shape[0], g.head_dim, x.device
    n, NP, KS, tiles = N * g.tiles, g.pairs, g.ksteps, g.tiles
    perm, col = _perm(D, kind, dev)
    bc = _tile_bases(base16, N, g).to(dev)[:, :, col]                        # int32 [N|1, 1, 16 D]
    bits = x.contiguous().view(torch.int16).reshape(n, TILE_ROWS * D)[:, perm].to(torch.int32) & 0xFFFF
    off = (((bits >> 7) & 0xFF).reshape(N, tiles, TILE_ROWS * D) - bc).reshape(n, LANES, KS, 8)
    raw = ((off & -16) != 0).any(-1)                  # [n, 32, KS]: a value with e - base16 outside [0, 16)
    # sign/mantissa words: pair 2k at its BF16 places, pair 2k+1 rotated left by 8
    smw = _pack_fields((bits & SIGN_MANT & 0xFFFF).reshape(n, LANES, NP // 2, 4), _sm_shifts(dev))  # [n, 32, NP / 2]
    sm_plane = smw.reshape(n, LANES, NP // 8, 4).permute(0, 2, 1, 3)          # uint4 [NP / 8][32 lanes]
    cg = off & 0xFF                                                          # c = (e - base16) mod 256
    code = _pack_fields(cg & 0xF, _field_shifts(CODE_FIRST, dev))            # [n, 32, KS]
    code_plane = code.reshape(n, LANES, KS // 4, 4).permute(0, 2, 1, 3)       # uint4 [KS / 4][32 lanes]
    high = _pack_fields(cg >> 4, _field_shifts(HIGH_FIRST, dev)).reshape(n, LANES * KS)  # [n, G], lane-major
    # raw records: record r = the raw group of rank r (group order: lane-major, then s)
    rf = raw.reshape(n, LANES * KS).to(torch.int64)
    rank = torch.cumsum(rf, 1) - rf
    gi = torch.arange(LANES * KS, device=dev, dtype=torch.int64)
    meta = (gi // KS) | ((gi % KS) << 8)                                     # u8 lane, u8 s, u16 0
    n_raw = rf.sum(1)
    side = [n_raw.clamp(max=255), torch.zeros_like(n_raw)]                   # u8 n_raw, 7 x 0
    for r in range(MAX_RAW_TILE):
        sel = rf * (rank == r)                                               # one-hot over groups (or none)
        side += [(sel * high).sum(1), (sel * meta).sum(1)]
    side = torch.stack(side, 1)                                              # [n, SIDE / 4] u32
    assert side.shape[1] * 4 == SIDE == RAW_AT + RECORD_BYTES * MAX_RAW_TILE
    words = torch.cat([sm_plane.reshape(n, 4 * D), code_plane.reshape(n, 2 * D), side], 1)
    data = _words_to_bytes(words).reshape(N, g.block_bytes)
    tile_fits = (n_raw <= MAX_RAW_TILE) & (raw.sum(-1) <= MAX_RAW_LANE).all(-1)
    return EncodedBlocksV4(data, tile_fits.reshape(N, tiles).all(1), rf.reshape(N, tiles * LANES * KS).sum(1))


# ---------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------
def _decode_tiles(t: torch.Tensor, b: torch.Tensor, g: GeometryV4, kind: str,
                  check: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiles uint8 ``[n, tile_bytes]`` with bases int32 ``[n, 1, D]`` -> (BF16 bits int32 ``[n, 16 * D]``
    row-major, bool ``[n]``: structurally impossible tile, computed when ``check``). A lane keeps the last
    record r < n_raw naming it (the kernel's rule); a record with s >= KS names no group."""
    n, D, dev = t.shape[0], g.head_dim, t.device
    NP, KS = g.pairs, g.ksteps
    perm, col = _perm(D, kind, dev)
    w = _bytes_to_words(t)                                                   # [n, tile_bytes / 4]
    nsm, ncode = 4 * D, 2 * D
    smw = w[:, :nsm].reshape(n, NP // 8, LANES, 4).permute(0, 2, 1, 3).reshape(n, LANES, NP // 2)
    sm = _unpack_fields(smw, _sm_shifts(dev), SIGN_MANT & 0xFFFF).to(torch.int32)  # [n, 32, NP / 2, 4]
    code = w[:, nsm: nsm + ncode].reshape(n, KS // 4, LANES, 4).permute(0, 2, 1, 3).reshape(n, LANES, KS)
    side = w[:, nsm + ncode:]                                                # [n, 8]
    n_raw = side[:, 0] & 0xFF
    lanes = torch.arange(LANES, device=dev)
    rs = torch.full((n, LANES), 0xFF, dtype=torch.int64, device=dev)         # the lane's raw group (none: 0xFF)
    hw = torch.zeros(n, LANES, dtype=torch.int64, device=dev)
    hits = torch.zeros(n, LANES, dtype=torch.int64, device=dev)
    bad = (n_raw > MAX_RAW_TILE) | ((side[:, 0] >> 8) != 0) | (side[:, 1] != 0)
    for r in range(MAX_RAW_TILE):
        at = (RAW_AT + RECORD_BYTES * r) // 4
        rw, rm = side[:, at], side[:, at + 1]
        used = r < n_raw
        hit = used[:, None] & ((rm & 0xFF)[:, None] == lanes)
        rs = torch.where(hit, ((rm >> 8) & 0xFF)[:, None], rs)
        hw = torch.where(hit, rw[:, None], hw)
        hits = hits + hit.to(torch.int64)
        bad |= used & (((rm & 0xFF) >= LANES) | (((rm >> 8) & 0xFF) >= KS) | ((rm >> 16) != 0))
        bad |= ~used & ((rw != 0) | (rm != 0))
    bad |= (hits > MAX_RAW_LANE).any(1)
    is_raw = torch.arange(KS, device=dev) == rs[..., None]                   # [n, 32, KS]
    hg = torch.where(is_raw, hw[..., None], 0)                               # the group's high-nibble word
    c = (_unpack_fields(code, _field_shifts(CODE_FIRST, dev), 0xF)
         | (_unpack_fields(hg, _field_shifts(HIGH_FIRST, dev), 0xF) << 4)).to(torch.int32)  # [n, 32, KS, 8]
    bv = b[:, :, col].reshape(n, LANES, KS, 8)
    e = bv + c
    if check:  # a group without a record is 4-bit: base16 + code < 256 (the kernel's 4-bit path does not wrap)
        bad |= ((e > 255) & ~is_raw[..., None]).flatten(1).any(1)
    vals = (sm.reshape(n, TILE_ROWS * D) | ((e & 0xFF) << 7).reshape(n, TILE_ROWS * D))
    out = torch.empty_like(vals)
    out[:, perm] = vals
    return out, bad


def _as_bf16(bits: torch.Tensor, shape) -> torch.Tensor:
    return (bits - ((bits >> 15) << 16)).to(torch.int16).reshape(shape).view(torch.bfloat16)


def decode_blocks_v4(data: torch.Tensor, base16: torch.Tensor, geometry: GeometryV4, kind: str,
                     validate: bool | None = None) -> torch.Tensor:
    """Decode compressed blocks: uint8 ``[N, block_bytes]`` with bases uint8 ``[N, D]`` or ``[D]`` -> BF16
    ``[N, T, D]`` (meaningful only for blocks that fit).

    validate (default: on CPU only; one host sync): raise ValueError for a structurally impossible block
    (n_raw > 3, a record's lane >= 32 or k-step >= KS, two records for one lane, nonzero reserved bytes, a
    group without a record whose base16 + code exceeds 255)."""
    g = geometry
    _check_kind(kind)
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != g.block_bytes:
        raise ValueError(f"data must be uint8 [N, {g.block_bytes}], got {data.dtype} {tuple(data.shape)}")
    N = data.shape[0]
    b = _tile_bases(base16, N, g).to(data.device).expand(N, 1, g.head_dim)
    b = b[:, None].expand(N, g.tiles, 1, g.head_dim).reshape(N * g.tiles, 1, g.head_dim)  # [n, 1, D]
    validate = data.device.type == "cpu" if validate is None else validate
    bits, bad = _decode_tiles(data.reshape(N * g.tiles, g.tile_bytes), b, g, kind, validate)
    if validate and bool(bad.any()):
        blk = sorted({int(i) // g.tiles for i in bad.nonzero().reshape(-1)[:8]})
        raise ValueError(f"corrupt GAAC v4 block(s) {blk}: a tile's side area or code plane is structurally impossible")
    return _as_bf16(bits, (N, g.block_size, g.head_dim))


# ---------------------------------------------------------------------------------------------
# the pool and the block table
# ---------------------------------------------------------------------------------------------
def stored_lengths(fits: torch.Tensor, geometry: GeometryV4) -> torch.Tensor:
    """int64 ``[N]``: bytes each block takes in a pool (block_bytes, or raw_bytes when it does not fit)."""
    return torch.where(fits, geometry.block_bytes, geometry.raw_bytes).to(torch.int64)


def pool_offsets(fits: torch.Tensor, geometry: GeometryV4, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets int64 ``[N]``, end int64 scalar tensor): blocks back to back from ``start`` (host-sync free).
    A pool for them needs ``end + GUARD`` bytes."""
    lens = stored_lengths(fits, geometry)
    ends = torch.cumsum(lens, 0) + start
    return ends - lens, ends[-1] if lens.numel() else torch.zeros((), dtype=torch.int64, device=fits.device) + start


def pack_blocks_v4(enc: EncodedBlocksV4, x: torch.Tensor, pool: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Write block i at byte ``offsets[i]`` of ``pool`` in place: its encoded bytes when it fits, else x[i]'s
    BF16 bytes (row-major, raw_bytes). Host-sync free: every block writes raw_bytes / 16 units of 16 bytes,
    the units past its stored length go to the pool's last 16-byte unit (the GUARD area, which no block may
    occupy and no reader reads as data; its content afterwards is unspecified).

    Args: enc from :func:`encode_blocks_v4`; x BF16 ``[N, T, D]`` (the same blocks); pool uint8 ``[P]``,
    P a multiple of 16; offsets int64 ``[N]``, multiples of 16 with ``offsets[i] + stored_lengths[i] <= P - 16``
    (not checked: that would read the offsets on the host). Returns the block-table entries
    ``offsets | ENTRY_RAW * ~fits`` int64 ``[N]``.
    """
    N, W = enc.data.shape
    raw_bytes = 2 * x.shape[1] * x.shape[2] if x.dim() == 3 else 0
    if x.dtype != torch.bfloat16 or x.dim() != 3 or x.shape[0] != N or raw_bytes % ALIGN:
        raise ValueError(f"x must be the BF16 [N={N}, T, D] blocks that were encoded, got {x.dtype} {tuple(x.shape)}")
    if pool.dtype != torch.uint8 or pool.dim() != 1 or pool.numel() % ALIGN or pool.numel() < GUARD:
        raise ValueError(f"pool must be uint8 [P] with P a multiple of {ALIGN} (>= {GUARD}), "
                         f"got {pool.dtype} {tuple(pool.shape)}")
    if offsets.shape != (N,):
        raise ValueError(f"offsets must be int [N={N}], got {tuple(offsets.shape)}")
    dev = pool.device
    fits = enc.fits.to(dev)
    offsets = offsets.to(dev, torch.int64)
    U = raw_bytes // ALIGN
    comp = torch.cat([enc.data.to(dev), enc.data.new_zeros(N, raw_bytes - W, device=dev)], 1)
    src = torch.where(fits[:, None], comp, x.to(dev).contiguous().view(torch.uint8).reshape(N, raw_bytes))
    units = torch.arange(U, device=dev)
    keep = units < torch.where(fits, W // ALIGN, U)[:, None]
    sink = pool.numel() // ALIGN - 1
    idx = torch.where(keep, offsets[:, None] // ALIGN + units, sink)
    pool.view(-1, ALIGN).index_put_((idx.reshape(-1),), src.reshape(N * U, ALIGN))
    return offsets | (~fits).to(torch.int64) * ENTRY_RAW


def decode_pool_v4(pool: torch.Tensor, entries: torch.Tensor, base16: torch.Tensor, geometry: GeometryV4, kind: str,
                   validate: bool | None = None) -> torch.Tensor:
    """Read N blocks of a pool through their table entries: BF16 entries (``& ENTRY_RAW``) bit for bit,
    compressed ones decoded. pool uint8 ``[P]``, entries int64 ``[N]``, base16 uint8 ``[N, D]`` or ``[D]``
    -> BF16 ``[N, T, D]``. validate (default: on CPU only): entries 16-byte aligned and inside the pool,
    compressed blocks structurally possible (see :func:`decode_blocks_v4`); ValueError otherwise."""
    g = geometry
    _check_kind(kind)
    if pool.dtype != torch.uint8 or pool.dim() != 1:
        raise ValueError(f"pool must be uint8 [P], got {pool.dtype} {tuple(pool.shape)}")
    if entries.dim() != 1 or entries.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"entries must be int [N], got {entries.dtype} {tuple(entries.shape)}")
    validate = pool.device.type == "cpu" if validate is None else validate
    N, dev = entries.shape[0], pool.device
    entries = entries.to(dev, torch.int64)
    is_raw = (entries & ENTRY_RAW) != 0
    start = entries & ~(ALIGN - 1)
    if validate and N:
        end = start + stored_lengths(~is_raw, g)
        if bool(((entries & (ALIGN - 1) & ~ENTRY_RAW) != 0).any() | (start < 0).any() | (end > pool.numel()).any()):
            raise ValueError("corrupt GAAC v4 block table: entries must be 16-byte offsets (+1 for BF16 blocks) "
                             "of blocks inside the pool")
    U, P16 = g.raw_bytes // ALIGN, pool.numel() // ALIGN
    units = pool[: P16 * ALIGN].view(P16, ALIGN)
    idx = (start[:, None] // ALIGN + torch.arange(U, device=dev)).clamp(0, max(P16 - 1, 0))
    rows = units[idx].reshape(N, U * ALIGN) if P16 else pool.new_zeros(N, U * ALIGN)
    raw_bits = rows.view(torch.int16).to(torch.int32).reshape(N, g.numel) & 0xFFFF
    b = _tile_bases(base16, N, g).to(dev).expand(N, 1, g.head_dim)
    b = b[:, None].expand(N, g.tiles, 1, g.head_dim).reshape(N * g.tiles, 1, g.head_dim)
    tiles = rows[:, : g.block_bytes].reshape(N * g.tiles, g.tile_bytes)
    bits, bad = _decode_tiles(tiles, b, g, kind, validate)
    if validate and bool((bad.reshape(N, g.tiles).any(1) & ~is_raw).any()):
        raise ValueError("corrupt GAAC v4 block: a tile's side area or code plane is structurally impossible")
    bits = torch.where(is_raw[:, None], raw_bits, bits.reshape(N, g.numel))
    return _as_bf16(bits, (N, g.block_size, g.head_dim))
