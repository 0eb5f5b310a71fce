"""FP8 GAACCache (kv_dtype="fp8_e4m3" | "fp8_e5m2") against the FP8 cache without GAAC.

The contract: the BF16 -> FP8 conversion is the only approximation, and it is the baseline's
(FP8DynamicCache); after it every stored code comes back bit for bit, so what attention reads, and
therefore generation (tokens and logits), is bit-identical to the baseline. Checked on synthetic codes
(all 256 codes in every channel position, inside compressed tiles) and on real SmolLM2-135M (CPU).
"""
from __future__ import annotations

import inspect

import pytest
import torch
from transformers import LlamaConfig

from gaac_hf import GAACCache
from gaac_hf.cache import FP8DynamicCache, GAACFP8Layer
from gaac_hf.cache.fp8_baseline import FP8DynamicLayer
from gaac_hf.calibration import FP8Table, calibrate_fp8, model_kv_shape
from gaac_hf.format.fp8 import GeometryFP8

DTYPES = ("fp8_e4m3", "fp8_e5m2")
B, L, H, D, T = 2, 2, 2, 64, 16


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])


def tiny_config():
    return LlamaConfig(num_hidden_layers=L, num_attention_heads=2 * H, num_key_value_heads=H, head_dim=D,
                       hidden_size=2 * H * D, intermediate_size=64, vocab_size=32)


def narrow_base(g: GeometryFP8, head: int) -> int:
    return g.max_base_narrow // 2 + head  # per kv-head windows: a block coded with another head's is wider


