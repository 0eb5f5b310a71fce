"""Register tiles (lab prototype, not a product format): GAAC exponent coding laid out so that each lane
of a warp reads exactly the bytes of its own MMA A fragments and decodes them in registers.

Why: the fused v3 kernel decodes into shared memory (producer warps) and the consumers read the rows back
with ldmatrix; after sessions 7-13 its time is the producers' per-tile latency chains (lab notebook), not
bytes. Here there is no producer, no decoded ring and no barrier between roles: every warp copies its
compressed 16-token tile into its own shared-memory slot (one bulk copy per kind), reads its lane's words
with vector LDS and rebuilds the m16n8k16 A fragments of S^T = K Q^T and O^T = V^T P^T directly
(design followed: Marlin's "weights pre-shuffled offline into the MMA fragment order, dequantised in
registers"; our own layout and code).

Codec: the paper's, unchanged in what it stores per value: a group of 8 values shares one mode, 3-bit
(c = e - base8 in [0, 8)), 4-bit (c = e - base16 in [0, 16)) or raw (c = (e - base16) mod 256), with
per-channel calibrated windows; sign and mantissa are kept as one byte per value. What changes is which
8 values form a group and where the bits lie.

Tile = 16 tokens x D channels of one kind (K or V). Lane l (g = l // 4, t = l % 4) holds NP = D / 4
pairs; pair q = 4 s + j is register j of the A fragment of k-step / m-tile s:
  K (A = K, rows tokens, cols channels):   row g + 8 (j & 1), channels 16 s + 2 t + 8 (j >> 1) + {0, 1}
  V (A = V^T, rows channels, cols tokens): channel 16 s + g + 8 (j & 1), tokens 2 t + 8 (j >> 1) + {0, 1}
Group s of a lane = its 4 pairs of k-step / m-tile s (8 values). The low value of a pair is the low half.

Bytes of one tile (TILE_BYTES, a multiple of 16; a block of 64 tokens = 4 tiles, back to back):
  [0, 16 D)              sign/mantissa plane: uint4 [NP / 8][32 lanes]; byte 2 (q % 8) + h of lane l's
                         uint4 q // 8 = value h of pair q (sign << 7 | mantissa)
  [16 D, +128 NW)        code plane: u32 [NW][32 lanes], NW = 3 NP / 16: lane words 3c..3c+2 hold the low
                         3 code bits of pairs 16c..16c+15 in the v3 chunk packing (gaac_v3::pair_field)
  [.., +SIDE)            side area: u8 wide mask per lane [32] (bit s: group s is 4-bit or raw);
                         u8 n_h, u8 n_raw, u16 0; n_h bytes h (lane-major, then s; bit j = bit 3 of the
                         low value's code of pair j, bit 4 + j of the high value's); at align4(36 + n_h)
                         n_raw records of 8 bytes: u32 nibbles (bits 4j.. = bits 4-7 of pair j's low code,
                         16 + 4j.. of its high code), u8 lane, u8 s, u16 0
A tile whose side data does not fit SIDE bytes, or with a lane holding more than 2 raw groups, makes its
block "raw" (stored BF16, table entry < 0).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from gaac_hf.codec.v3 import group_modes_v3, pack_code_words, split_bf16, unpack_code_words, join_bf16

ROWS, LANES, BLOCK_T = 16, 32, 64
MODE_3, MODE_4, MODE_RAW = 0, 1, 2


@dataclass(frozen=True)
class Geometry:
    D: int

    def __post_init__(self):
        if self.D not in (64, 128):
            raise ValueError(f"the prototype takes head_dim 64 or 128, got {self.D}")

    @property
    def NP(self) -> int:  # pairs per lane
        return self.D // 4

    @property
    def KS(self) -> int:  # groups (k-steps) per lane
        return self.D // 16

    @property
    def NW(self) -> int:  # code words per lane
        return 3 * self.NP // 16

    @property
    def side(self) -> int:
        return 96 if self.D == 128 else 64

    @property
    def code_off(self) -> int:
        return 16 * self.D

    @property
    def side_off(self) -> int:
        return self.code_off + 128 * self.NW

    @property
    def tile_bytes(self) -> int:
        return self.side_off + self.side

    @property
    def block_bytes(self) -> int:
        return (BLOCK_T // ROWS) * self.tile_bytes


def lane_coords(D: int, kind: str, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) int64 [32, NP, 2] of every value a lane holds, in the 16 x D tile."""
    l = torch.arange(LANES, device=device).view(LANES, 1, 1)
    q = torch.arange(D // 4, device=device).view(1, -1, 1)
    h = torch.arange(2, device=device).view(1, 1, 2)
    g, t, s, j = l // 4, l % 4, q // 4, q % 4
    if kind == "k":
        row = g + 8 * (j & 1) + 0 * h
        col = 16 * s + 2 * t + 8 * (j >> 1) + h
    elif kind == "v":
        row = 2 * t + 8 * (j >> 1) + h
        col = 16 * s + g + 8 * (j & 1) + 0 * h
    else:
        raise ValueError(kind)
    return row.expand(LANES, D // 4, 2), col.expand(LANES, D // 4, 2)


def _le_bytes(w: torch.Tensor, n: int) -> torch.Tensor:
    sh = torch.arange(n, device=w.device, dtype=torch.int64) * 8
    return ((w.to(torch.int64).unsqueeze(-1) >> sh) & 0xFF).to(torch.uint8)


def lane_values(x: torch.Tensor, kind: str):
    """bf16 blocks [N, 64, D] -> (exponents, sign/mantissa bytes) int32 [N * 4, 32, NP, 2] in lane order, and the
    channel of every value [32, NP, 2] (both layouts gather their tiles this way)."""
    N, T, D = x.shape
    if T != BLOCK_T:
        raise ValueError(f"blocks of {BLOCK_T} tokens expected, got {T}")
    row, col = lane_coords(D, kind, x.device)
    e, sm = split_bf16(x.reshape(N * 4, ROWS, D)[:, row, col])
    return e, sm, col


@dataclass
class Encoded:
    data: torch.Tensor   # uint8 [N, block_bytes]
    fits: torch.Tensor   # bool [N]: every tile's side data fits
    modes: torch.Tensor  # int32 [N, 4, 32, KS]


def encode(x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, kind: str) -> Encoded:
    """x bf16 [N, 64, D] blocks of one (layer, kv head) with uint8 bases [D] -> Encoded."""
    N, T, D = x.shape
    geo = Geometry(D)
    dev = x.device
    e, sm, col = lane_values(x, kind)                      # [n, 32, NP, 2]
    n = e.shape[0]
    b8 = base8.to(torch.int32)[col]                        # [32, NP, 2]
    b16 = base16.to(torch.int32)[col]
    KS = geo.KS
    eg = e.reshape(n, LANES, KS, 8)
    mode = group_modes_v3(eg, b8.reshape(LANES, KS, 8), b16.reshape(LANES, KS, 8))  # [n, 32, KS]
    m8 = mode.repeat_interleave(8, -1).reshape(n, LANES, -1, 2)
    c = torch.where(m8 == MODE_3, e - b8, (e - b16) & 0xFF)  # [n, 32, NP, 2]
    # sign/mantissa plane
    smp = sm.to(torch.uint8).reshape(n, LANES, geo.NP // 8, 16).permute(0, 2, 1, 3).reshape(n, -1)
    # code plane: 16 pairs per 3 words, pack_code_words takes [..., 4, 8] with index (q // 4, 2 (q % 4) + h)
    lo3 = (c & 7).reshape(n, LANES, geo.NP // 16, 4, 8)
    words = pack_code_words(lo3).reshape(n, LANES, geo.NW)  # int64
    codep = _le_bytes(words.permute(0, 2, 1), 4).reshape(n, -1)
    # side area
    wide = mode != MODE_3                                   # [n, 32, KS]
    raw = mode == MODE_RAW
    mask = (wide.to(torch.int64) << torch.arange(KS, device=dev)).sum(-1)  # [n, 32]
    hbit = (c >> 3) & 1                                     # [n, 32, NP, 2]
    hb = hbit.reshape(n, LANES, KS, 4, 2)
    jj = torch.arange(4, device=dev)
    hbyte = ((hb[..., 0] << jj) | (hb[..., 1] << (4 + jj))).sum(-1)  # [n, 32, KS]
    nib = ((c >> 4) & 0xF).reshape(n, LANES, KS, 4, 2).to(torch.int64)
    nibw = ((nib[..., 0] << (4 * jj)) | (nib[..., 1] << (16 + 4 * jj))).sum(-1)  # [n, 32, KS]
    n_h = wide.flatten(1).sum(1)
    n_raw = raw.flatten(1).sum(1)
    raw_at = (36 + n_h + 3) // 4 * 4
    need = raw_at + 8 * n_raw
    tile_fits = (need <= geo.side) & (raw.sum(-1) <= 2).all(-1)  # the kernel holds <= 2 raw groups per lane
    side = torch.zeros(n, geo.side + 8 * LANES * KS + 300, dtype=torch.uint8, device=dev)  # room, cut below
    side[:, :LANES] = mask.to(torch.uint8)
    side[:, 32] = n_h.clamp(max=255).to(torch.uint8)
    side[:, 33] = n_raw.clamp(max=255).to(torch.uint8)
    wf = wide.flatten(1)
    hpos = 36 + torch.cumsum(wf.to(torch.int64), 1) - 1
    ti, gi = wf.nonzero(as_tuple=True)
    side[ti, hpos[ti, gi]] = hbyte.flatten(1)[ti, gi].to(torch.uint8)
    rf = raw.flatten(1)
    rpos = raw_at[:, None] + 8 * (torch.cumsum(rf.to(torch.int64), 1) - 1)
    ti, gi = rf.nonzero(as_tuple=True)
    base = rpos[ti, gi]
    nb = _le_bytes(nibw.flatten(1)[ti, gi], 4)
    for b in range(4):
        side[ti, base + b] = nb[:, b]
    side[ti, base + 4] = (gi // KS).to(torch.uint8)
    side[ti, base + 5] = (gi % KS).to(torch.uint8)
    side = side[:, : geo.side]
    tile = torch.cat([smp, codep, side], 1)
    assert tile.shape[1] == geo.tile_bytes
    data = tile.reshape(N, geo.block_bytes)
    fits = tile_fits.reshape(N, 4).all(1)
    return Encoded(data=data.contiguous(), fits=fits, modes=mode.reshape(N, 4, LANES, KS))


def decode(data: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, D: int, kind: str) -> torch.Tensor:
    """Reference decoder (the spec the kernel must match): uint8 [N, block_bytes] -> bf16 [N, 64, D].
    Only blocks whose tiles fit (``Encoded.fits``) are meaningful."""
    geo = Geometry(D)
    N = data.shape[0]
    dev = data.device
    t = data.reshape(N * 4, geo.tile_bytes)
    n = t.shape[0]
    KS = geo.KS
    sm = t[:, : geo.code_off].reshape(n, geo.NP // 8, LANES, 16).permute(0, 2, 1, 3).reshape(n, LANES, geo.NP, 2)
    sm = sm.to(torch.int32)
    cw = t[:, geo.code_off: geo.side_off].to(torch.int64).reshape(n, geo.NW, LANES, 4)
    words = (cw << (8 * torch.arange(4, device=dev))).sum(-1).permute(0, 2, 1)  # [n, 32, NW]
    lo3 = unpack_code_words(words.reshape(n, LANES, geo.NP // 16, 3)).reshape(n, LANES, geo.NP, 2)
    side = t[:, geo.side_off:].to(torch.int64)
    mask = side[:, :LANES]                                                # [n, 32]
    wide = ((mask.unsqueeze(-1) >> torch.arange(KS, device=dev)) & 1).bool()  # [n, 32, KS]
    wf = wide.flatten(1)
    hpos = (36 + torch.cumsum(wf.to(torch.int64), 1) - 1).clamp(max=geo.side - 1)
    hbyte = torch.where(wf, torch.gather(side, 1, hpos), 0).reshape(n, LANES, KS)
    jj = torch.arange(4, device=dev)
    hlo = (hbyte.unsqueeze(-1) >> jj) & 1
    hhi = (hbyte.unsqueeze(-1) >> (4 + jj)) & 1
    h = torch.stack([hlo, hhi], -1).reshape(n, LANES, geo.NP, 2)
    nibs = torch.zeros(n, LANES, KS, dtype=torch.int64, device=dev)
    n_h, n_raw = side[:, 32], side[:, 33]
    raw_at = (36 + n_h + 3) // 4 * 4
    for r in range(int(n_raw.max().item()) if n > 0 else 0):
        at = raw_at + 8 * r
        ok = (r < n_raw) & (at + 8 <= geo.side)  # a tile that does not fit is not decoded from here
        rec = torch.gather(side, 1, at.clamp(max=geo.side - 8)[:, None] + torch.arange(8, device=dev))  # [n, 8]
        w = (rec[:, :4] << (8 * torch.arange(4, device=dev))).sum(-1)
        ok &= (rec[:, 4] < LANES) & (rec[:, 5] < KS)
        ti = ok.nonzero(as_tuple=True)[0]
        nibs[ti, rec[ti, 4], rec[ti, 5]] = w[ti]
    nl = (nibs.unsqueeze(-1) >> (4 * jj)) & 0xF
    nh = (nibs.unsqueeze(-1) >> (16 + 4 * jj)) & 0xF
    nib = torch.stack([nl, nh], -1).reshape(n, LANES, geo.NP, 2)
    row, col = lane_coords(D, kind, dev)
    b8 = base8.to(torch.int32)[col]
    b16 = base16.to(torch.int32)[col]
    wv = wide.repeat_interleave(8, -1).reshape(n, LANES, geo.NP, 2)
    e = torch.where(wv, (b16 + lo3 + 8 * h + 16 * nib) & 0xFF, b8 + lo3)
    vals = join_bf16(e, sm)
    out = torch.empty(n, ROWS, D, dtype=torch.bfloat16, device=dev)
    out[:, row, col] = vals
    return out.reshape(N, BLOCK_T, D)


def pack_pool(x: torch.Tensor, lens: list[int], base8: torch.Tensor, base16: torch.Tensor, kind: str,
              generator: torch.Generator | None = None, codec=None) -> dict:
    """Dense bf16 [B, H, S, D] with per-head uint8 bases [H, D] -> a paged register-tile cache:
    pool uint8 [n_comp, block_bytes], raw bf16 [n_raw, 64, D] (blocks that do not fit), table int32
    [B, H, max_blocks] (e >= 0: pool[e]; e < 0: raw[~e]), tail bf16 [B, H, 64, D], num_blocks, tail_len.
    codec: the module whose Geometry / encode lay the tiles out (default this one; format4)."""
    B, H, S, D = x.shape
    dev = x.device
    codec = codec or sys.modules[__name__]  # the layout: this module, or format4
    geo = codec.Geometry(D)
    nbs = [s // BLOCK_T for s in lens]
    maxb = max(1, max(nbs))
    table = torch.zeros(B, H, maxb, dtype=torch.int32, device=dev)
    tail = torch.zeros(B, H, BLOCK_T, D, dtype=torch.bfloat16, device=dev)
    pools, raws = [], []
    n_pool = n_raw = 0
    for h in range(H):
        blocks = torch.cat([x[b, h, : nbs[b] * BLOCK_T].reshape(nbs[b], BLOCK_T, D) for b in range(B)])
        enc = codec.encode(blocks, base8[h], base16[h], kind)
        fits = enc.fits
        idx = torch.where(fits, torch.cumsum(fits.to(torch.int64), 0) - 1 + n_pool,
                          -1 - (torch.cumsum((~fits).to(torch.int64), 0) - 1 + n_raw))
        pools.append(enc.data[fits])
        raws.append(blocks[~fits])
        n_pool += int(fits.sum())
        n_raw += int((~fits).sum())
        k = 0
        for b in range(B):
            table[b, h, : nbs[b]] = idx[k: k + nbs[b]].to(torch.int32)
            k += nbs[b]
            r = lens[b] - nbs[b] * BLOCK_T
            tail[b, h, :r] = x[b, h, nbs[b] * BLOCK_T: lens[b]]
    pool = torch.cat(pools) if n_pool else torch.zeros(1, geo.block_bytes, dtype=torch.uint8, device=dev)
    raw = torch.cat(raws) if n_raw else torch.zeros(1, BLOCK_T, D, dtype=torch.bfloat16, device=dev)
    if generator is not None and n_pool > 1:  # shuffle the pool so the table's indirection is exercised
        perm = torch.randperm(n_pool, generator=generator).to(dev)
        newpos = torch.empty_like(perm)
        newpos[perm] = torch.arange(n_pool, device=dev)
        pool = pool[perm]
        comp = table >= 0
        table = torch.where(comp, newpos[table.clamp(min=0).long()].to(torch.int32), table)
    return dict(pool=pool.contiguous(), raw=raw.contiguous(), table=table, tail=tail, n_raw_blocks=n_raw,
                num_blocks=torch.tensor(nbs, dtype=torch.int32, device=dev),
                tail_len=torch.tensor([s - nb * BLOCK_T for s, nb in zip(lens, nbs)], dtype=torch.int32, device=dev))


def bytes_of(p: dict) -> int:
    return p["pool"].numel() + p["raw"].numel() * 2 * (p["n_raw_blocks"] > 0) + p["tail"].numel() * 2 + p["table"].numel() * 4
