"""GAAC format v3, FP8 tiles (E4M3 and E5M2): geometry, offsets and constants (prose: ``docs/FORMAT_V3.md``,
"FP8 tiles").

An FP8 block is ``block_size`` tokens x ``head_dim`` channels of one layer, K or V, one kv-head, of FP8
codes (``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` bit patterns, one byte per value). It keeps the
chunk / segment / entry-list structure of BF16 v3 tiles; only the per-value fields are narrower::

    sm      [n * (1+M) / 8]   sign<<M | mantissa (E4M3: 4 bits, E5M2: 3 bits), chunk-major records
    codes   [12 * chunks]     three 32-bit code words per chunk, exactly the BF16 v3 layout (3 bits/value)
    segtab  [4 * (segs+1)]    u32 per segment boundary: entry start | raw start << 16 (as v3)
    entries [2 * n_wide]      u16 per wide group: pos | raw<<7 | h<<8 (as v3: h = bit 3 of the 8 codes)
    raws    [n_raw]           u8 per raw group (E5M2 only): bit 4 of the 8 codes (same bit order as h)
    (pad to 16)

Exponent coding per group of 8 channels of one token (E exponent bits; windows from calibration):
  narrow: c = e - base_n in [0, 8)                 (base_n <= 2**E - 8)
  wide:   c = e - base_w in [0, 16)                (E5M2: base_w <= 16; E4M3: base_w = 0, the whole field)
  raw:    c = (e - base_w) mod 32                  (E5M2 only)
Decoding: e = base_n + c without an entry, e = (base_w + c) mod 2**E for listed groups.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .v3 import ALIGN, CHUNK_VALUES, DTYPE_FP8_E4M3, DTYPE_FP8_E5M2, FORMAT_VERSION, GeometryV3, ceil_to

#: the FP8 dtype names of the header field ``dtype`` -> (dtype id, exponent bits, mantissa bits)
FP8_TYPES = {"fp8_e4m3": (DTYPE_FP8_E4M3, 4, 3), "fp8_e5m2": (DTYPE_FP8_E5M2, 5, 2)}
#: torch dtype of each name (the conversion ``x.to(...)`` the tiles store the codes of)
TORCH_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}

NARROW_BITS = 3  #: code bits of a narrow group (in the code words): a window of 8 exponents
WIDE_BITS = 4  #: code bits of a wide group: low 3 in the code words, bit 3 in the entry (window of 16)
RAW_BYTE_BITS = 1  #: code bits per value in a raw group's byte (E5M2: bit 4); E4M3 has no raw groups


@dataclass(frozen=True)
class GeometryFP8(GeometryV3):
    """Shape of one FP8 block: ``GeometryV3`` (chunks, segments, code words, segment table, entries)
    with one byte per value when stored uncompressed and a (1+M)-bit sign/mantissa plane."""

    dtype: str = "fp8_e4m3"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in FP8_TYPES:
            raise ValueError(f"FP8 tiles are {sorted(FP8_TYPES)}, got dtype={self.dtype!r}")

    # -- the value format ------------------------------------------------------------------------
    @property
    def exp_bits(self) -> int:
        return FP8_TYPES[self.dtype][1]

    @property
    def man_bits(self) -> int:
        return FP8_TYPES[self.dtype][2]

    @property
    def sm_bits(self) -> int:
        return 1 + self.man_bits

    @property
    def has_raw(self) -> bool:
        """E5M2 has raw groups (5-bit exponents); in E4M3 the wide window is the whole 4-bit field."""
        return self.exp_bits > WIDE_BITS

    @property
    def max_base_narrow(self) -> int:
        return (1 << self.exp_bits) - (1 << NARROW_BITS)

    @property
    def max_base_wide(self) -> int:
        return (1 << self.exp_bits) - (1 << WIDE_BITS)

    # -- bytes ------------------------------------------------------------------------------------
    @property
    def sm_chunk_bytes(self) -> int:
        """Bytes of one chunk's sign/mantissa record: 32 values x (1+M) bits (E4M3 16, E5M2 12)."""
        return CHUNK_VALUES * self.sm_bits // 8

    @property
    def code_offset(self) -> int:
        return self.chunks * self.sm_chunk_bytes

    def raw_offset(self, n_entries: int) -> int:
        return self.entry_offset + 2 * n_entries  # raw bytes need no alignment

    def block_bytes(self, n_entries: int, n_raw: int) -> int:
        return ceil_to(self.raw_offset(n_entries) + n_raw, ALIGN)

    @property
    def raw_bytes(self) -> int:
        """Bytes of the block stored as FP8 (the raw fallback, row-major [T, D]); the encoder's row capacity."""
        return self.numel

    def to_dict(self) -> dict:
        return asdict(self) | {"format_version": FORMAT_VERSION, "group_axis": "channel"}

    @classmethod
    def from_dict(cls, d: dict) -> "GeometryFP8":
        v = d.get("format_version")
        if v != FORMAT_VERSION:
            raise ValueError(f"GAAC format version {v} has no FP8 tiles (they are format {FORMAT_VERSION})")
        if d.get("dtype") not in FP8_TYPES:
            raise ValueError(f"not an FP8 tile header: dtype={d.get('dtype')!r} (FP8 tiles: {sorted(FP8_TYPES)}; "
                             "BF16 tiles are read by gaac_hf.format.v3.GeometryV3)")
        if d.get("group_axis", "channel") != "channel":
            raise ValueError(f"format v3 groups along channels only, got group_axis={d.get('group_axis')!r}")
        return cls(block_size=d["block_size"], head_dim=d["head_dim"], dtype=d["dtype"])