def synthetic_table(dtype: str) -> FP8Table:
    """Windows where typical codes (exponent around the middle of the field) are narrow, per head."""
    g = GeometryFP8(T, D, dtype)
    shape = (L, 2, H, D)
    base_n = torch.tensor([narrow_base(g, h) for h in range(H)], dtype=torch.uint8).view(1, 1, H, 1).expand(shape).contiguous()
    base_w = torch.full(shape, g.max_base_wide // 2, dtype=torch.uint8)
    scales = torch.tensor([[0.02, 0.005], [0.04, 0.01]], dtype=torch.float32)
    return FP8Table(scales, base_n, base_w, g, {"kv_shape": model_kv_shape(tiny_config())})


def typical_codes(g: GeometryFP8, shape, gen) -> torch.Tensor:
    """uint8 codes ``[B, H, S, D]`` whose exponents lie in their head's narrow window (random sign/mantissa)."""
    base = torch.tensor([narrow_base(g, h) for h in range(shape[1])]).view(1, -1, 1, 1)
    e = torch.randint(0, 8, shape, generator=gen) + base
    sm = torch.randint(0, 1 << (1 + g.man_bits), shape, generator=gen)
    m = g.man_bits
    return (((sm >> m) << 7) | (e << m) | (sm & ((1 << m) - 1))).to(torch.uint8)


def fed_layer(dtype: str, table: FP8Table | None = None, layer_idx: int = 1) -> GAACFP8Layer:
    table = table or synthetic_table(dtype)
    layer = GAACFP8Layer(layer_idx, table, table.geometry)
    layer.lazy_initialization(torch.zeros(B, H, 0, D, dtype=torch.bfloat16), torch.zeros(B, H, 0, D, dtype=torch.bfloat16))
    return layer


# ---------------------------------------------------------------------------------------------
# stored codes: every uint8 pattern round-trips through the cache
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_code_in_every_channel_round_trips_inside_compressed_tiles(dtype):
    """Block j of each (row, head) holds typical codes plus one token row where every channel has code
    c(j): all 256 codes (NaNs, E5M2's +-Inf, +-0, subnormals, the largest exponents) in every channel
    position, inside tiles that stay compressed (wide / raw groups), fed in uneven chunks."""
    gen = torch.Generator().manual_seed(0)
    layer = fed_layer(dtype)
    g = layer.geometry
    per_row = 256 // (B * H)  # blocks per (row, head): together every code once
    s = per_row * T + 5  # + an incomplete tail
    seq = [typical_codes(g, (B, H, s, D), gen) for _ in range(2)]
    code = torch.arange(256, dtype=torch.uint8).view(B, H, per_row)
    for kind in (0, 1):
        for j in range(per_row):
            row = (j * 5 + kind) % T  # a different token row per block
            seq[kind][:, :, j * T + row, :] = code[:, :, j, None]
    # uneven chunks: a prefill, single tokens (decode steps), a chunk spanning several blocks
    cuts = [0, 37, 38, 39, 40, 57, 140, s]
    for a, b in zip(cuts[:-1], cuts[1:]):
        layer.append_codes(seq[0][:, :, a:b], seq[1][:, :, a:b])
    for kind in (0, 1):
        assert torch.equal(layer.codes(kind), seq[kind])
        pool = layer.pools[kind]
        assert pool.blocks == B * H * per_row and pool.raw_blocks == 0  # every special code went through the codec
        assert int(pool.modes[1:].sum()) > 0  # the special rows widened their groups
    if dtype == "fp8_e5m2":
        assert int(layer.pools[0].modes[2]) > 0  # and E5M2 has raw groups (exponents outside the 16-window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_codes_round_trip_through_raw_and_compressed_blocks(dtype):
    gen = torch.Generator().manual_seed(1)
    layer = fed_layer(dtype)
    g = layer.geometry
    k = typical_codes(g, (B, H, 4 * T, D), gen)
    v = torch.randint(0, 256, (B, H, 4 * T, D), generator=gen, dtype=torch.uint8)  # incompressible: stored raw
    layer.append_codes(k, v)
    assert torch.equal(layer.codes(0), k) and torch.equal(layer.codes(1), v)
    assert layer.pools[1].raw_blocks == B * H * 4 and layer.pools[0].raw_blocks == 0
    assert int(layer.pools[0].modes[1:].sum()) == 0  # each block coded with its own head's windows: all narrow
    assert layer.stats()["resident"] < 2 * k.numel() + 8 * 2 * B * H * 4 + 16 * B * H * 4


# ---------------------------------------------------------------------------------------------
# the conversion is the baseline's, step by step, including crop / beam reorder / batch selection
# ---------------------------------------------------------------------------------------------
def hard_kv(gen, q: int, scale: float) -> torch.Tensor:
    """BF16 [B, H, q, D]: typical values, beyond the scale's range (saturates), +-Inf, NaN, +-0, subnormals."""
    x = torch.randn(B, H, q, D, generator=gen) * (100 * scale)
    x[..., 0] *= 1e4  # far past max_finite * scale
    flat = x.view(-1)
    idx = torch.randint(0, flat.numel(), (6,), generator=gen)
    flat[idx] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-40])
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_update_returns_exactly_what_the_baseline_returns(dtype):
    gen = torch.Generator().manual_seed(2)
    table = synthetic_table(dtype)
    ours = GAACFP8Layer(1, table, table.geometry)
    base = FP8DynamicLayer(table.scale(1, 0), table.scale(1, 1), dtype)
    steps = [23, 1, 1, 9, 40, 1]
    for q in steps:
        k, v = hard_kv(gen, q, 0.04), hard_kv(gen, q, 0.01)
        got, want = ours.update(k, v), base.update(k, v)
        for a, b in zip(got, want):
            assert a.dtype == torch.bfloat16 and torch.equal(bits(a), bits(b))
    assert torch.equal(ours.codes(0), base.keys) and torch.equal(ours.codes(1), base.values)
    assert ours.get_seq_length() == base.get_seq_length() == sum(steps)
    # row and length operations follow the baseline's
    for op in (lambda c: c.reorder_cache(torch.tensor([1, 0])), lambda c: c.crop(-3), lambda c: c.crop(-20),
               lambda c: c.batch_repeat_interleave(2), lambda c: c.batch_select_indices(torch.tensor([0, 3]))):
        op(ours)
        op(base)
        assert torch.equal(ours.codes(0), base.keys) and torch.equal(ours.codes(1), base.values)
    k, v = hard_kv(gen, 30, 0.04), hard_kv(gen, 30, 0.01)
    for a, b in zip(ours.update(k, v), base.update(k, v)):
        assert torch.equal(bits(a), bits(b))


def test_e4m3_conversion_and_dequantization_are_transformers_fp8_layer():
    """transformers' own FP8 cache layer (5.23+: E4M3, per-tensor scale) gives the same codes and the same
    dequantized values for the same scale: ours is that arithmetic, not an imitation of it."""
    cu = pytest.importorskip("transformers.cache_utils")
    if not hasattr(cu, "Fp8QuantizedLayer"):
        pytest.skip("transformers < 5.23 has no Fp8QuantizedLayer")
    gen = torch.Generator().manual_seed(3)
    scale = torch.tensor(0.04)
    x = hard_kv(gen, 50, float(scale))
    ref = cu.Fp8QuantizedLayer()
    ref.keys = torch.empty(0, dtype=torch.bfloat16)
    q, _ = ref._quantize(x, scale=scale)
    ours = FP8DynamicLayer(scale, scale, "fp8_e4m3")
    k, _ = ours.update(x, x)
    assert torch.equal(ours.keys, q.view(torch.uint8))
    assert torch.equal(bits(k), bits(ref._dequantize((q, scale))))


