"""Reference GAAC codec in PyTorch: the executable spec of ``docs/FORMAT.md``.

Lossless contract: for every BF16 bit pattern (NaN payloads, +-Inf, +-0, subnormals included),
``decode_blocks(enc.slots, enc.escapes, ...)`` with ``enc = encode_blocks(x, ...)`` returns the same
16 bits (for every block with ``enc.fits``; the others are stored raw). Nothing here loops over elements
or groups in Python; it runs on any device torch runs on and is what the Triton kernels in
``gaac_hf.kernels`` must match byte for byte (encoder) and bit for bit (decoder).

Shapes use N = number of blocks, T = tokens per block, D = head_dim.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format import (
    ESCAPE_BYTES,
    GROUP,
    MODE_3BIT,
    MODE_4BIT,
    MODE_RAW,
    MODE_RESERVED,
    BlockGeometry,
)
from .bits import _from_rows, _pack, _to_rows, _unpack, join_bf16, split_bf16
from .escapes import escape_source

_MAX_ESC = ESCAPE_BYTES[MODE_RAW]


# ---------------------------------------------------------------------------------------------
# bases and modes
# ---------------------------------------------------------------------------------------------
def _check_bases(base: torch.Tensor, n: int, geometry: BlockGeometry, name: str) -> torch.Tensor:
    if base.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8 exponent bases, got {base.dtype}")
    if base.dim() == 1:
        base = base.unsqueeze(0)
    if base.dim() != 2 or base.shape[-1] != geometry.head_dim or base.shape[0] not in (1, n):
        raise ValueError(f"{name} must have shape [head_dim] or [N, head_dim] = [{n}, {geometry.head_dim}], got {tuple(base.shape)}")
    return base.to(torch.int32).expand(n, geometry.head_dim)


def group_modes(exponent: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor) -> torch.Tensor:
    """Mode tag per group of 8 values along the last dim.

    exponent, base8, base16: int32 ``[..., C]`` (bases already broadcast), C a multiple of 8.
    Returns int32 ``[..., C/8]`` with values in {MODE_3BIT, MODE_4BIT, MODE_RAW}: the narrowest mode
    in which every value of the group fits (out-of-window values widen the whole group).
    """
    shape = (*exponent.shape[:-1], exponent.shape[-1] // GROUP, GROUP)
    off8 = (exponent - base8).reshape(shape)
    off16 = (exponent - base16).reshape(shape)
    fit3 = ((off8 >= 0) & (off8 < 8)).all(-1)
    fit4 = ((off16 >= 0) & (off16 < 16)).all(-1)
    return torch.where(fit3, MODE_3BIT, torch.where(fit4, MODE_4BIT, MODE_RAW)).to(torch.int32)



# ---------------------------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------------------------
@dataclass
class EncodedBlocks:
    """Output of :func:`encode_blocks`.

    slots:       uint8 ``[N, geometry.slot_bytes]``: the fixed-size planes of each block.
    escapes:     uint8 ``[N, geometry.max_escape_bytes]``: row i holds block i's escape stream in its
                 first ``escape_len[i]`` bytes, zeros after (:func:`pack_escapes` turns the rows
                 into an escape heap).
    escape_len:  int32 ``[N]`` length of each block's escape stream.
    fits:        bool ``[N]``: ``escape_len <= geometry.escape_limit``. False -> coding the block
                 would not save bytes; it must be stored raw.
    tags:        int32 ``[N, rows, cols/8]`` mode per group (for statistics; not part of a slot's
                 identity beyond the packed tag plane).
    """

    slots: torch.Tensor
    escapes: torch.Tensor
    escape_len: torch.Tensor
    fits: torch.Tensor
    tags: torch.Tensor


def encode_blocks(
    x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry: BlockGeometry
) -> EncodedBlocks:
    """Encode N blocks into slots and escape streams.

    Args:
        x: BF16 ``[N, T, D]`` with T = geometry.block_size, D = geometry.head_dim.
        base8, base16: uint8 ``[D]`` or ``[N, D]``: first exponent of each channel's 8- and
            16-window (from a :class:`~gaac_hf.calibration.CalibrationTable`).
        geometry: the block format.
    Returns:
        :class:`EncodedBlocks`. Every byte of a slot is written and escape rows are zero past the
        stream, so both are deterministic functions of the block.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"GAAC encodes bfloat16 tensors, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 3 or x.shape[1:] != (geometry.block_size, geometry.head_dim):
        raise ValueError(
            f"expected blocks of shape [N, {geometry.block_size}, {geometry.head_dim}], got {tuple(x.shape)}"
        )
    n = x.shape[0]
    dev = x.device
    if n == 0:
        z = torch.zeros(0, dtype=torch.int32, device=dev)
        return EncodedBlocks(
            torch.zeros(0, geometry.slot_bytes, dtype=torch.uint8, device=dev),
            torch.zeros(0, geometry.max_escape_bytes, dtype=torch.uint8, device=dev), z, z.bool(),
            torch.zeros(0, geometry.rows, geometry.cols // GROUP, dtype=torch.int32, device=dev),
        )
    b8 = _check_bases(base8, n, geometry, "base8").unsqueeze(1)  # [N, 1, D]
    b16 = _check_bases(base16, n, geometry, "base16").unsqueeze(1)
    exp, sm = split_bf16(x.contiguous())
    b8 = b8.expand_as(exp)
    b16 = b16.expand_as(exp)
    exp, sm, b8, b16 = (_to_rows(t, geometry) for t in (exp, sm, b8, b16))
    rows, cols = geometry.rows, geometry.cols

    tags = group_modes(exp, b8, b16)  # [N, R, G]
    tag_e = tags.repeat_interleave(GROUP, dim=-1)  # [N, R, C]
    coded = torch.where(tag_e == MODE_3BIT, exp - b8, torch.where(tag_e == MODE_4BIT, exp - b16, exp))
    code = coded & 7
    high = (coded >> 3).reshape(n, rows, cols // GROUP, GROUP)  # [N, R, G, 8]

    # escape byte k of a group = bit-plane k of its high bits (bit j <- value j)
    k = torch.arange(_MAX_ESC, device=dev, dtype=torch.int32)
    j = torch.arange(GROUP, device=dev, dtype=torch.int32)
    planes = (((high.unsqueeze(-2) >> k[:, None]) & 1) << j).sum(-1, dtype=torch.int32)  # [N, R, G, 5]
    count = torch.tensor(ESCAPE_BYTES, device=dev, dtype=torch.int32)[tags].reshape(n, -1)  # [N, RG]
    start = torch.cumsum(count, -1, dtype=torch.int32) - count
    escape_len = count.sum(-1, dtype=torch.int32)
    dest = start.unsqueeze(-1) + k  # [N, RG, 5]
    sink = geometry.max_escape_bytes  # invalid entries land in a scratch column
    dest = torch.where(k < count.unsqueeze(-1), dest, sink).reshape(n, -1).to(torch.int64)
    esc = torch.zeros(n, sink + 1, dtype=torch.int32, device=dev)
    esc.scatter_(1, dest, planes.reshape(n, -1))

    fits = escape_len <= geometry.escape_limit
    slots = torch.zeros(n, geometry.slot_bytes, dtype=torch.uint8, device=dev)

    def put(offset: int, plane: torch.Tensor) -> None:
        flat = plane.reshape(n, -1)
        slots[:, offset : offset + flat.shape[1]] = flat.to(torch.uint8)

    put(geometry.sm_offset, sm)
    # planes are packed over the row-major flattened block (a row may hold fewer than 4 groups)
    put(geometry.lo2_offset, _pack((code & 3).reshape(n, -1), 2))
    put(geometry.hi1_offset, _pack((code >> 2).reshape(n, -1), 1))
    put(geometry.tag_offset, _pack(tags.reshape(n, -1), 2))
    escapes = esc[:, :sink].to(torch.uint8)
    return EncodedBlocks(slots=slots, escapes=escapes, escape_len=escape_len, fits=fits, tags=tags)


# ---------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------
def decode_blocks(
    slots: torch.Tensor, escapes, base8: torch.Tensor, base16: torch.Tensor, geometry: BlockGeometry, *,
    validate: bool = True,
) -> torch.Tensor:
    """Decode slots and their escape streams back to BF16.

    Args:
        slots: uint8 ``[N, geometry.slot_bytes]`` written by :func:`encode_blocks` (fits == True).
        escapes: the blocks' escape streams, either uint8 rows ``[N, W]`` (row i starts with block
            i's stream, e.g. ``EncodedBlocks.escapes``) or a pair ``(heap uint8 [M], esc_start int
            [N])`` with block i's stream at ``heap[esc_start[i]:]`` (see :func:`pack_escapes`).
        base8, base16: uint8 ``[D]`` or ``[N, D]``, the bases they were encoded with.
        validate: check for reserved tags and streams running past the heap (one host sync).
            Without it such reads return 0, as the kernels do.
    Returns:
        BF16 ``[N, T, D]`` with the exact bits that were encoded.
    """
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.shape[1] != geometry.slot_bytes:
        raise ValueError(f"slots must be uint8 [N, {geometry.slot_bytes}], got {slots.dtype} {tuple(slots.shape)}")
    n = slots.shape[0]
    dev = slots.device
    if n == 0:
        return torch.zeros(0, geometry.block_size, geometry.head_dim, dtype=torch.bfloat16, device=dev)
    rows, cols, groups = geometry.rows, geometry.cols, geometry.cols // GROUP

    def plane(offset: int, nbytes: int) -> torch.Tensor:
        return slots[:, offset : offset + nbytes]

    numel = geometry.numel
    sm = plane(geometry.sm_offset, geometry.sm_bytes).to(torch.int32).reshape(n, rows, cols)
    code = _unpack(plane(geometry.lo2_offset, geometry.lo2_bytes), 2, numel) | (
        _unpack(plane(geometry.hi1_offset, geometry.hi1_bytes), 1, numel) << 2
    )
    code = code.reshape(n, rows, cols)
    tags = _unpack(plane(geometry.tag_offset, geometry.tag_bytes), 2, geometry.groups).reshape(n, rows, groups)

    heap, esc_start = escape_source(escapes, n, dev)
    count = torch.tensor(ESCAPE_BYTES, device=dev, dtype=torch.int64)[tags].reshape(n, -1)
    start = torch.cumsum(count, -1) - count + esc_start[:, None]  # heap offset of each group's stream
    if validate:
        if bool((tags == MODE_RESERVED).any()):
            raise ValueError("corrupt GAAC slot: reserved mode tag 3")
        if bool((esc_start < 0).any()) or bool((esc_start + count.sum(-1) > heap.numel()).any()):
            raise ValueError("corrupt GAAC block: its escape stream runs past the escape heap")
    m = heap.numel()
    src = torch.cat([heap.to(torch.int32), heap.new_zeros(1, dtype=torch.int32)])  # index m reads 0
    k = torch.arange(_MAX_ESC, device=dev, dtype=torch.int64)
    idx = start.unsqueeze(-1) + k
    idx = torch.where((k < count.unsqueeze(-1)) & (idx >= 0) & (idx < m), idx, m)
    planes = src[idx.reshape(n, -1)].reshape(n, rows, groups, _MAX_ESC, 1)
    j = torch.arange(GROUP, device=dev, dtype=torch.int32)
    high = (((planes >> j) & 1) << k[:, None]).sum(-2, dtype=torch.int32)  # [N, R, G, 8]
    coded = code | (high.reshape(n, rows, cols) << 3)

    tag_e = tags.repeat_interleave(GROUP, dim=-1)
    b8 = _to_rows(_check_bases(base8, n, geometry, "base8").unsqueeze(1).expand(n, geometry.block_size, -1), geometry)
    b16 = _to_rows(_check_bases(base16, n, geometry, "base16").unsqueeze(1).expand(n, geometry.block_size, -1), geometry)
    exp = torch.where(tag_e == MODE_3BIT, b8 + coded, torch.where(tag_e == MODE_4BIT, b16 + coded, coded))
    return _from_rows(join_bf16(exp, sm), geometry).contiguous()


# ---------------------------------------------------------------------------------------------
# whole-tensor convenience API
# ---------------------------------------------------------------------------------------------
@dataclass
class EncodedTensor:
    """A ``[H, S, D]`` BF16 tensor as GAAC blocks + raw fallbacks + an uncompressed tail.

    blocks:  :class:`EncodedBlocks` for the ``H * (S // T)`` complete blocks, head-major.
    raw:     BF16 ``[N, T, D]`` copies of the blocks that did not fit (``~blocks.fits``), in order.
    tail:    BF16 ``[H, S % T, D]``, the incomplete last block, never encoded.
    """

    geometry: BlockGeometry
    heads: int
    seq_len: int
    blocks: EncodedBlocks
    raw: torch.Tensor
    tail: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return self.blocks.slots.shape[0]

    def nbytes(self, *, with_overhead: bool = True) -> int:
        """Stored bytes. Codec-only counts planes + escape bytes of fitting blocks and raw blocks;
        with overhead also the slots' alignment padding, an 8-byte ``esc_start`` per compressed
        block and a 4-byte block-table entry per block (what :class:`~gaac_hf.cache.GAACCache` holds)."""
        g = self.geometry
        fits = self.blocks.fits
        n_fit = int(fits.sum())
        n_raw = self.num_blocks - n_fit
        tail = self.tail.numel() * 2
        esc = int(self.blocks.escape_len[fits].sum())
        if with_overhead:
            return n_fit * (g.slot_bytes + 8) + esc + n_raw * g.raw_bytes + 4 * self.num_blocks + tail
        fixed = g.sm_bytes + g.lo2_bytes + g.hi1_bytes + g.tag_bytes
        return n_fit * fixed + esc + n_raw * g.raw_bytes + tail


def encode_tensor(
    x: torch.Tensor, base8: torch.Tensor, base16: torch.Tensor, geometry: BlockGeometry
) -> EncodedTensor:
    """Encode a per-layer K or V tensor.

    Args:
        x: BF16 ``[H, S, D]`` (kv-heads, tokens, head_dim).
        base8, base16: uint8 ``[H, D]`` per-head, per-channel window starts.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"GAAC encodes bfloat16 tensors, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 3 or x.shape[-1] != geometry.head_dim:
        raise ValueError(f"expected [heads, seq, {geometry.head_dim}], got {tuple(x.shape)}")
    h, s, d = x.shape
    for name, b in (("base8", base8), ("base16", base16)):
        if b.shape != (h, d):
            raise ValueError(f"{name} must have shape [{h}, {d}], got {tuple(b.shape)}")
    t = geometry.block_size
    nb = s // t
    full = x[:, : nb * t].reshape(h * nb, t, d)
    enc = encode_blocks(full, base8.repeat_interleave(nb, 0), base16.repeat_interleave(nb, 0), geometry)
    return EncodedTensor(
        geometry=geometry, heads=h, seq_len=s, blocks=enc, raw=full[~enc.fits].clone(), tail=x[:, nb * t :].clone()
    )


def decode_tensor(enc: EncodedTensor, base8: torch.Tensor, base16: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode_tensor`: returns BF16 ``[H, S, D]`` with identical bits."""
    g = enc.geometry
    h, nb = enc.heads, enc.seq_len // g.block_size
    fits = enc.blocks.fits
    out = torch.empty(h * nb, g.block_size, g.head_dim, dtype=torch.bfloat16, device=enc.blocks.slots.device)
    b8, b16 = base8.repeat_interleave(nb, 0), base16.repeat_interleave(nb, 0)
    if bool(fits.any()):
        out[fits] = decode_blocks(enc.blocks.slots[fits], enc.blocks.escapes[fits], b8[fits], b16[fits], g)
    out[~fits] = enc.raw
    return torch.cat([out.reshape(h, nb * g.block_size, g.head_dim), enc.tail], dim=1)
