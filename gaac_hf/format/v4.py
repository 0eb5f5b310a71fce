"""GAAC block format version 4 ("register tiles, fixed 4-bit lanes"): geometry, offsets and constants.

Why v4 exists: the v3 blocks are decoded into shared memory by producer warps and read back by the
attention warps; v4 lays every 16-token tile out so that each lane of a warp reads exactly the bytes of
its own m16n8k16 MMA A fragments and rebuilds them in registers (no producer, no decoded ring). Every
group is 4-bit or raw (no 3-bit mode, so no 3-bit -> 4-bit fix-up): a pair of values decodes in ~4.75
ALU ops (a rotate for the sign/mantissa word, a rotate and an AND for the two codes, an add of the base
pair, a bit select). The price is ratio: 12 bits per value plus a 32-byte side area per tile, ~1.30x on
real SmolLM2 K/V against v3's ~1.42x. The reference codec is ``gaac_hf/codec/v4.py``.

A block is ``block_size`` tokens x ``head_dim`` channels of one layer, K or V, one kv head; it is
``block_size / 16`` tiles of 16 tokens, back to back (tile i = tokens 16 i .. 16 i + 15).

Lanes. Lane l (g = l // 4, t = l % 4) of a tile holds NP = D / 4 pairs (two values each); pair
q = 4 s + j is register j of the A fragment of k-step s (KS = D / 16 k-steps):
  K (A = K):     token g + 8 (j & 1),          channels 16 s + 2 t + 8 (j >> 1) + {0, 1}
  V (A = V^T):   tokens 2 t + 8 (j >> 1) + {0, 1}, channel 16 s + g + 8 (j & 1)
The first value of a pair is its low half. Group s of a lane = its 4 pairs of k-step s (8 values).

Exponent coding: per channel window base16 (0..255), c = (e - base16) mod 256 per value. A group is
4-bit when every value has 0 <= e - base16 < 16 (so base16 + c < 256: nothing carries), else raw (its
code bits 4-7 go to a record in the side area).

Bytes of one tile (tile_bytes = 24 D + 32, a multiple of 16)::

  [0, 16 D)         sign/mantissa plane: uint4 [NP / 8][32 lanes]; u32 k % 4 of lane l's uint4 k // 4
                    (byte 512 (k // 4) + 16 l + 4 (k % 4)) is sign/mantissa word k of the lane:
                      bits 0-6  mantissa of pair 2k's low value     bit 15  its sign
                      bits 16-22 mantissa of pair 2k's high value   bit 31  its sign
                      bits 8-14 mantissa of pair 2k+1's low value   bit 23  its sign
                      bits 24-30 mantissa of pair 2k+1's high value bit 7   its sign
                    i.e. pair 2k at its BF16 bit places and pair 2k+1 rotated left by 8 (into the
                    exponent holes): pair 2k is the word, pair 2k+1 is rotr(word, 8), masked 0x807F807F
  [16 D, 24 D)      code plane: uint4 [KS / 4][32 lanes]; u32 s % 4 of lane l's uint4 s // 4
                    (byte 16 D + 512 (s // 4) + 16 l + 4 (s % 4)) is group s's code word: the low code
                    nibble of pair j's low value at bits 7 + 4 j, of its high value at 23 + 4 j (a 4-bit
                    field at bit p occupies bits p .. p + 3 mod 32), so rotr(w, 4 j) & CODE_MASK puts the
                    pair's two codes at the low bits of the two BF16 exponent fields
  [24 D, +32)       side area: u8 n_raw, 7 x 0 (reserved); MAX_RAW_TILE records of 8 bytes at RAW_AT + 8 r,
                    record r < n_raw = one raw group, in group order (lane-major, then s):
                      u32 code bits 4-7 in the same rotated layout shifted by 4 (pair j's low value at
                      11 + 4 j, high value at 27 + 4 j: rotr(rec, 4 j) & HIGH_MASK = 16 x the high nibbles),
                      u8 lane, u8 s, u16 0 (reserved); records r >= n_raw are all zero (reserved)

A tile with more than MAX_RAW_TILE raw groups, or a lane with more than MAX_RAW_LANE raw group, cannot
be stored: its block is stored as BF16 (the kernel reads all three record slots unconditionally and keeps
one per lane).

Pool and table: blocks lie in a byte pool at 16-byte aligned offsets; a block-table entry (int64) is the
offset, | ENTRY_RAW when the block is stored as BF16 bytes (row-major [T, D], raw_bytes long). A pool's
last GUARD bytes are never block storage: the host-sync-free packer sends the bytes it masks off there.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

#: Bumped whenever a byte of the block layout, a mode's meaning or the table layout changes.
FORMAT_VERSION = 4

TILE_ROWS = 16  #: tokens per tile (the MMA's M)
LANES = 32  #: lanes of a warp; each holds NP pairs of a tile
SIDE = 32  #: side-area bytes per tile
RAW_AT = 8  #: byte offset of record 0 in the side area (record r at RAW_AT + 8 r)
RECORD_BYTES = 8  #: u32 high nibbles, u8 lane, u8 s, u16 0
MAX_RAW_TILE = 3  #: raw groups (records) per tile at most
MAX_RAW_LANE = 1  #: raw groups per lane per tile at most
CODE_MASK = 0x07800780  #: rotr(code word, 4 j) & CODE_MASK = pair j's low code nibbles at bits 7-10 / 23-26
HIGH_MASK = 0x78007800  #: rotr(record word, 4 j) & HIGH_MASK = pair j's high code nibbles at bits 11-14 / 27-30
SIGN_MANT = 0x807F807F  #: the sign and mantissa bits of a BF16 pair
CODE_FIRST, HIGH_FIRST = 7, 11  #: bit of pair 0's low-value nibble in a code word / a record word
ALIGN = 16  #: block offsets and lengths are multiples of 16 (uint4 loads)
GUARD = ALIGN  #: bytes at a pool's end that hold no block (sink of the packer's masked-off writes)

#: Block-table entry (int64): byte offset of the block in its pool (a multiple of 16), plus
#: ENTRY_RAW when the block is stored as BF16 (2 bytes per value, row-major [T, D]).
ENTRY_RAW = 1

HEAD_DIMS = (64, 128, 192, 256)  #: the code plane is uint4 [KS / 4][32]: head_dim a multiple of 64
KERNEL_HEAD_DIMS = (64, 128, 256)  #: head dims the CUDA kernels are built for


@dataclass(frozen=True)
class GeometryV4:
    """Shape of one v4 block. ``head_dim`` in HEAD_DIMS; ``block_size`` a power of two >= 16."""

    block_size: int = 64
    head_dim: int = 128

    def __post_init__(self) -> None:
        d, t = self.head_dim, self.block_size
        if not isinstance(t, int) or isinstance(t, bool) or t < TILE_ROWS or t & (t - 1):
            raise ValueError(f"block_size must be a power of two >= {TILE_ROWS}, got {t}")
        if not isinstance(d, int) or isinstance(d, bool) or d not in HEAD_DIMS:
            raise ValueError(f"format v4 takes head_dim in {HEAD_DIMS} (a multiple of 64: its code plane is "
                             f"uint4 [head_dim / 64][32]), got {d}; format v3 (GeometryV3) takes any multiple "
                             "of 16 up to 256")

    # -- counts --------------------------------------------------------------------------------
    @property
    def numel(self) -> int:
        return self.block_size * self.head_dim

    @property
    def tiles(self) -> int:
        """16-token tiles per block."""
        return self.block_size // TILE_ROWS

    @property
    def pairs(self) -> int:
        """NP: pairs per lane per tile."""
        return self.head_dim // 4

    @property
    def ksteps(self) -> int:
        """KS: groups (k-steps of 16 channels) per lane per tile."""
        return self.head_dim // 16

    # -- one tile ------------------------------------------------------------------------------
    @property
    def sm_offset(self) -> int:
        return 0

    @property
    def code_offset(self) -> int:
        return 16 * self.head_dim

    @property
    def side_offset(self) -> int:
        return 24 * self.head_dim

    @property
    def tile_bytes(self) -> int:
        return 24 * self.head_dim + SIDE

    def sm_word_offset(self, lane: int, k: int) -> int:
        """Byte offset in a tile of sign/mantissa word ``k`` (pairs 2k, 2k+1) of ``lane``."""
        return self.sm_offset + 512 * (k // 4) + 16 * lane + 4 * (k % 4)

    def code_word_offset(self, lane: int, s: int) -> int:
        """Byte offset in a tile of the code word of group ``s`` of ``lane``."""
        return self.code_offset + 512 * (s // 4) + 16 * lane + 4 * (s % 4)

    def record_offset(self, r: int) -> int:
        """Byte offset in a tile of raw record ``r``."""
        return self.side_offset + RAW_AT + RECORD_BYTES * r

    # -- one block -----------------------------------------------------------------------------
    @property
    def block_bytes(self) -> int:
        """Stored length of a compressed block (every block has the same)."""
        return self.tiles * self.tile_bytes

    @property
    def raw_bytes(self) -> int:
        """Stored length of a block kept as BF16."""
        return 2 * self.numel

    def to_dict(self) -> dict:
        return asdict(self) | {"format_version": FORMAT_VERSION, "layout": "register_tile_f4i", "dtype": "bf16"}

    @classmethod
    def from_dict(cls, d: dict) -> "GeometryV4":
        v = d.get("format_version")
        if v != FORMAT_VERSION:
            hint = " (a v3 geometry: read it with gaac_hf.format.v3.GeometryV3)" if v == 3 else ""
            raise ValueError(f"GAAC format version {v} is not supported by the v4 reader "
                             f"(it reads {FORMAT_VERSION}){hint}")
        if d.get("dtype", "bf16") != "bf16":
            raise ValueError(f"format v4 stores BF16 tiles only, got dtype={d.get('dtype')!r}")
        return cls(block_size=d["block_size"], head_dim=d["head_dim"])
