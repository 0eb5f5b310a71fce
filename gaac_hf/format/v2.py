"""The GAAC block format: geometry, plane offsets and constants.

`docs/FORMAT.md` is the prose version of this file; `gaac_hf.codec` is the executable spec that
encodes and decodes it. Every number a kernel needs to find a plane inside a slot comes from
:class:`BlockGeometry`, so the reference codec and the Triton kernels cannot disagree on layout.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

#: Bumped whenever a byte of the slot layout, a mode's meaning or the calibration table changes.
FORMAT_VERSION = 2

#: Values per group: a group shares one mode tag.
GROUP = 8

#: Mode tags (2 bits per group). Tag 3 is reserved and rejected by the decoder.
MODE_3BIT = 0  # exponent - base8 in [0, 8): 3-bit offset, no escape
MODE_4BIT = 1  # exponent - base16 in [0, 16): 3 low bits in the code planes, 1 escape byte (bit 3)
MODE_RAW = 2  # raw 8-bit exponent: 3 low bits in the code planes, 5 escape bytes (bits 3..7)
MODE_RESERVED = 3

#: Escape bytes a group of each mode appends to the block's escape stream. Escape byte k of a group
#: is bit-plane k of the group's high bits: bit j of it is bit (3 + k) of value j's coded exponent.
ESCAPE_BYTES = (0, 1, 5, 0)

#: Channels per tile: a kernel program reads at most this many channels of a row at once.
TILE_CHANNELS = 128

#: Alignment of every plane inside a slot and of the slot itself (one 16-byte vector load).
#: Escape streams in the escape heap are byte-aligned (the decoders read them a byte at a time).
ALIGN = 16

SUPPORTED_HEAD_DIMS = (64, 128, 256)
GROUP_AXES = ("channel", "token")


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass(frozen=True)
class BlockGeometry:
    """Shape of one encoded block (one layer, K or V, one kv-head, ``block_size`` tokens).

    A block is stored as a fixed-size **slot** plus a variable-length **escape stream**.

    The slot is one contiguous uint8 row of ``slot_bytes`` holding, in order and 16-byte aligned::

        sm   [rows*cols]       sign<<7 | mantissa, one byte per value
        lo2  [rows*cols/4]     bits 0-1 of each value's 3-bit code, 4 values per byte (LSB first)
        hi1  [rows*cols/8]     bit 2 of each code, 8 values per byte (LSB first)
        tag  [rows*cols/32]    2-bit mode tag per group, 4 groups per byte (LSB first)

    The escape stream (the escape bytes of the non-3-bit groups, in group order; its length follows
    from the tag plane) lives outside the slot, in an **escape heap**: a byte array where each
    block's stream starts at a recorded offset (``esc_start``). A block whose stream is longer than
    ``escape_limit`` would not be smaller than its BF16 form and is stored raw instead.

    Every plane runs over the row-major ``rows x cols`` matrix; groups are 8 consecutive values of a row.

    ``rows x cols`` is ``block_size x head_dim`` for groups along channels and
    ``head_dim x block_size`` for groups along tokens (the block is transposed before coding).
    """

    block_size: int = 64
    head_dim: int = 64
    group_axis: str = "channel"

    def __post_init__(self) -> None:
        if self.group_axis not in GROUP_AXES:
            raise ValueError(f"group_axis must be one of {GROUP_AXES}, got {self.group_axis!r}")
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {self.head_dim}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size}")

    # -- shape of the coded matrix -------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.block_size if self.group_axis == "channel" else self.head_dim

    @property
    def cols(self) -> int:
        return self.head_dim if self.group_axis == "channel" else self.block_size

    @property
    def numel(self) -> int:
        return self.block_size * self.head_dim

    @property
    def groups(self) -> int:
        return self.numel // GROUP

    @property
    def max_escape_bytes(self) -> int:
        """Escape bytes of a block whose groups are all raw (the worst case)."""
        return self.groups * ESCAPE_BYTES[MODE_RAW]

    # -- plane sizes and offsets ---------------------------------------------------------------
    @property
    def sm_bytes(self) -> int:
        return self.numel

    @property
    def lo2_bytes(self) -> int:
        return self.numel // 4

    @property
    def hi1_bytes(self) -> int:
        return self.numel // 8

    @property
    def tag_bytes(self) -> int:
        return self.groups // 4

    @property
    def sm_offset(self) -> int:
        return 0

    @property
    def lo2_offset(self) -> int:
        return _ceil_to(self.sm_offset + self.sm_bytes, ALIGN)

    @property
    def hi1_offset(self) -> int:
        return _ceil_to(self.lo2_offset + self.lo2_bytes, ALIGN)

    @property
    def tag_offset(self) -> int:
        return _ceil_to(self.hi1_offset + self.hi1_bytes, ALIGN)

    @property
    def slot_bytes(self) -> int:
        return _ceil_to(self.tag_offset + self.tag_bytes, ALIGN)

    @property
    def escape_limit(self) -> int:
        """Longest escape stream a compressed block may have: beyond it slot + stream would reach
        the block's BF16 size, so the block is stored raw (only adversarial blocks get there)."""
        return self.raw_bytes - self.slot_bytes

    @property
    def raw_bytes(self) -> int:
        """Bytes of the block stored uncompressed (the raw fallback)."""
        return 2 * self.numel

    def to_dict(self) -> dict:
        return asdict(self) | {"format_version": FORMAT_VERSION}

    @classmethod
    def from_dict(cls, d: dict) -> "BlockGeometry":
        v = d.get("format_version")
        if v != FORMAT_VERSION:
            hint = (" (version 1 kept escape bytes inside fixed-capacity slots; its calibration windows are still valid: "
                    "gaac_hf.calibration.upgrade_table_file converts a v1 table file)") if v == 1 else ""
            raise ValueError(f"GAAC format version {v} is not supported (this gaac-hf reads {FORMAT_VERSION}){hint}")
        return cls(**{k: d[k] for k in ("block_size", "head_dim", "group_axis")})
