"""Triton GAAC block encoder: BF16 blocks -> fixed-capacity slots, byte-identical to the reference.

Reference: ``gaac_hf.codec.encode_blocks`` (the executable spec). This kernel must produce the same
``slots`` bytes (every byte, zeros past the escape stream included), ``escape_len`` and ``fits`` for
every input bit pattern. Only ``group_axis="channel"`` (the format's default) is implemented here;
the token axis stays reference-only.

One program encodes one block (T x D values, e.g. 64 x 128 = 16 KB of BF16) held as a ``[T, Q, 4, 8]``
register tile (see ``_tile.py``): modes are min/max reductions over axis 3, plane words are sums of
shifted codes over axis 3 (or 2 for the tag byte), and the escape stream is a masked scatter at the
groups' prefix-sum offsets. Many blocks (all complete blocks of a prefill) go in one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gaac_hf.codec import EncodedBlocks
from gaac_hf.format import BlockGeometry

from ._tile import escape_starts, tile_index


@triton.jit
def _encode_kernel(
    X,  # *int16 [N, T, D]: the BF16 blocks' bits
    B8,  # *uint8 [N or 1, D]
    B16,
    SLOTS,  # *uint8 [N, SLOT_BYTES]
    ESC_LEN,  # *int32 [N]
    FITS,  # *int8 [N]
    TAGS,  # *int32 [N, T, D/8] (written only when WRITE_TAGS)
    base_stride,  # 0 when one base vector serves all blocks, else D
    SLOT_BYTES: tl.constexpr,
    LO2_OFF: tl.constexpr,
    HI1_OFF: tl.constexpr,
    TAG_OFF: tl.constexpr,
    ESC_OFF: tl.constexpr,
    CAP: tl.constexpr,
    CAP_P2: tl.constexpr,  # next power of two >= CAP (>= 16), for the zero fill
    T: tl.constexpr,
    D: tl.constexpr,
    WRITE_TAGS: tl.constexpr,
):
    Q: tl.constexpr = D // 32
    n = tl.program_id(0).to(tl.int64)
    grp, elem, chan, t, q, i, j = tile_index(T, D)
    bits = tl.load(X + n * (T * D) + elem).to(tl.int32) & 0xFFFF
    b8 = tl.load(B8 + n * base_stride + chan).to(tl.int32)
    b16 = tl.load(B16 + n * base_stride + chan).to(tl.int32)
    exp = (bits >> 7) & 0xFF
    sm = ((bits >> 8) & 0x80) | (bits & 0x7F)

    # mode per group: narrowest window every value of the group fits in
    off8 = exp - b8
    off16 = exp - b16
    fit3 = (tl.min(off8, axis=3, keep_dims=True) >= 0) & (tl.max(off8, axis=3, keep_dims=True) < 8)
    fit4 = (tl.min(off16, axis=3, keep_dims=True) >= 0) & (tl.max(off16, axis=3, keep_dims=True) < 16)
    tag = tl.where(fit3, 0, tl.where(fit4, 1, 2))  # [T, Q, 4, 1]
    coded = tl.where(tag == 0, off8, tl.where(tag == 1, off16, exp))  # >= 0 in its mode
    code = coded & 7
    high = coded >> 3

    slot = SLOTS + n * SLOT_BYTES
    tl.store(slot + elem, sm.to(tl.uint8))
    lo2 = tl.sum((code & 3) << (2 * j), axis=3, keep_dims=True)  # u16 per group, LSB first
    tl.store((slot + LO2_OFF).to(tl.pointer_type(tl.uint16)) + grp, lo2.to(tl.uint16))
    hi1 = tl.sum((code >> 2) << j, axis=3, keep_dims=True)
    tl.store(slot + HI1_OFF + grp, hi1.to(tl.uint8))
    if WRITE_TAGS:  # per-group modes for statistics (the reference's EncodedBlocks.tags)
        tl.store(TAGS + n * (T * (D // 8)) + grp, tag)
    tagb = tl.sum(tag << (2 * i), axis=2, keep_dims=True)  # [T, Q, 1, 1]
    tl.store(slot + TAG_OFF + t * Q + q, tagb.to(tl.uint8))

    # escape stream: byte k of a group is bit-plane k of its high bits; truncated at the capacity
    cnt = tl.where(tag == 1, 1, tl.where(tag == 2, 5, 0))
    start = escape_starts(cnt, T, D)
    esc = slot + ESC_OFF + start
    for k in tl.static_range(0, 5):
        byte = tl.sum(((high >> k) & 1) << j, axis=3, keep_dims=True)
        tl.store(esc + k, byte.to(tl.uint8), mask=(k < cnt) & (start + k < CAP))
    esc_len = tl.sum(tl.reshape(cnt, [T * (D // 8)]), 0)
    # the bytes past the stream are zero (disjoint from the scatter above: no ordering needed)
    p = tl.arange(0, CAP_P2)
    tl.store(slot + ESC_OFF + p, tl.zeros([CAP_P2], tl.uint8), mask=(p < CAP) & (p >= esc_len))
    tl.store(ESC_LEN + n, esc_len)
    tl.store(FITS + n, (esc_len <= CAP).to(tl.int8))


def _check_geometry(geometry: BlockGeometry) -> None:
    if geometry.group_axis != "channel":
        raise NotImplementedError(
            "the Triton kernels implement group_axis='channel' only; use gaac_hf.codec for 'token'"
        )
    g = geometry
    # the kernels write/read every byte of a slot as one of the planes: no padding gaps allowed
    ends = (g.sm_bytes, g.lo2_offset + g.lo2_bytes, g.hi1_offset + g.hi1_bytes, g.tag_offset + g.tag_bytes)
    starts = (g.lo2_offset, g.hi1_offset, g.tag_offset, g.esc_offset)
    if ends != starts or g.esc_offset + g.escape_capacity != g.slot_bytes:
        raise NotImplementedError(f"slot layout with padding gaps is not supported: {g}")


def _bases(base: torch.Tensor, n: int, d: int, name: str) -> tuple[torch.Tensor, int]:
    if base.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8, got {base.dtype}")
    if base.dim() == 1:
        base = base.unsqueeze(0)
    if base.dim() != 2 or base.shape[1] != d or base.shape[0] not in (1, n):
        raise ValueError(f"{name} must be [D] or [N, D] = [{n}, {d}], got {tuple(base.shape)}")
    base = base.contiguous()
    return base, (0 if base.shape[0] == 1 else d)


def encode_blocks_triton(
    x: torch.Tensor,
    base8: torch.Tensor,
    base16: torch.Tensor,
    geometry: BlockGeometry,
    *,
    slots: torch.Tensor | None = None,
    with_tags: bool = False,
) -> EncodedBlocks:
    """Encode N BF16 blocks into slots in one launch (byte-identical to ``codec.encode_blocks``).

    Args:
        x: bf16 ``[N, T, D]``, T = geometry.block_size, D = geometry.head_dim.
        base8, base16: uint8 ``[D]`` or ``[N, D]`` window starts per channel.
        geometry: the block format (group_axis must be "channel").
        slots: optional preallocated uint8 ``[N, slot_bytes]`` to write into (e.g. rows of a slot
            pool); every byte of each row is written.
        with_tags: also write the per-group modes (int32 ``[N, T, D/8]``, as the reference's
            ``tags``) for mode statistics; +25% bytes written, so off by default (tags=None).
    Returns:
        ``EncodedBlocks(slots [N, slot_bytes] uint8, escape_len [N] int32, fits [N] bool, tags)``.
    """
    _check_geometry(geometry)
    if x.dtype != torch.bfloat16 or x.dim() != 3 or x.shape[1:] != (geometry.block_size, geometry.head_dim):
        raise ValueError(
            f"expected bf16 [N, {geometry.block_size}, {geometry.head_dim}], got {x.dtype} {tuple(x.shape)}"
        )
    n, t, d = x.shape
    b8, s8 = _bases(base8, n, d, "base8")
    b16, s16 = _bases(base16, n, d, "base16")
    if s8 != s16:  # one stride serves both
        b8, b16 = b8.expand(n, d).contiguous(), b16.expand(n, d).contiguous()
        s8 = d
    if slots is None:
        slots = torch.empty(n, geometry.slot_bytes, dtype=torch.uint8, device=x.device)
    elif slots.dtype != torch.uint8 or slots.shape != (n, geometry.slot_bytes) or not slots.is_contiguous():
        raise ValueError(f"slots must be contiguous uint8 [{n}, {geometry.slot_bytes}]")
    esc_len = torch.empty(n, dtype=torch.int32, device=x.device)
    fits = torch.empty(n, dtype=torch.int8, device=x.device)
    tags = torch.empty(n, t, d // 8, dtype=torch.int32, device=x.device) if with_tags else None
    if n:
        g = geometry
        _encode_kernel[(n,)](
            x.contiguous().view(torch.int16), b8, b16, slots, esc_len, fits, tags if with_tags else esc_len, s8,
            SLOT_BYTES=g.slot_bytes, LO2_OFF=g.lo2_offset, HI1_OFF=g.hi1_offset, TAG_OFF=g.tag_offset,
            ESC_OFF=g.esc_offset, CAP=g.escape_capacity, CAP_P2=max(16, triton.next_power_of_2(g.escape_capacity)),
            T=t, D=d, WRITE_TAGS=with_tags, num_warps=max(4, t * d // 1024),
        )
    return EncodedBlocks(slots=slots, escape_len=esc_len, fits=fits.bool(), tags=tags)
