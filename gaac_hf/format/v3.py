"""GAAC block format version 3: geometry, offsets and constants (the prose is ``docs/FORMAT_V3.md``).

A block is ``block_size`` tokens x ``head_dim`` channels of one layer, K or V, one kv-head. Its bytes,
contiguous and 16-byte aligned, are::

    sm      [n]              sign<<7|mantissa byte per value, chunk-major (chunk c at 32c, row r at +8r)
    codes   [12 * chunks]    three 32-bit code words per chunk, segment-interleaved (see code_word_offset)
    segtab  [4 * (segs+1)]   u32 per segment boundary: entry start | raw start << 16
    entries [2 * n_wide]     u16 per wide (4-bit or raw) group, in group order: pos | raw<<7 | hi3 << 8
    (pad to 4)
    raws    [4 * n_raw]      u32 per raw group: bits 4..7 of its coded exponents
    (pad to 16)

A **chunk** is 4 rows (tokens) x 8 channels = 4 groups of 8 = what one thread decodes; chunks are
numbered band-major (``c = (row // 4) * cols + channel // 8``). A **segment** is 32 consecutive chunks
(1,024 values; the last may be shorter) = what one warp decodes; its wide groups are listed in its
entries, so no decoder ever runs a prefix sum or reads a tag plane (there is none).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

#: Bumped whenever a byte of the block layout, a mode's meaning or the table layout changes.
FORMAT_VERSION = 3

GROUP = 8  #: values per group (8 channels of one token); a group has one mode
CHUNK_ROWS = 4  #: rows per chunk
CHUNK_VALUES = CHUNK_ROWS * GROUP  #: 32 values, 16 BF16 pairs
CODE_WORDS = 3  #: 32-bit code words per chunk (32 codes x 3 bits, dense)
SEGMENT_CHUNKS = 32  #: chunks per segment (one warp, one lane per chunk)
ALIGN = 16  #: block start and block length alignment (16-byte vector loads)

MODE_3BIT, MODE_4BIT, MODE_RAW = 0, 1, 2
MODE_NAMES = ("3bit", "4bit", "raw")

#: Pair q = 4 * row + p of a chunk holds channels (2p, 2p+1) of that row. Pairs 0..14 sit in word
#: q // 5 at bit 3 * (q % 5) (even channel, low half) and 16 + 3 * (q % 5) (odd channel, high half);
#: pair 15's code bit b sits at bits 15 and 31 of word b.
SPLIT_PAIR = 15

#: Block-table entry (int64): byte offset of the block in its pool (a multiple of 16), plus
#: ENTRY_RAW when the block is stored as BF16 (2 bytes per value, row-major [T, D]).
ENTRY_RAW = 1

#: Header dtypes (docs/FORMAT_V3.md, "FP8 tiles"; FP8 geometry in gaac_hf/format/fp8.py).
DTYPE_BF16, DTYPE_FP8_E4M3, DTYPE_FP8_E5M2 = 0, 1, 2

MAX_HEAD_DIM = 256
TUNED_HEAD_DIMS = (64, 128, 256)


def ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass(frozen=True)
class GeometryV3:
    """Shape of one v3 block. ``head_dim``: any multiple of 16 up to 256; ``block_size``: a power of two >= 16."""

    block_size: int = 64
    head_dim: int = 64

    def __post_init__(self) -> None:
        d, t = self.head_dim, self.block_size
        if not isinstance(d, int) or d % 16 or not 16 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"head_dim must be a multiple of 16 in [16, {MAX_HEAD_DIM}], got {d}")
        if not isinstance(t, int) or t < 16 or t & (t - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {t}")

    # -- counts --------------------------------------------------------------------------------
    @property
    def numel(self) -> int:
        return self.block_size * self.head_dim

    @property
    def cols(self) -> int:
        """Chunk columns (groups per row)."""
        return self.head_dim // GROUP

    @property
    def bands(self) -> int:
        return self.block_size // CHUNK_ROWS

    @property
    def chunks(self) -> int:
        return self.bands * self.cols

    @property
    def groups(self) -> int:
        return self.chunks * CHUNK_ROWS

    @property
    def segments(self) -> int:
        return -(-self.chunks // SEGMENT_CHUNKS)

    def segment_chunks(self, s: int) -> int:
        """Chunks in segment ``s`` (32, except possibly the last)."""
        return min(SEGMENT_CHUNKS, self.chunks - SEGMENT_CHUNKS * s)

    # -- fixed part ----------------------------------------------------------------------------
    @property
    def sm_offset(self) -> int:
        return 0

    @property
    def code_offset(self) -> int:
        return self.numel

    @property
    def code_bytes(self) -> int:
        return 4 * CODE_WORDS * self.chunks

    def code_word_offset(self, chunk: int, word: int) -> int:
        """Byte offset of ``word`` (0..2) of ``chunk``: segment s's words are stored word-major,
        ``[word][lane]``, so a warp's loads of one word are one contiguous 128-byte line."""
        s, lane = divmod(chunk, SEGMENT_CHUNKS)
        return self.code_offset + 4 * (CODE_WORDS * SEGMENT_CHUNKS * s + word * self.segment_chunks(s) + lane)

    @property
    def segtab_offset(self) -> int:
        return self.code_offset + self.code_bytes

    @property
    def segtab_bytes(self) -> int:
        return 4 * (self.segments + 1)

    @property
    def entry_offset(self) -> int:
        return self.segtab_offset + self.segtab_bytes

    @property
    def fixed_bytes(self) -> int:
        """Bytes of a block with no wide group (before the final 16-byte padding)."""
        return self.entry_offset

    def raw_offset(self, n_entries: int) -> int:
        return ceil_to(self.entry_offset + 2 * n_entries, 4)

    def block_bytes(self, n_entries: int, n_raw: int) -> int:
        """Stored length of a compressed block with ``n_entries`` wide groups of which ``n_raw`` raw."""
        return ceil_to(self.raw_offset(n_entries) + 4 * n_raw, ALIGN)

    @property
    def raw_bytes(self) -> int:
        """Bytes of the block stored as BF16 (the raw fallback); also the encoder's row capacity."""
        return 2 * self.numel

    def to_dict(self) -> dict:
        return asdict(self) | {"format_version": FORMAT_VERSION, "group_axis": "channel", "dtype": "bf16"}

    @classmethod
    def from_dict(cls, d: dict) -> "GeometryV3":
        v = d.get("format_version")
        if v != FORMAT_VERSION:
            hint = ""
            if v in (1, 2):
                hint = (" (v1/v2 blocks use tag planes and escape streams that v3 does not read; their calibration"
                        " windows carry over: gaac_hf.calibration.v3.load_table_v3 upgrades a v1/v2 table file)")
            raise ValueError(f"GAAC format version {v} is not supported by the v3 reader (it reads {FORMAT_VERSION}){hint}")
        if d.get("dtype", "bf16") != "bf16":
            raise ValueError(f"GAAC v3 {d.get('dtype')!r} tiles are not BF16 tiles: read them with "
                             "gaac_hf.format.fp8.GeometryFP8 (docs/FORMAT_V3.md, FP8 tiles)")
        if d.get("group_axis", "channel") != "channel":
            raise ValueError(f"format v3 groups along channels only, got group_axis={d.get('group_axis')!r}")
        return cls(block_size=d["block_size"], head_dim=d["head_dim"])
