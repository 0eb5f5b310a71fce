"""The CPU library (kernels/cpu/gaac_cpu.cpp, built by g++ from the v3 core) against its references:
the encoder byte for byte and the decoder bit for bit against gaac_hf/codec/v3.py, the tiled attention
bit for bit against kernels/cpu/reference.py (its defined arithmetic) and within BF16 tolerance of the
fp64 attention. Mutation checks: a changed exp step, or FMA contraction allowed, must break bit identity.
"""
import ctypes
import shutil
import subprocess

import pytest
import torch

from gaac_hf.codec.v3 import encode_blocks_v3, pack_blocks
from gaac_hf.format.v3 import GeometryV3
from gaac_hf.kernels.cpu import native
from gaac_hf.kernels.cpu.reference import tiled_attention_reference, visibility
from gaac_hf.kernels.paged import PagedKV, PagedTensorV3
from gaac_hf.kernels.reference import attention_reference
from tests.v3_cases import adversarial_blocks, every_pattern_blocks, same_bits
from gaac_hf.models import cache_kwargs

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
GUARD = PagedTensorV3.GUARD_BYTES


def _consts(b8, b16):
    return PagedTensorV3.pair_constants(b8, b16)


# 16 x 80 and 16 x 48: a last segment shorter than SEG_CHUNKS lanes (40 and 24 chunks)
@pytest.mark.parametrize("head_dim,block_size", [(16, 64), (64, 64), (128, 64), (256, 64), (80, 64), (80, 16), (48, 16)])
def test_encode_decode_match_the_reference(head_dim, block_size):
    _encode_decode_check(head_dim, block_size)


def _encode_decode_check(head_dim, block_size=64):
    g = GeometryV3(block_size, head_dim)
    cases = [adversarial_blocks(g, seed=head_dim)]
    if head_dim in (64, 80):
        x, b8, b16 = next(iter(every_pattern_blocks(g)))
        cases.append((x, b8, b16))
    for x, b8, b16 in cases:
        n = x.shape[0]
        b8, b16 = ((b if b.dim() == 2 else b.expand(n, -1)).contiguous() for b in (b8, b16))
        rows, nbytes = native.encode_v3(x, b8, b16, g)
        enc = encode_blocks_v3(x, b8, b16, g)
        assert torch.equal(nbytes, enc.nbytes)
        assert torch.equal(rows, enc.data), f"encoder rows differ in {int((rows != enc.data).sum())} bytes"
        pool, entries = pack_blocks(enc, x)
        pool = torch.cat([pool, pool.new_zeros(GUARD)])
        # every block its own "head": pair constants per block
        b8p, dbp = _consts(b8, b16)
        got = native.decode_v3(pool, pool.numel() - GUARD, entries, torch.arange(n), b8p, dbp, g)
        same_bits(got, x)


def test_decode_rejects_corrupt_blocks_and_entries():
    g = GeometryV3(16, 64)
    x = torch.randn(4, 16, 64).bfloat16()
    b8, b16 = torch.full((4, 64), 120, dtype=torch.uint8), torch.full((4, 64), 116, dtype=torch.uint8)
    enc = encode_blocks_v3(x, b8, b16, g)
    pool, entries = pack_blocks(enc, x)
    used = pool.numel()
    pool = torch.cat([pool, pool.new_zeros(GUARD)])
    args = (torch.arange(4), *_consts(b8, b16), g)
    same_bits(native.decode_v3(pool, used, entries, *args), x)
    bad = pool.clone()
    bad[int(entries[2]) + g.segtab_offset + 4 * g.segments] = 0xFF  # the last segment boundary: too many entries
    with pytest.raises(ValueError, match="entry 2"):
        native.decode_v3(bad, used, entries, *args)
    with pytest.raises(ValueError, match="entry 1"):
        native.decode_v3(pool, used, entries + torch.tensor([0, 8, 0, 0]), *args)  # not a 16-byte offset
    with pytest.raises(ValueError, match="entry 3"):
        native.decode_v3(pool, int(entries[3]) + 8, entries, *args)  # runs past the bytes in use


