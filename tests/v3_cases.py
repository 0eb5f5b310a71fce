"""Shared v3 test inputs: every BF16 pattern in every channel position, adversarial blocks."""
import torch

from gaac_hf.v3.codec import split_bf16
from gaac_hf.v3.format import GeometryV3


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    diff = a.contiguous().view(torch.int16) != b.contiguous().view(torch.int16)
    assert not bool(diff.any()), f"{int(diff.sum())} values changed bits, first at {diff.nonzero()[0].tolist()}"


def every_pattern_blocks(g: GeometryV3):
    """Yield (x, base8, base16): column c holds all 65,536 patterns rotated by c ('near': groups share an
    exponent, bases placed per block so all three modes occur across every pattern range), then the
    same patterns with step 257 per column and random bases (nearly all groups raw)."""
    d, t = g.head_dim, g.block_size
    r = torch.arange(65536).unsqueeze(1)
    c = torch.arange(d).unsqueeze(0)
    gen = torch.Generator().manual_seed(d)
    for step in (1, 257):
        x = ((r + c * step) % 65536).to(torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, t, d)
        n = x.shape[0]
        if step == 1:
            e_min = split_bf16(x)[0].reshape(n, -1).min(-1).values
            blk = torch.arange(n)
            b8 = (e_min - blk % 9).clamp(0, 248).to(torch.uint8)[:, None].expand(n, d).contiguous()
            b16 = (e_min - blk % 17 + 20 * (blk % 5 == 0)).clamp(0, 240).to(torch.uint8)[:, None].expand(n, d).contiguous()
        else:
            b8 = torch.randint(0, 249, (d,), generator=gen, dtype=torch.uint8)
            b16 = torch.randint(0, 241, (d,), generator=gen, dtype=torch.uint8)
            b8[:2], b16[:2] = torch.tensor([0, 248], dtype=torch.uint8), torch.tensor([0, 240], dtype=torch.uint8)
        yield x, b8, b16


def adversarial_blocks(g: GeometryV3, seed: int = 0):
    """(x [N, T, D], base8 [N, D], base16 [N, D]): special values and mode mixes.

    Blocks: NaN payloads / +-Inf / +-0 / subnormals / exponent 0 and 255 mixed; random bit patterns
    (too many wide groups: fits == False); KV-like values with extreme bases (0, 248 / 240) so the raw
    code wraps mod 256; every (mode of row r) combination inside chunks; a single wide group per segment.
    """
    d, t = g.head_dim, g.block_size
    gen = torch.Generator().manual_seed(seed)
    blocks, b8s, b16s = [], [], []

    def add(bits: torch.Tensor, b8: torch.Tensor, b16: torch.Tensor) -> None:
        blocks.append(bits.to(torch.int16).view(torch.bfloat16).reshape(t, d))
        b8s.append(b8.to(torch.uint8).expand(d))
        b16s.append(b16.to(torch.uint8).expand(d))

    special = torch.tensor([0x7FC0, 0x7FC1, 0x7FFF, 0xFFFF, 0xFF81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F,
                            0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80], dtype=torch.int32)
    idx = torch.randint(0, special.numel(), (t * d,), generator=gen)
    rnd = lambda hi: torch.randint(0, hi, (d,), generator=gen)  # noqa: E731
    add(special[idx].to(torch.int16), rnd(249), rnd(241))
    add(torch.randint(-32768, 32768, (t * d,), generator=gen), rnd(249), rnd(241))
    kv = (torch.randn(t * d, generator=gen) * 2).to(torch.bfloat16).view(torch.int16)
    for b8v, b16v in ((0, 0), (248, 240), (248, 0), (0, 240), (125, 119)):
        add(kv, torch.tensor(b8v), torch.tensor(b16v))
    # every mode mix: group (row, col) gets mode ((row * 7 + col * 3) // 2) % 3 around exponent 127
    rows = torch.arange(t)[:, None].expand(t, d)
    cols = torch.arange(d)[None, :].expand(t, d) // 8
    mode = ((rows * 7 + cols * 3 + seed) // 2) % 3
    m = torch.randint(0, 128, (t, d), generator=gen)
    sgn = torch.randint(0, 2, (t, d), generator=gen) << 15
    off = torch.where(mode == 0, torch.randint(0, 8, (t, d), generator=gen),
                      torch.where(mode == 1, torch.randint(0, 16, (t, d), generator=gen), torch.randint(0, 256, (t, d), generator=gen)))
    # 4-bit groups: exponents in [120, 136) (base16 = 120), 3-bit in [124, 132) (base8 = 124); raw anywhere
    e = torch.where(mode == 0, 124 + off, torch.where(mode == 1, 120 + off, off))
    ch = (torch.arange(t * d) % d) == 0
    e.view(-1)[ch & (mode.view(-1) == 1)] = 135  # a 4-bit group always has a value outside the 8-window
    add((sgn | (e << 7) | m).reshape(-1), torch.tensor(124), torch.tensor(120))
    # one wide group per segment, at the last chunk of the segment, last row
    e1 = torch.full((t, d), 126)
    e1[3::4, 7::8] = 140
    add((sgn | (e1 << 7) | m).reshape(-1), torch.tensor(124), torch.tensor(130))
    return torch.stack(blocks), torch.stack(b8s), torch.stack(b16s)
