"""The GAAC block format: what a stored block looks like, byte for byte.

Today's format is version 2 (:mod:`gaac_hf.format.v2`, prose in ``docs/FORMAT.md``); this package
re-exports it. Nothing here computes: the geometry gives every size and offset that the reference
codec (:mod:`gaac_hf.codec`) and the kernels (``gaac_hf.kernels``) need, so they cannot disagree.
A later format version lives beside it as its own module (``v3.py``) with its own codec.
"""
from .v2 import (
    ALIGN,
    ESCAPE_BYTES,
    FORMAT_VERSION,
    GROUP,
    GROUP_AXES,
    MODE_3BIT,
    MODE_4BIT,
    MODE_RAW,
    MODE_RESERVED,
    SUPPORTED_HEAD_DIMS,
    TILE_CHANNELS,
    BlockGeometry,
)

__all__ = [
    "ALIGN", "ESCAPE_BYTES", "FORMAT_VERSION", "GROUP", "GROUP_AXES", "MODE_3BIT", "MODE_4BIT", "MODE_RAW",
    "MODE_RESERVED", "SUPPORTED_HEAD_DIMS", "TILE_CHANNELS", "BlockGeometry",
]