def paged_case(b, h, t, d, nb, tl, seed=0, scale_k=2.0):
    """A v3 PagedKV of random K/V plus the K/V themselves (BF16 [B, H, S, D])."""
    gen = torch.Generator().manual_seed(seed)
    g = GeometryV3(t, d)
    s = nb * t + tl
    kv = [(torch.randn(b, h, s, d, generator=gen) * sc).bfloat16() for sc in (scale_k, 1.0)]
    b8, b16 = torch.full((h, d), 123, dtype=torch.uint8), torch.full((h, d), 119, dtype=torch.uint8)
    parts, used = [], []
    for x in kv:
        blocks = x[:, :, : nb * t].reshape(b * h * nb, t, d)
        heads = torch.arange(h).view(1, h, 1).expand(b, h, nb).reshape(-1)
        enc = encode_blocks_v3(blocks, b8[heads], b16[heads], g)
        pool, ent = pack_blocks(enc, blocks)
        used.append(pool.numel())
        tail = torch.zeros(b, h, t, d, dtype=torch.bfloat16)
        tail[:, :, :tl] = x[:, :, nb * t :]
        parts.append(PagedTensorV3.from_bases(torch.cat([pool, pool.new_zeros(GUARD)]), ent.view(b, h, nb).contiguous(), tail, b8, b16))
    full = lambda n: torch.full((b,), n, dtype=torch.int32)  # noqa: E731
    return PagedKV(parts[0], parts[1], full(nb), full(tl), g), tuple(used), kv


@pytest.mark.parametrize("sq,split,tl", [(1, 1, 5), (1, 2, 0), (1, 64, 9), (5, 3, 3), (16, 2, 15)])
def test_attention_is_the_reference_bit_for_bit(sq, split, tl):
    b, h, rep, t, d, nb = 2, 3, 3, 16, 64, 7
    kv, used, (k, v) = paged_case(b, h, t, d, nb, tl, seed=sq)
    q = torch.randn(b, h * rep, sq, d).bfloat16()
    out = native.attention_v3(q, kv, used, 0.125, split)
    same_bits(out, tiled_attention_reference(q, k, v, 0.125, t, split))
    f32 = native.attention_v3(q, kv, used, 0.125, split, float_out=True)  # before the final rounding too
    assert torch.equal(f32.view(torch.int32), tiled_attention_reference(q, k, v, 0.125, t, split, out_dtype=torch.float32).view(torch.int32))
    # within BF16 rounding of fp64 attention (decode rows)
    if sq == 1:
        s = nb * t + tl
        ref = attention_reference(q[:, :, 0], k, v, [s] * b, scale=0.125)
        assert (out[:, 0].double() - ref).abs().max() <= 2 ** -7 * ref.abs().max().clamp(min=1)


def test_attention_masks_left_padding_and_gqa_rows():
    b, h, rep, t, d, nb, tl, sq = 3, 2, 4, 16, 128, 5, 7, 3
    kv, used, (k, v) = paged_case(b, h, t, d, nb, tl, seed=7)
    s = nb * t + tl
    q = torch.randn(b, h * rep, sq, d).bfloat16()
    pad = torch.tensor([0, 20, 40])
    mask = visibility(b, sq, s, None, None) & (torch.arange(s) >= pad.view(b, 1, 1))
    out = native.attention_v3(q, kv, used, 0.09, 2, mask.to(torch.uint8).contiguous())
    same_bits(out, tiled_attention_reference(q, k, v, 0.09, t, 2, mask))
    kv2 = PagedKV(kv.k, kv.v, kv.num_blocks, kv.tail_len, kv.geometry, kv_start=pad.to(torch.int32))
    same_bits(native.attention_v3(q, kv2, used, 0.09, 2), out)  # kv_start is the same left padding
    ref = attention_reference(q[:, :, -1], k, v, [s] * b, scale=0.09, kv_start=pad.tolist())
    assert (out[:, -1].double() - ref).abs().max() <= 2 ** -7 * ref.abs().max().clamp(min=1)


