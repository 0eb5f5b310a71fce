"""Triton encoder/decoder vs the reference codec: byte-identical slots, escape rows and escape heap,
bit-identical decode.

Runs on CPU through TRITON_INTERPRET=1 (set in conftest.py); the @gpu variants run real sizes on CUDA.
"""
import dataclasses

import pytest
import torch

from gaac_hf.codec import decode_blocks, encode_blocks, pack_escapes
from gaac_hf.format import BlockGeometry
from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.triton.pack import pack_paged_kv
from gaac_hf.kernels.triton.decode import decode_blocks_triton, decode_tables_triton
from gaac_hf.kernels.triton.encode import append_escapes_triton, encode_blocks_triton
from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
from gaac_hf.models import cache_kwargs

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SPECIALS = [0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0x0080, 0x3F80]


def _bits(x):
    return x.view(torch.int16)


def _adversarial(n, t, d, seed):
    """KV-like blocks plus: special bit patterns, out-of-window values, fully random bit patterns."""
    g = torch.Generator().manual_seed(seed)
    x = synthetic_kv((1, 1, n * t, d), "k", seed=seed).reshape(n, t, d)
    b8, b16 = calibrate(x.reshape(1, 1, n * t, d))
    b = _bits(x)
    sp = torch.tensor(SPECIALS, dtype=torch.int32).to(torch.int16)
    # block 0: specials sprinkled everywhere; block 1: uniformly random bits (mostly raw groups)
    idx = torch.randint(0, t * d, (t * d // 4,), generator=g)
    b[0].view(-1)[idx] = sp[torch.randint(0, len(sp), idx.shape, generator=g)]
    if n > 1:
        b[1] = torch.randint(-(2**15), 2**15, (t, d), generator=g, dtype=torch.int32).to(torch.int16)
    if n > 2:  # block 2: one value per group pushed just out of the 8-window (-> 4-bit groups)
        e = (b8[0].int() + 8).clamp(max=255)
        b[2, :, ::8] = ((e[::8] << 7) | 0x15).to(torch.int16)
    return x, b8[0], b16[0]


GEOMS = [
    BlockGeometry(block_size=16, head_dim=64),
    BlockGeometry(block_size=32, head_dim=128),
    BlockGeometry(block_size=16, head_dim=256),
    BlockGeometry(block_size=64, head_dim=128),
]


@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: f"T{g.block_size}-D{g.head_dim}")
@pytest.mark.parametrize("per_block_bases", [False, True])
@pytest.mark.parametrize("fast", [False, True], ids=["block", "groups"])
def test_encode_matches_reference(geom, per_block_bases, fast):
    n = 5
    x, b8, b16 = _adversarial(n, geom.block_size, geom.head_dim, seed=geom.head_dim + per_block_bases)
    if per_block_bases:
        g = torch.Generator().manual_seed(3)
        b8 = (b8.int() + torch.randint(-2, 3, (n, geom.head_dim), generator=g)).clamp(0, 248).to(torch.uint8)
        b16 = (b16.int() + torch.randint(-2, 3, (n, geom.head_dim), generator=g)).clamp(0, 240).to(torch.uint8)
    ref = encode_blocks(x, b8, b16, geom)
    poison = torch.full((n, geom.slot_bytes), 0xA5, dtype=torch.uint8)  # every byte must be written
    got = encode_blocks_triton(x, b8, b16, geom, slots=poison, with_tags=True, fast=fast, launch=LaunchConfig(tile_tokens=8))
    assert torch.equal(got.tags, ref.tags)
    assert torch.equal(got.escape_len, ref.escape_len)
    assert torch.equal(got.fits, ref.fits)
    assert torch.equal(got.slots, ref.slots)
    assert torch.equal(got.escapes, ref.escapes)  # full-width rows, zeros past the stream
    assert not got.fits.all()  # the random-bits block is longer than the escape limit
    assert got.fits.sum() >= n - 1  # KV-like and adversarial-but-sparse blocks fit: both kinds exercised
    assert (ref.escape_len[ref.fits] > 0).all()  # every fitting block has a non-empty stream here

    # the cache's path: rows as wide as the escape limit, packed into a heap that already holds bytes
    rows = encode_blocks_triton(x, b8, b16, geom, escape_width=geom.escape_limit, fast=fast, launch=LaunchConfig(tile_tokens=8))
    assert torch.equal(rows.slots, ref.slots) and torch.equal(rows.fits, ref.fits)
    heap = torch.full((50 + int(ref.escape_len[ref.fits].sum()) + 9,), 0xA5, dtype=torch.uint8)
    used = torch.tensor([50], dtype=torch.int64)
    start = append_escapes_triton(rows, heap, used)
    want_heap, want_start = pack_escapes(ref.escapes[ref.fits], ref.escape_len[ref.fits], start=50)
    assert torch.equal(start[ref.fits], want_start)
    assert int(used) == 50 + want_heap.numel()
    assert torch.equal(heap[50: int(used)], want_heap)
    assert (heap[:50] == 0xA5).all() and (heap[int(used):] == 0xA5).all()  # nothing outside the streams


@pytest.mark.parametrize("geom", GEOMS[:3], ids=lambda g: f"T{g.block_size}-D{g.head_dim}")
def test_decode_matches_reference_and_roundtrips(geom):
    n = 6
    x, b8, b16 = _adversarial(n, geom.block_size, geom.head_dim, seed=7 + geom.head_dim)
    enc = encode_blocks(x, b8, b16, geom)
    out = torch.full_like(x, float("nan"))
    got = decode_blocks_triton(enc.slots, enc.escapes, b8, b16, geom, out=out)
    ref = decode_blocks(enc.slots, enc.escapes, b8, b16, geom, validate=False)
    assert torch.equal(_bits(got), _bits(ref))
    assert torch.equal(_bits(got), _bits(x))  # rows hold every stream in full: lossless for all blocks
    assert enc.fits.sum() >= 2
    # from a heap (what the cache stores), and attention's fast decoder (assumes fitting blocks)
    fit = enc.fits
    heap, start = pack_escapes(enc.escapes[fit], enc.escape_len[fit])
    from_heap = decode_blocks_triton(enc.slots[fit], (heap, start), b8, b16, geom)
    assert torch.equal(_bits(from_heap), _bits(x)[fit])
    fast = decode_blocks_triton(enc.slots[fit], (heap, start), b8, b16, geom, fast=True, launch=LaunchConfig(tile_tokens=8))
    assert torch.equal(_bits(fast), _bits(x)[fit])
    # launch options change nothing but speed
    out2 = torch.full_like(fast, float("nan"))
    decode_blocks_triton(enc.slots[fit], (heap, start), b8, b16, geom, out=out2, fast=True, launch=LaunchConfig(tile_tokens=16, num_warps=2))
    assert torch.equal(_bits(out2), _bits(x)[fit])


def test_decode_garbage_slots_matches_reference():
    """Random bytes (reserved tags, streams starting before or running past the heap) decode exactly
    as the reference with validate=False."""
    geom = BlockGeometry(block_size=16, head_dim=128)
    g = torch.Generator().manual_seed(11)
    slots = torch.randint(0, 256, (4, geom.slot_bytes), generator=g, dtype=torch.int32).to(torch.uint8)
    b8 = torch.randint(0, 256, (4, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    b16 = torch.randint(0, 256, (4, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    heap = torch.randint(0, 256, (700,), generator=g, dtype=torch.int32).to(torch.uint8)
    start = torch.tensor([0, 650, -40, 300], dtype=torch.int64)
    got = decode_blocks_triton(slots, (heap, start), b8, b16, geom)
    ref = decode_blocks(slots, (heap, start), b8, b16, geom, validate=False)
    assert torch.equal(_bits(got), _bits(ref))


def test_token_axis_is_reference_only():
    geom = BlockGeometry(block_size=16, head_dim=64, group_axis="token")
    x = synthetic_kv((1, 1, 16, 64)).reshape(1, 16, 64)
    b = torch.full((64,), 120, dtype=torch.uint8)
    with pytest.raises(NotImplementedError):
        encode_blocks_triton(x, b, b, geom)
    with pytest.raises(NotImplementedError):
        decode_blocks_triton(torch.zeros(1, geom.slot_bytes, dtype=torch.uint8), torch.zeros(1, 8, dtype=torch.uint8), b, b, geom)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_codec_gpu_real_size(d):
    geom = BlockGeometry(block_size=64, head_dim=d)
    n = 4096
    x, b8, b16 = _adversarial(n, 64, d, seed=d)
    x, b8, b16 = x.to(DEV), b8.to(DEV), b16.to(DEV)
    ref = encode_blocks(x, b8, b16, geom)
    got = encode_blocks_triton(x, b8, b16, geom, slots=torch.full((n, geom.slot_bytes), 0xA5, dtype=torch.uint8, device=DEV))
    assert torch.equal(got.slots, ref.slots) and torch.equal(got.escape_len, ref.escape_len)
    assert torch.equal(got.escapes, ref.escapes)
    rows = encode_blocks_triton(x, b8, b16, geom, escape_width=geom.escape_limit)
    heap = torch.full((int(ref.escape_len[ref.fits].sum()) + 1,), 0xA5, dtype=torch.uint8, device=DEV)
    used = torch.zeros(1, dtype=torch.int64, device=DEV)
    start = append_escapes_triton(rows, heap, used)
    want_heap, want_start = pack_escapes(ref.escapes[ref.fits], ref.escape_len[ref.fits])
    assert torch.equal(heap[: want_heap.numel()], want_heap) and torch.equal(start[ref.fits], want_start)
    fit = ref.fits
    dec = decode_blocks_triton(ref.slots[fit], (heap, start[fit]), b8, b16, geom)
    assert torch.equal(_bits(dec), _bits(x)[fit])
    fast = decode_blocks_triton(ref.slots[fit], (heap, start[fit]), b8, b16, geom, fast=True)
    assert torch.equal(_bits(fast), _bits(x)[fit])


@pytest.mark.parametrize("geom", GEOMS[:3], ids=lambda g: f"T{g.block_size}-D{g.head_dim}")
def test_table_decode_gives_back_the_cache_bits(geom):
    """decode_tables_triton over a layer's K and V paged caches (slots through a heap, raw fallbacks,
    tables with spare columns, strided tails) writes exactly the dense K and V they were built from."""
    t, d = geom.block_size, geom.head_dim
    B, H, nb, tl_len = 2, 2, 3, 3  # the adversarial blocks (0-2 of the first row and head), forced raw entries in every row
    kv, pools, tails = [], [], []
    for kind in range(2):
        x, _, _ = _adversarial(B * H * nb, t, d, seed=d + 7 + kind)  # specials, random-bit blocks, 4-bit groups
        x = torch.cat([x.reshape(B, H, nb * t, d), x.reshape(B, H, nb * t, d)[:, :, :tl_len]], dim=2).contiguous()
        b8, b16 = calibrate(x)
        force = torch.arange(B * H * nb) % 4 == 3 - kind  # plus forced raw entries
        p = pack_paged_kv(x, [nb * t + tl_len] * B, b8, b16, geom, force_raw=force)
        assert (p.tensor.table < 0).any() and (p.tensor.table >= 0).any()
        table = torch.cat([p.tensor.table, torch.full((B, H, 2), 10**6, dtype=torch.int32)], dim=2).contiguous()
        kv.append(x)
        pools.append(dataclasses.replace(p.tensor, table=table))
        tails.append(p.tensor.tail[:, :, :tl_len])  # a strided view of the [B, H, T, D] tail buffer
    out = torch.full((2, B, H, nb * t + tl_len, d), float("nan"), dtype=torch.bfloat16)  # poison
    decode_tables_triton(pools, geom, nb, out, tails)
    assert torch.equal(_bits(out), _bits(torch.stack(kv)))
    one = torch.full((1, B, H, nb * t, d), float("nan"), dtype=torch.bfloat16)  # one pool, no tail
    decode_tables_triton(pools[1:], geom, nb, one)
    assert torch.equal(_bits(one[0]), _bits(kv[1][:, :, : nb * t]))
    only_tail = torch.full((2, B, H, tl_len, d), float("nan"), dtype=torch.bfloat16)  # no block yet
    decode_tables_triton(pools, geom, 0, only_tail, tails)
    assert torch.equal(_bits(only_tail), _bits(torch.stack(kv)[:, :, :, nb * t:]))
    # a long "tail" (a prefill chunk's new tokens, several programs' worth, not a multiple of T)
    long = [x.transpose(2, 1).contiguous().transpose(2, 1)[:, :, 1: 2 * t + 6] for x in kv]  # strided rows
    out2 = torch.full((2, B, H, 2 * t + 2 * t + 5, d), float("nan"), dtype=torch.bfloat16)
    decode_tables_triton(pools, geom, 2, out2, long)
    want = torch.stack([torch.cat([x[:, :, : 2 * t], y], dim=2) for x, y in zip(kv, long)])
    assert torch.equal(_bits(out2), _bits(want))
    with pytest.raises(ValueError, match="num_blocks"):
        decode_tables_triton(pools, geom, nb + 3, out, tails)
    with pytest.raises(ValueError, match="no tails"):
        decode_tables_triton(pools, geom, nb, out)
    with pytest.raises(ValueError, match="out must be"):
        decode_tables_triton(pools, geom, nb, out[:1], tails)


@pytest.mark.slow
def test_triton_codec_on_real_smollm2_kv_through_a_heap(smollm2, wikitext_test):
    """Real post-RoPE K/V of SmolLM2-135M (shipped table) through the cache's GPU path: Triton encoder
    (both variants) with rows at the escape limit, streams packed by append_escapes_triton into a heap
    that already holds bytes, both Triton decoders and the block-table decoder -> the exact bits; slots
    and heap byte-identical to the reference.

    One pass per layer and kind: the even blocks of each tensor are the real blocks as they are, the odd
    ones get sparse special values (NaN payloads, +-Inf, +-0, subnormals, max finite), whose groups go
    raw while the blocks still fit, so the fast decoder (which only sees fitting blocks) and both encoders
    meet every special bit pattern and plain real blocks in the same launch (the Triton interpreter's
    cost is per block, so each block goes through each kernel once)."""
    from transformers import DynamicCache

    from gaac_hf.calibration import CalibrationTable

    model, tok = smollm2
    from pathlib import Path

    table = CalibrationTable.load(Path(__file__).resolve().parents[1] / "calibration_data" / "smollm2-135m.safetensors")
    geom = table.geometry
    # 128 tokens: two blocks per head (one real, one with specials) in each of 3 layers x K and V. The
    # interpreter's cost is per block; the same kernels meet specials, random bits and 4-bit groups
    # in the synthetic tests above, and the reference they must equal meets every pattern (test_codec)
    ids = tok(wikitext_test[30000:45000], return_tensors="pt").input_ids[:, :128]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache))
    pats = torch.tensor(SPECIALS, dtype=torch.int32).to(torch.int16)
    for layer in (0, 14, 29):  # first, middle, last
        for kind, x in ((0, cache.layers[layer].keys[0]), (1, cache.layers[layer].values[0])):  # [H, S, D]
            h, s, d = x.shape
            nb = s // geom.block_size
            clean = x[:, : nb * geom.block_size].reshape(h * nb, geom.block_size, d).contiguous()
            b8, b16 = (b.repeat_interleave(nb, 0) for b in table.bases(layer, kind))
            ref_clean = encode_blocks(clean, b8, b16, geom)
            assert ref_clean.fits.all() and (ref_clean.escape_len > 0).any()  # real blocks have escapes
            blocks = clean.clone()
            gen = torch.Generator().manual_seed(layer * 2 + kind)
            flat, per = _bits(blocks).view(h * nb, -1), geom.block_size * d  # the specials land in odd blocks only
            pos = torch.randperm((h * nb // 2) * per, generator=gen)[: (h * nb // 2) * per // 200]
            flat[1 + 2 * (pos // per), pos % per] = pats[torch.arange(pos.numel()) % len(pats)]
            assert not torch.equal(_bits(blocks[1::2]), _bits(clean[1::2]))
            ref = encode_blocks(blocks, b8, b16, geom)
            assert ref.fits.all()
            assert (ref.tags[1::2] == 2).flatten(1).any(1).all()  # every odd block has raw groups
            assert torch.equal(ref.slots[0::2], ref_clean.slots[0::2])  # the even ones are the real blocks
            for enc_fast in (False, True):
                got = encode_blocks_triton(blocks, b8, b16, geom, escape_width=geom.escape_limit, fast=enc_fast)
                assert torch.equal(got.slots, ref.slots) and torch.equal(got.escape_len, ref.escape_len), enc_fast
            heap = torch.full((1000 + int(ref.escape_len.sum()) + 16,), 0xA5, dtype=torch.uint8)
            used = torch.tensor([1000], dtype=torch.int64)
            start = append_escapes_triton(got, heap, used)
            want_heap, want_start = pack_escapes(ref.escapes, ref.escape_len, start=1000)
            assert torch.equal(heap[1000: int(used)], want_heap) and torch.equal(start, want_start)
            for fast in (False, True):
                dec = decode_blocks_triton(got.slots, (heap, start), b8, b16, geom, fast=fast)
                assert torch.equal(_bits(dec), _bits(blocks)), (layer, kind, fast)
            # the same layer as a paged cache, decoded through its block table (the cache's
            # decompress-then-SDPA path on CUDA)
            hb8, hb16 = table.bases(layer, kind)
            full = blocks.reshape(h, nb * geom.block_size, d)
            pk = pack_paged_kv(full[None].contiguous(), [s], hb8, hb16, geom)
            out = torch.full((1, 1, h, nb * geom.block_size, d), float("nan"), dtype=torch.bfloat16)
            decode_tables_triton([pk.tensor], geom, nb, out)
            assert torch.equal(_bits(out[0, 0]), _bits(full)), (layer, kind, "table")
