"""Bit-level helpers of the reference codec: packing small codes into bytes and splitting BF16.

Shared by :mod:`gaac_hf.codec.reference` (encode/decode) and :mod:`gaac_hf.codec.escapes`.
"""
from __future__ import annotations

import torch

from ..format import BlockGeometry


def _pack(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack small ints ``[..., n]`` (each < 2**width) into uint8 ``[..., n*width/8]``, LSB first."""
    per = 8 // width
    v = values.to(torch.int32).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    shifts = torch.arange(per, device=values.device, dtype=torch.int32) * width
    return (v << shifts).sum(-1).to(torch.uint8)


def _unpack(packed: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Inverse of :func:`_pack`: uint8 ``[..., n*width/8]`` -> int32 ``[..., n]``."""
    per = 8 // width
    shifts = torch.arange(per, device=packed.device, dtype=torch.int32) * width
    v = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << width) - 1)
    return v.reshape(*packed.shape[:-1], n)


def _to_rows(t: torch.Tensor, geometry: BlockGeometry) -> torch.Tensor:
    """[N, T, D] -> [N, rows, cols]: the matrix whose rows are cut into groups of 8."""
    return t if geometry.group_axis == "channel" else t.transpose(-1, -2)


def _from_rows(t: torch.Tensor, geometry: BlockGeometry) -> torch.Tensor:
    return t if geometry.group_axis == "channel" else t.transpose(-1, -2)


def split_bf16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 tensor -> (int32 exponent field, int32 sign<<7|mantissa byte), same shape."""
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return (bits >> 7) & 0xFF, ((bits >> 8) & 0x80) | (bits & 0x7F)


def join_bf16(exponent: torch.Tensor, sm: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_bf16`: int32 fields -> BF16 tensor with exactly those bits."""
    bits = ((sm & 0x80) << 8) | (exponent << 7) | (sm & 0x7F)
    return bits.to(torch.int16).view(torch.bfloat16)  # int32 -> int16 keeps the low 16 bits