# Full tiles of the default block size and larger: the register-blocked QK (blocks of 64 positions)
# and PV (blocks of 64 channels) and their remainders (a short tail tile, D = 80, D = 96), and the K
# transpose (16 x 16 blocks in AVX-512 registers, the scalar loop for rows past them or D % 16 != 0)
BLOCKED_CASES = [(64, 64, 37), (128, 64, 0), (64, 80, 50), (32, 128, 20), (64, 96, 63)]


def _blocked_check(t, d, tl, lib=None):
    """float32 outputs of the library (``lib``, else the loaded one) vs the reference, several splits."""
    b, h, rep, nb, sq = 1, 2, 3, 3, 2
    kv, used, (k, v) = paged_case(b, h, t, d, nb, tl, seed=t + d + tl)
    q = torch.randn(b, h * rep, sq, d, generator=torch.Generator().manual_seed(d)).bfloat16()
    for split in (1, 2):
        ref = tiled_attention_reference(q, k, v, 0.125, t, split, out_dtype=torch.float32)
        if lib is not None:
            prev, native._STATE["lib"] = native._STATE.get("lib"), lib
        try:
            out = native.attention_v3(q, kv, used, 0.125, split, float_out=True)
        finally:
            if lib is not None:
                native._STATE["lib"] = prev
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), (t, d, tl, split)


@pytest.mark.parametrize("t,d,tl", BLOCKED_CASES)
def test_attention_full_tiles_are_the_reference_bit_for_bit(t, d, tl):
    _blocked_check(t, d, tl)


def test_attention_portable_build_is_the_reference_bit_for_bit(tmp_path):
    """The library as it builds on a CPU without AVX-512 (the scalar transpose, 256-bit vectors):
    the same bits."""
    text = (native.HERE / "gaac_cpu.cpp").read_text()
    lib = _build_variant(tmp_path, text, (*native.FLAGS, "-mno-avx512f"))
    for case in BLOCKED_CASES[:3]:
        _blocked_check(*case, lib=lib)


# (text, replacement): each must make the full-tile check fail
BLOCKED_MUTATIONS = [
    ("x[4 * i + 2], 0x44);\n          r[4 * i + 1]", "x[4 * i + 2], 0xEE);\n          r[4 * i + 1]"),  # transpose
    ("for (int j = 0; j < 16; ++j) _mm512_storeu_ps(kT + (size_t)(d0 + j) * T + t0, r[j]);",
     "for (int j = 0; j < 16; ++j) _mm512_storeu_ps(kT + (size_t)(d0 + j) * T + t0, r[j ^ 1]);"),  # column order
    ("      for (int j = 0; j < RB; ++j) acc[j] = acc[j] + qd * kr[j];",
     "      for (int j = 0; j < RB; ++j) acc[j] = acc[j] + qd * kr[j ^ 1];"),  # QK block reads wrong positions
    ("    for (int d = 0; d < D; ++d) {\n      const float qd = q[d];\n      const float* kr = kT + (size_t)d * T + t0;",
     "    for (int d = D - 1; d >= 0; --d) {\n      const float qd = q[d];\n      const float* kr = kT + (size_t)d * T + t0;"),  # QK order
    ("    for (int t = 0; t < n; ++t) {\n      const float pt = p[t];\n      const float* vr = vf + (size_t)t * D + d0;",
     "    for (int t = n - 1; t >= 0; --t) {\n      const float pt = p[t];\n      const float* vr = vf + (size_t)t * D + d0;"),  # PV order
    ("  for (int d = d0; d < D; ++d) acc_out[d] = 0.0f;\n", "  for (int d = d0; d < D; ++d) acc_out[d] = 1.0f;\n"),  # PV remainder
]


# the mutations inside the `#if defined(__AVX512F__)` transpose (an AVX2-only CPU never builds them)
AVX512_ONLY = {old for old, _ in BLOCKED_MUTATIONS[:2]}


def test_avx512_only_mutations_are_inside_the_avx512_block():
    text = (native.HERE / "gaac_cpu.cpp").read_text()
    start = text.index("#if defined(__AVX512F__)\n  if (D % 16 == 0)")  # the transpose's block
    end = text.index("#endif", start)
    for old in AVX512_ONLY:
        assert start < text.index(old) < end, old
    for old, _ in BLOCKED_MUTATIONS[2:]:
        assert not start < text.index(old) < end, old