def test_the_conversion_saturates_instead_of_making_inf():
    """E5M2's plain cast turns values past 57344 into Inf, which a live cache would spread as NaN
    through attention; the caches clamp first (as vLLM converts), NaN stays NaN."""
    layer = FP8DynamicLayer(torch.tensor(1.0), torch.tensor(1.0), "fp8_e5m2")
    x = torch.tensor([1e5, -1e6, float("inf"), float("nan"), 3.0]).to(torch.bfloat16).view(1, 1, 5, 1).expand(1, 1, 5, D)
    k, _ = layer.update(x.contiguous(), x.contiguous())
    assert k[0, 0, :, 0].float().tolist()[:3] == [57344.0, -57344.0, 57344.0]
    assert torch.isnan(k[0, 0, 3, 0]) and float(k[0, 0, 4, 0]) == 3.0


# ---------------------------------------------------------------------------------------------
# real SmolLM2-135M: generation is bit-identical to the FP8 baseline
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_tables(model_tok, wikitext_valid):
    model, tok = model_tok
    return {dt: calibrate_fp8(model, tok, wikitext_valid, dtype=dt, context=256, block_size=T, max_tokens=512,
                              model_name="smollm2-test", progress=False) for dt in DTYPES}


def generate(model, tok, cache, prompts, **kw):
    enc = tok(prompts, return_tensors="pt", padding=True)
    # the newer cache= spelling where this transformers takes it (>= 5.18), else past_key_values= (5.17)
    key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    out = model.generate(**enc, **{key: cache}, cache_implementation=None, max_new_tokens=kw.pop("max_new_tokens", 10),
                         do_sample=False, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=tok.pad_token_id, **kw)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_generation_is_bit_identical_to_the_fp8_baseline(model_tok, fp8_tables, wikitext_test, dtype):
    model, tok = model_tok
    table = fp8_tables[dtype]
    tok.padding_side = "left"
    prompts = [" ".join(wikitext_test.split()[:60]), "The capital of France is"]  # left-padded batch, many blocks
    want = generate(model, tok, FP8DynamicCache(model.config, table), prompts)
    for attn in ("sdpa", "gaac") if dtype == "fp8_e4m3" else ("sdpa",):
        model.set_attn_implementation(attn)
        try:
            cache = GAACCache(model.config, calibration=table, kv_dtype=dtype)
            got = generate(model, tok, cache, prompts)
        finally:
            model.set_attn_implementation("sdpa")
        assert torch.equal(got[0], want[0]), attn
        assert torch.equal(bits(got[1]), bits(want[1])), attn
        st = cache.stats()
        assert st["encoded_blocks"] >= 30 * 2 * 2 * 3 * 4 and st["ratio_vs_fp8"] > 1.0  # layers x K/V x rows x heads x blocks
    bf16 = generate(model, tok, None, prompts)
    assert not torch.equal(bits(bf16[1]), bits(want[1]))  # FP8 does change the logits: the comparison can fail


@pytest.mark.slow
def test_beam_search_is_bit_identical_to_the_fp8_baseline(model_tok, fp8_tables):
    model, tok = model_tok
    table = fp8_tables["fp8_e4m3"]
    prompts = ["Once upon a time, in a small village by the sea, there lived an old fisherman who"]
    want = generate(model, tok, FP8DynamicCache(model.config, table), prompts, num_beams=3, max_new_tokens=8)
    got = generate(model, tok, GAACCache(model.config, calibration=table, kv_dtype="fp8_e4m3"), prompts,
                   num_beams=3, max_new_tokens=8)
    assert torch.equal(got[0], want[0]) and torch.equal(bits(got[1]), bits(want[1]))


def _count_passes(monkeypatch) -> list:
    """The ``desc`` of every model pass calibrate_fp8 starts (it imports run_chunks when called)."""
    import gaac_hf.calibration.collect as collect

    passes, orig = [], collect.run_chunks

    def counted(*a, **kw):
        passes.append(kw.get("desc"))
        return orig(*a, **kw)

    monkeypatch.setattr(collect, "run_chunks", counted)
    return passes


