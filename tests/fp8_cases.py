"""Shared FP8-tile test inputs: every code in every channel position, special codes, adversarial blocks."""
import torch

from gaac_hf.codec.fp8 import quantize_fp8, split_fp8
from gaac_hf.format.fp8 import GeometryFP8

DTYPES = ["fp8_e4m3", "fp8_e5m2"]
SPECIALS = {  # NaN / Inf / zero / subnormal / max-finite codes of each format
    "fp8_e4m3": [0x7F, 0xFF, 0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x08, 0x7E, 0xFE],
    "fp8_e5m2": [0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF, 0x00, 0x80, 0x01, 0x83, 0x7B, 0xFB, 0x04],
}


def same_codes(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    diff = a != b
    assert not bool(diff.any()), f"{int(diff.sum())} codes changed, first at {diff.nonzero()[0].tolist()}"


def every_code_blocks(g: GeometryFP8):
    """(x, base_n, base_w): column c holds all 256 codes rotated by c (block b, row r: code 64b + r + c), so
    every code meets every channel; 'near' bases follow each channel's first exponent in the block with
    per-block offsets (all modes occur), then the same codes with step 37 per column and random bases."""
    d, t = g.head_dim, g.block_size
    gen = torch.Generator().manual_seed(d)
    for step in (1, 37):
        r = torch.arange(256).unsqueeze(1)  # 256 / T blocks
        x = ((r + torch.arange(d)[None] * step) % 256).to(torch.uint8).reshape(-1, t, d)
        n = x.shape[0]
        if step == 1:
            e0 = split_fp8(x[:, 0], g)[0]  # [N, D] exponent of each channel's first code in the block
            blk = torch.arange(n)[:, None]
            bn = (e0 - blk % 2).clamp(0, g.max_base_narrow).to(torch.uint8)
            bw = (e0 - 2 * (blk % 3)).clamp(0, g.max_base_wide).to(torch.uint8)
        else:
            bn = torch.randint(0, g.max_base_narrow + 1, (d,), generator=gen, dtype=torch.uint8)
            bw = torch.randint(0, g.max_base_wide + 1, (d,), generator=gen, dtype=torch.uint8)
        yield x, bn, bw


def special_blocks(g: GeometryFP8, seed: int = 5):
    """(x [2, T, D], base_n [D], base_w [D]): the format's NaN / Inf / zero / subnormal / max codes, dense
    (random) and sparse (40 of them among 1.0s, the windows around 1.0: the block stays compressed)."""
    t, d = g.block_size, g.head_dim
    gen = torch.Generator().manual_seed(seed)
    sp = torch.tensor(SPECIALS[g.dtype], dtype=torch.uint8)
    dense = sp[torch.randint(0, sp.numel(), (t * d,), generator=gen)].reshape(1, t, d)
    sparse = torch.full((t * d,), 0x38 if g.dtype == "fp8_e4m3" else 0x3C, dtype=torch.uint8)  # 1.0
    pos = torch.randperm(t * d, generator=gen)[:40]
    sparse[pos] = sp[torch.arange(40) % sp.numel()]
    e1 = split_fp8(sparse[:1], g)[0]
    bn, bw = (e1 - 2).to(torch.uint8).expand(d).contiguous(), torch.zeros(d, dtype=torch.uint8)
    return torch.cat([dense, sparse.reshape(1, t, d)]), bn, bw


def adversarial_blocks(g: GeometryFP8, seed: int):
    """(x [N, T, D], base_n [N, D], base_w [N, D]): random bytes (too many wide groups: stored raw),
    KV-like codes at extreme windows, every (row, channel-group) mode mix, one wide group at the last
    chunk of each segment. The first block does not fit, the last does."""
    t, d, E = g.block_size, g.head_dim, g.exp_bits
    gen = torch.Generator().manual_seed(seed)
    blocks, bns, bws = [], [], []

    def add(codes, bn, bw):
        blocks.append(codes.to(torch.uint8).reshape(t, d))
        bns.append(torch.as_tensor(bn).to(torch.uint8).expand(d))
        bws.append(torch.as_tensor(bw).to(torch.uint8).expand(d))

    rnd = lambda hi: torch.randint(0, hi + 1, (d,), generator=gen)  # noqa: E731
    add(torch.randint(0, 256, (t * d,), generator=gen), rnd(g.max_base_narrow), rnd(g.max_base_wide))
    kv = quantize_fp8(torch.randn(t, d, generator=gen) * 3, 0.01, g.dtype)
    for b_n, b_w in ((0, 0), (g.max_base_narrow, g.max_base_wide), (g.max_base_narrow, 0), (0, g.max_base_wide)):
        add(kv, torch.tensor(b_n), torch.tensor(b_w))
    rows = torch.arange(t)[:, None].expand(t, d)
    cols = torch.arange(d)[None, :].expand(t, d) // 8
    mode = ((rows * 7 + cols * 3) // 2) % (3 if g.has_raw else 2)
    sm = torch.randint(0, 256, (t, d), generator=gen) & ~(((1 << E) - 1) << g.man_bits)  # sign + mantissa bits
    base_n, base_w = 4, (min(4, g.max_base_wide))
    e = torch.where(mode == 0, base_n + torch.randint(0, 8, (t, d), generator=gen),
                    torch.where(mode == 1, base_w + torch.randint(0, 16, (t, d), generator=gen),
                                torch.randint(0, 1 << E, (t, d), generator=gen)))
    first = (torch.arange(t * d) % d) == 0
    e.view(-1)[first & (mode.view(-1) == 1)] = base_n + 9  # a wide group has a value outside the narrow window
    add(sm | (e << g.man_bits), torch.tensor(base_n), torch.tensor(base_w))
    e1 = torch.full((t, d), base_n + 2)
    e1[3::4, 7::8] = base_n + 10  # one wide group per chunk column at the last row of each chunk
    add(sm | (e1 << g.man_bits), torch.tensor(base_n), torch.tensor(base_w))
    return torch.stack(blocks), torch.stack(bns), torch.stack(bws)


_KV: dict = {}


def smollm2_kv(model, tok, text: str, tokens: int) -> list:
    """[(K, V)] per layer, BF16 [Hkv, S, D]: post-RoPE K/V of SmolLM2 on the first `tokens` tokens of text
    (one forward per model and length in a process: the FP8 tests of both dtypes share it)."""
    key = (id(model), tokens)
    if key not in _KV:
        from gaac_hf.calibration.collect import run_chunks, tokenize

        ids = tokenize(tok, text, tokens)[None, :tokens]
        ((_, keys, values),) = list(run_chunks(model, ids, progress=False))
        _KV[key] = list(zip(keys, values))
    return _KV[key]


def real_fp8_blocks(smollm2, text: str, dtype: str, tokens: int = 256, layers=(0, 14, 29)):
    """(x [N, 64, 64], base_n [N, D], base_w [N, D]): K and V of the given layers converted as the FP8 caches
    convert them (amax scale of the first half, saturating), windows of each kv-head from the first half."""
    from gaac_hf.codec.fp8 import choose_windows_fp8, exponent_histogram_fp8, fp8_scale

    model, tok = smollm2
    g = GeometryFP8(64, 64, dtype)
    kv = smollm2_kv(model, tok, text, tokens)
    xs, bns, bws = [], [], []
    for li in (range(len(kv)) if layers is None else layers):
        for x in kv[li]:
            half = x.shape[1] // 2
            codes = quantize_fp8(x, fp8_scale(x[:, :half], dtype), dtype, saturate=True)  # [H, S, D]
            bn, bw = choose_windows_fp8(exponent_histogram_fp8(codes[:, :half], g), g)
            blocks = codes.shape[1] // 64
            xs.append(codes[:, : 64 * blocks].reshape(-1, 64, 64))
            bns.append(bn.repeat_interleave(blocks, 0)), bws.append(bw.repeat_interleave(blocks, 0))
    return torch.cat(xs), torch.cat(bns), torch.cat(bws)