@pytest.mark.parametrize("old,new", BLOCKED_MUTATIONS)
def test_mutated_blocked_attention_is_caught(tmp_path, old, new):
    text = (native.HERE / "gaac_cpu.cpp").read_text()
    assert text.count(old) == 1
    if old in AVX512_ONLY and not _has_flag("avx512f"):
        pytest.skip("this CPU has no AVX-512: the library does not build that transpose")
    lib = _build_variant(tmp_path, text.replace(old, new))
    caught = 0
    for case in BLOCKED_CASES:
        try:
            _blocked_check(*case, lib=lib)
        except AssertionError:
            caught += 1
    assert caught, "a mutated tiled attention passed every full-tile check"


def _build_variant(tmp_path, text: str, flags=native.FLAGS):
    src = tmp_path / "gaac_cpu.cpp"
    src.write_text(text)
    so = tmp_path / "variant.so"
    subprocess.run(["g++", *flags, f"-I{native.CORE}", "-o", str(so), str(src)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    native._declare(lib)
    return lib


MUTATIONS = [
    ("  r = r - n * LN2_LO;\n", "\n", native.FLAGS),  # exp without the low part of ln 2 (a few ulp)
    ("", "", tuple(f if f != "-ffp-contract=off" else "-ffp-contract=fast" for f in native.FLAGS)),  # FMA allowed
]


@pytest.mark.parametrize("old,new,flags", MUTATIONS)
def test_mutated_kernel_breaks_bit_identity(tmp_path, monkeypatch, old, new, flags):
    text = (native.HERE / "gaac_cpu.cpp").read_text()
    assert not old or text.count(old) == 1
    lib = _build_variant(tmp_path, text.replace(old, new) if old else text, flags)
    kv, used, (k, v) = paged_case(1, 3, 16, 64, 9, 4, seed=3)
    q = torch.randn(1, 9, 4, 64, generator=torch.Generator().manual_seed(11)).bfloat16()
    ref = tiled_attention_reference(q, k, v, 0.125, 16, 2, out_dtype=torch.float32)
    monkeypatch.setitem(native._STATE, "lib", lib)
    out = native.attention_v3(q, kv, used, 0.125, 2, float_out=True)  # float32: an FMA shows in the low bits
    if "-march=native" in flags and not _has_fma():
        pytest.skip("this CPU has no FMA: contraction changes nothing")
    assert not torch.equal(out.view(torch.int32), ref.view(torch.int32))


def _has_flag(flag: str) -> bool:
    try:
        return f" {flag} " in open("/proc/cpuinfo").read().replace("\n", " ")
    except OSError:
        return False


def _has_fma() -> bool:
    return _has_flag("fma")


def test_no_compiler_warns_once_and_returns_none(monkeypatch):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("GAAC_HF_CPU_KERNELS", "0")
    with pytest.warns(RuntimeWarning, match="same bits") as rec:
        assert native.library() is None
        assert native.library() is None
    assert len(rec) == 1


def test_pack_and_decode_keep_their_contiguous_copies_alive():
    """BF16 blocks packed from a non-contiguous view (a multi-token append completing one block with
    positions left over: ``seq[:, :, :T].reshape(...)`` is a strided view) keep every byte; so do
    decodes through non-contiguous entries. The copies .contiguous() makes used to be freed before
    the library read them."""
    g = GeometryV3(16, 64)
    seq = (torch.randn(3, 2, 24, 64, generator=torch.Generator().manual_seed(1)) * 300).bfloat16()
    x = seq[:, :, :16].reshape(6, 16, 64)
    assert not x.is_contiguous()
    b8, b16 = torch.full((6, 64), 123, dtype=torch.uint8), torch.full((6, 64), 119, dtype=torch.uint8)
    rows, nbytes = native.encode_v3(x.contiguous(), b8, b16, g)
    assert bool((nbytes > g.raw_bytes).all())  # every block stored as BF16
    pool = torch.zeros(6 * g.raw_bytes + GUARD, dtype=torch.uint8)
    offs = torch.arange(6) * g.raw_bytes
    for _ in range(3):  # the freed copy is reused by the allocator at once: one round shows it
        native.pack_v3(rows, nbytes, x, offs, pool, g)
        assert torch.equal(pool[: 6 * g.raw_bytes], x.contiguous().view(torch.uint8).reshape(-1))
    entries = torch.stack([offs + 1, offs + 1], 1)[:, 0]  # a strided view
    assert not entries.is_contiguous()
    got = native.decode_v3(pool, 6 * g.raw_bytes, entries, torch.zeros(12, dtype=torch.int64)[::2], *_consts(b8[:1], b16[:1]), g)
    same_bits(got, x.contiguous())


@pytest.mark.parametrize("head_dim,strided", [(64, True), (128, False), (80, True)])
def test_encode_kv_and_pack_kv_are_encode_and_store(head_dim, strided):
    """The append path (gaac_v3_encode_kv + gaac_v3_pack_kv): K and V [B, H, S, D] read in place
    (V strided like a model's transposed projection), per-head bases, blocks that fall back to BF16,
    a pool that already holds bytes and a table column offset: pool bytes, entries and counters are
    the reference encoder's and pack_blocks'."""
    g = GeometryV3(16, head_dim)
    b, h, nfull, extra, nb0, used0 = 2, 3, 4, 5, 2, 48
    x, b8a, b16a = adversarial_blocks(g, seed=head_dim)
    n = b * h * nfull
    x = x[torch.arange(2 * n) % x.shape[0]]
    kv = [x[kind * n : (kind + 1) * n].reshape(b, h, nfull * g.block_size, head_dim) for kind in (0, 1)]
    kv = [torch.cat([t, t[:, :, :extra]], dim=2) for t in kv]  # positions past the blocks: not read
    if strided:
        kv[1] = kv[1].transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] storage
        assert not kv[1].is_contiguous()
    gen = torch.Generator().manual_seed(head_dim)
    bases = torch.stack([torch.stack([torch.randint(100, 130, (h, head_dim), generator=gen),
                                      torch.randint(95, 125, (h, head_dim), generator=gen)]) for _ in (0, 1)]).to(torch.uint8)
    bases[1, :, 0] = torch.stack([b8a[0], b16a[0]])  # one head of V with the adversarial bases: some BF16 blocks
    rows, nbytes, stats = native.encode_kv(kv[0], kv[1], nfull, bases.contiguous(), g)
    pools = [torch.full((used0 + int(stats[k, 0]) + GUARD,), 7, dtype=torch.uint8) for k in (0, 1)]
    tables = [torch.full((b, h, nb0 + nfull + 1), -5, dtype=torch.int64) for _ in (0, 1)]
    native.pack_kv(rows, nbytes, stats, pools, (used0, used0), tables, nb0, nfull, g)
    heads = torch.arange(h).view(1, h, 1).expand(b, h, nfull).reshape(-1)
    raw_blocks = 0
    for kind in (0, 1):
        blocks = kv[kind][:, :, : nfull * g.block_size].reshape(n, g.block_size, head_dim)
        enc = encode_blocks_v3(blocks, bases[kind, 0][heads], bases[kind, 1][heads], g)
        pool, ent = pack_blocks(enc, blocks, start=used0)
        assert torch.equal(nbytes[kind], enc.nbytes)
        assert torch.equal(pools[kind][used0 : used0 + pool.numel()], pool)
        assert int(stats[kind, 0]) == pool.numel()
        assert bool((pools[kind][:used0] == 7).all()) and bool((pools[kind][used0 + pool.numel() :] == 7).all())
        assert torch.equal(tables[kind][:, :, nb0 : nb0 + nfull], ent.view(b, h, nfull))
        assert bool((tables[kind][:, :, :nb0] == -5).all()) and bool((tables[kind][:, :, nb0 + nfull :] == -5).all())
        m = enc.modes
        assert stats[kind, 1:].tolist() == [int((m != 0).sum()), int((m == 2).sum()), int((~enc.fits).sum())]
        raw_blocks += int((~enc.fits).sum())
    assert raw_blocks > 0


# (file, text, replacement): each must make test_encode_kv_and_pack_kv_are_encode_and_store fail
KV_MUTATIONS = [
    ("gaac_cpu.cpp", "off | (nbytes[it] > cap ? ENTRY_RAW_BIT : 0)", "off"),  # BF16 blocks lose their entry flag
    ("gaac_cpu.cpp", "x0 + r * sr, 2 * (size_t)D)", "x0 + r * D, 2 * (size_t)D)"),  # BF16 fallback ignores strides
    ("host_block.h", "  std::memset(&buf[ro + g.raw_word * n_raw], 0, len - (ro + g.raw_word * n_raw));\n", ""),  # stale padding
    ("host_block.h", "st32(&buf[g.segtab_off + 4 * s], (uint32_t)n_ent", "st32(&buf[g.segtab_off + 4 * s], 0u * n_ent"),
    # the segment walk of encode_segment (lanes encoded together): a run of lanes that ignores where in
    # its row group a segment starts (head_dim 80: 10 columns, segments start mid row group), swapped
    # pairs in the gather, chunks whose wide groups are only 4-bit losing their entries, code words
    # written past a short segment's lanes
    ("host_block.h", "const int run = g.cols - col0 < m - lane ? g.cols - col0 : m - lane;",
     "const int run = g.cols < m - lane ? g.cols : m - lane;"),
    ("host_block.h", "xv[4 * r + p][lane + i] = xr[4 * i + p];", "xv[4 * r + p][lane + i] = xr[4 * i + (p ^ 1)];"),
    ("host_block.h", "if (!cc.wide[lane]) continue;", "if (!cc.raw[lane]) continue;"),
    ("host_block.h", "cc.w[k], 4 * m);", "cc.w[k], 4 * SEG_CHUNKS);"),
]


@pytest.mark.parametrize("name,old,new", KV_MUTATIONS)
def test_mutated_append_path_is_caught(tmp_path, monkeypatch, name, old, new):
    files = {"gaac_cpu.cpp": native.HERE / "gaac_cpu.cpp", "host_block.h": native.CORE / "host_block.h"}
    text = files[name].read_text()
    assert text.count(old) == 1
    (tmp_path / name).write_text(text.replace(old, new))
    src = tmp_path / "gaac_cpu.cpp" if name == "gaac_cpu.cpp" else files["gaac_cpu.cpp"]
    so = tmp_path / "variant.so"
    subprocess.run(["g++", *native.FLAGS, f"-I{tmp_path}", f"-I{native.CORE}", "-o", str(so), str(src)], check=True,
                   capture_output=True)
    lib = ctypes.CDLL(str(so))
    native._declare(lib)
    monkeypatch.setitem(native._STATE, "lib", lib)
    monkeypatch.setattr(native, "threads", lambda: 1)  # one scratch buffer, blocks in order: stale bytes show
    caught = 0
    for check in (lambda: test_encode_kv_and_pack_kv_are_encode_and_store(64, True),
                  lambda: test_encode_kv_and_pack_kv_are_encode_and_store(80, True),
                  lambda: _encode_decode_check(64),  # the encoder's bytes (same core)
                  lambda: _encode_decode_check(80),  # 64 x 80: segments start mid row group
                  lambda: _encode_decode_check(80, 16)):  # a short last segment
        try:
            check()
        except AssertionError:
            caught += 1
    assert caught, "a mutated append path passed both byte-for-byte checks"


# ------------------------------------------------------------------------------------------------
# the encoder on real K/V (SmolLM2, the shipped table), as a prefill hands it to the cache
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prefill_kv(smollm2, wikitext_test):
    """Every SmolLM2 layer's post-RoPE (K, V) after a 533-token prefill of held-out WikiText (BF16
    ``[1, 3, 533, 64]``, the tensors a cache's update() receives) and the shipped table."""
    from transformers import DynamicCache

    from gaac_hf.calibration.shipped import find_table
    from gaac_hf.calibration.table import CalibrationTable

    model, tok = smollm2
    ids = tok(wikitext_test[:20000], return_tensors="pt").input_ids[:, : 8 * 64 + 21]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers], CalibrationTable.load(find_table("smollm2-135m"))