def test_a_short_calibration_text_runs_the_model_once(model_tok, wikitext_valid, monkeypatch):
    from gaac_hf.calibration import fp8 as fp8_calibration

    model, tok = model_tok
    passes = _count_passes(monkeypatch)
    one = calibrate_fp8(model, tok, wikitext_valid, dtype="fp8_e4m3", context=64, block_size=T, max_tokens=128,
                        model_name="t", progress=False)
    assert passes == ["fp8 scales"]
    monkeypatch.setattr(fp8_calibration, "KEEP_KV_BYTES", 2 << 20)  # 1.5 MB a chunk: the first of the two fits, not both
    two = calibrate_fp8(model, tok, wikitext_valid, dtype="fp8_e4m3", context=64, block_size=T, max_tokens=128,
                        model_name="t", progress=False)
    assert passes == ["fp8 scales", "fp8 scales", "fp8 windows"]
    assert torch.equal(bits(one.scales), bits(two.scales))
    assert torch.equal(one.base_n, two.base_n) and torch.equal(one.base_w, two.base_w)


@pytest.mark.slow
def test_gaac_calibrate_writes_the_same_fp8_table(model_tok, fp8_tables, wikitext_valid, tmp_path, monkeypatch):
    """The CLI's table equals the API's, and the two-pass calibration (a long text: K/V not kept, the
    model runs again) equals the one-pass one the fixture ran (its 512 tokens' K/V were kept)."""
    from gaac_hf.calibration import fp8 as fp8_calibration
    from gaac_hf.calibration.cli import main

    passes = _count_passes(monkeypatch)
    monkeypatch.setattr(fp8_calibration, "KEEP_KV_BYTES", 0)
    text = tmp_path / "valid.txt"
    text.write_text(wikitext_valid)
    out = tmp_path / "e5m2.safetensors"
    assert main(["--model", "smollm2", "--kv-dtype", "fp8_e5m2", "--text", str(text), "--context", "256",
                 "--max-tokens", "512", "--block-size", str(T), "--out", str(out), "--quiet"]) == 0
    t, ref = FP8Table.load(out, kv_dtype="fp8_e5m2"), fp8_tables["fp8_e5m2"]
    assert torch.equal(bits(t.scales), bits(ref.scales))
    assert torch.equal(t.base_n, ref.base_n) and torch.equal(t.base_w, ref.base_w)
    assert t.meta["command"].startswith("gaac-calibrate --model smollm2 --kv-dtype fp8_e5m2")
    assert passes == ["fp8 scales", "fp8 windows"], passes


def test_verify_and_stats_of_an_fp8_cache():
    gen = torch.Generator().manual_seed(4)
    table = synthetic_table("fp8_e5m2")
    cache = GAACCache(tiny_config(), calibration=table, kv_dtype="fp8_e5m2")
    for li in range(L):
        cache.update(hard_kv(gen, 3 * T + 2, 0.04), hard_kv(gen, 3 * T + 2, 0.01), li)
    st = cache.stats()
    assert st["kv_dtype"] == "fp8_e5m2" and st["seq_length"] == 3 * T + 2 and st["tail_tokens"] == 2
    assert st["fp8_bytes"] == 2 * L * B * H * (3 * T + 2) * D and st["bf16_bytes"] == 2 * st["fp8_bytes"]
    assert st["encoded_blocks"] == 2 * L * B * H * 3
    got = cache.verify()
    assert got["slot_rows"] + got["raw_rows"] == 2 * L * B * H * 3
    cache.layers[1].tables[1][1, 0, 2] += 4  # an entry that is no 16-byte offset
    with pytest.raises(ValueError, match=r"layer 1 V: corrupt GAAC FP8 cache"):
        cache.verify()


def test_from_dynamic_cache_keeps_an_fp8_caches_codes_and_refuses_other_scales():
    gen = torch.Generator().manual_seed(5)
    table = synthetic_table("fp8_e4m3")
    base = FP8DynamicCache(tiny_config(), table)
    for li in range(L):
        base.update(hard_kv(gen, 2 * T + 7, 0.04), hard_kv(gen, 2 * T + 7, 0.01), li)
    cache = GAACCache.from_dynamic_cache(base, tiny_config(), table, kv_dtype="fp8_e4m3")
    for lg, lb in zip(cache.layers, base.layers):
        assert torch.equal(lg.codes(0), lb.keys) and torch.equal(lg.codes(1), lb.values)
    other = FP8Table(table.scales * 2, table.base_n, table.base_w, table.geometry, table.meta)
    with pytest.raises(ValueError, match=r"other scales than this cache's table"):
        GAACCache.from_dynamic_cache(base, tiny_config(), other, kv_dtype="fp8_e4m3")