def _real_kv_check(prefill_kv, shift: int) -> list[int]:
    """encode_kv (the append path) and encode_v3 on every layer's real K/V against encode_blocks_v3 +
    pack_blocks, byte for byte. ``shift``: take the bases of layer ``l + shift`` with K and V swapped
    when odd (windows that do not fit: wide and raw groups, BF16 blocks). Returns [wide, raw, BF16] totals."""
    from gaac_hf.cache.pool_v3 import geometry_v3

    layers, table = prefill_kv
    g = geometry_v3(table.geometry)
    t, d, cap = g.block_size, g.head_dim, g.raw_bytes
    totals = [0, 0, 0]
    for li, (k, v) in enumerate(layers):
        src, swap = (li + shift) % len(layers), shift % 2
        bases = torch.stack([torch.stack(table.bases(src, kind ^ swap)) for kind in (0, 1)]).contiguous()
        b, h, s, _ = k.shape
        nfull = s // t
        rows, nbytes, stats = native.encode_kv(k, v, nfull, bases, g)
        heads = torch.arange(h).view(1, h, 1).expand(b, h, nfull).reshape(-1)
        for kind, x in enumerate((k, v)):
            blocks = x[:, :, : nfull * t].reshape(-1, t, d)
            b8, b16 = bases[kind, 0][heads].contiguous(), bases[kind, 1][heads].contiguous()
            enc = encode_blocks_v3(blocks, b8, b16, g)
            assert torch.equal(nbytes[kind], enc.nbytes), f"layer {li} kind {kind}: block lengths differ"
            fits = enc.nbytes <= cap
            stored = torch.arange(cap) < enc.nbytes[fits].unsqueeze(1)  # encode_kv leaves bytes past a block as they were
            assert torch.equal(rows[kind][fits][stored], enc.data[fits][stored]), f"layer {li} kind {kind}: encoded bytes differ"
            assert torch.equal(rows[kind][~fits], blocks[~fits].reshape(-1, t * d).view(torch.uint8))
            one_rows, one_nbytes = native.encode_v3(blocks, b8, b16, g)  # the other entry point, same walk
            assert torch.equal(one_nbytes, enc.nbytes) and torch.equal(one_rows, enc.data)
            pool, _ = pack_blocks(enc, blocks)
            assert int(stats[kind, 0]) == pool.numel()
            totals = [a + int(c) for a, c in zip(totals, stats[kind, 1:])]
    return totals


@pytest.mark.parametrize("shift", [0, 7])
def test_encoder_on_real_prefill_kv_is_the_reference(prefill_kv, shift):
    """The vectorized segment walk of host_block.h (encode_segment) on every layer of a real prefill,
    with the shipped table's windows and with windows of another layer and kind."""
    wide, raw, bf16 = _real_kv_check(prefill_kv, shift)
    assert wide > 0
    if shift:
        assert raw > 0 and bf16 > 0, (wide, raw, bf16)


def test_mutated_encoder_fails_on_real_prefill_kv(tmp_path, monkeypatch, prefill_kv):
    """One bit of one lane's sign/mantissa word flipped in the segment walk (lane 17, the second vector
    of 16 lanes): the real-K/V check must fail."""
    text = (native.CORE / "host_block.h").read_text()
    old = "st32(&buf[32 * (SEG_CHUNKS * s + lane) + 4 * i], cc.sm[i][lane]);"
    assert text.count(old) == 1
    (tmp_path / "host_block.h").write_text(text.replace(old, old.replace("cc.sm[i][lane]", "cc.sm[i][lane] ^ (lane == 17 && i == 3)")))
    so = tmp_path / "variant.so"
    subprocess.run(["g++", *native.FLAGS, f"-I{tmp_path}", f"-I{native.CORE}", "-o", str(so), str(native.HERE / "gaac_cpu.cpp")],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    native._declare(lib)
    monkeypatch.setitem(native._STATE, "lib", lib)
    with pytest.raises(AssertionError, match="encoded bytes differ"):
        _real_kv_check(prefill_kv, 0)
